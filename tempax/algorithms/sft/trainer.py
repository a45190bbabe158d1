"""Supervised fine-tuning and continued pre-training: `causal_lm_loss` + the data layer's batches on the shared
training core.

    cfg = load_config(SFTConfig, "recipes/sft_lora_smollm2.yaml", ["train.steps=20"])
    result = main(cfg)

The algorithm is two pieces, everything else is `tempax.train`:
  * `make_sft_loss(normalize)` -> `loss_fn(model, batch) -> (loss, metrics)`: next-token cross-entropy on the
    batch's `targets` where `loss_mask` is 1, attention restricted to each packed example by `segment_ids`.
    It reports `loss_weight` = supervised tokens (or sequences), so gradient accumulation reproduces the
    full-batch token mean exactly.
  * `build_data(cfg, tokenizer)`: rows -> tokenised examples (chat template, assistant-only loss mask, bad rows
    skipped and reported) -> a resumable loader of packed [batch_size, seq_len] batches.

Continued pre-training is the same with plain-text rows (`format: text`, every token trained): `PretrainConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

import jax
from flax import nnx

from tempax.algorithms.common import ModelSpec, build_model
from tempax.algorithms.sft.fused import fused_causal_lm_loss, lm_head_of
from tempax.algorithms.sft.losses import SFT_NORMALIZATIONS, causal_lm_loss
from tempax.algorithms.run import Run, start_run
from tempax.configlib import help_field
from tempax.errors import ConfigError
from tempax.models.lora import LoraConfig
from tempax.train.config import TrainConfig
from tempax.train.loop import Trainer, TrainResult


_help = help_field  # one documented-field helper for every config (tempax.configlib)


# --------------------------------------------------------------------------------------------------------------
# Config


@dataclass(frozen=True)
class DataSpec:
    """Training rows and how they become batches."""

    path: str = _help(
        "Dataset: a .jsonl/.json/.parquet file, a folder, or a Hub dataset id.", "../shared/data/hh-rlhf-sft/train.jsonl"
    )
    split: str | None = _help("Split of a folder or Hub dataset.", None)
    format: Literal["auto", "messages", "prompt_completion", "text"] = _help(
        "Row format: auto-detect, chat messages, prompt/completion, or plain text.", "auto"
    )
    train_on: Literal["assistant", "last_assistant", "all"] = _help(
        "Tokens that carry loss: every assistant turn, only the last, or all tokens.", "assistant"
    )
    text_fields: tuple[str, ...] = _help(
        "Plain-text rows: join these row fields with a newline into the text (e.g. [question, answer]); empty: "
        "the row's `text` field.",
        (),
    )
    overlong: Literal["truncate", "drop", "split"] = _help(
        "Examples longer than train.seq_len: truncate, drop, or split into chunks (text).", "truncate"
    )
    max_bad_fraction: float = _help("Fail when more than this fraction of rows is malformed.", 0.1)
    max_rows: int | None = _help("Use only the first N rows (quick runs); null: all.", None)
    eval_fraction: float = _help("Hold out this fraction of rows for evaluation (0: no evaluation).", 0.0)
    packing: bool = _help("Pack several examples into each row (segment ids keep them apart).", True)
    shuffle: bool = _help("Shuffle the examples (seeded by train.seed; a new order every epoch).", True)

    def validate(self) -> None:
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigError(f"max_rows must be >= 1 or null, got {self.max_rows}")


@dataclass(frozen=True)
class LossSpec:
    """The SFT loss."""

    normalize: Literal["tokens", "sequences"] = _help(
        "tokens: mean over every supervised token; sequences: mean of per-example means.", "tokens"
    )
    fused: bool = _help(
        "Compute the LM head and cross-entropy together with the gradient formed in the forward pass (no [B, T, V] "
        "logits kept for the backward); false: plain logits + causal_lm_loss.",
        True,
    )
    chunk_len: int | None = _help(
        "With fused: sequence positions per chunk of logits (the largest divisor of the sequence length not above "
        "it is used); null: whole sequences. Chunks keep the [B, T, V] temporaries small, which was faster on CPU.",
        64,
    )

    def validate(self) -> None:
        if self.chunk_len is not None and self.chunk_len < 1:
            raise ConfigError(f"loss.chunk_len must be >= 1 or null, got {self.chunk_len}")


@dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning (full, LoRA, QLoRA)."""

    model: ModelSpec = _help("The model.", default_factory=ModelSpec)
    lora: LoraConfig | None = _help("LoRA/QLoRA adapters; null: full fine-tuning.", None)
    data: DataSpec = _help("The data.", default_factory=DataSpec)
    loss: LossSpec = _help("The loss.", default_factory=LossSpec)
    train: TrainConfig = _help("The training loop.", default_factory=TrainConfig)


@dataclass(frozen=True)
class PretrainConfig(SFTConfig):
    """Continued pre-training on plain text: every token is trained."""

    data: DataSpec = _help(
        "The data (plain text).",
        default_factory=lambda: DataSpec(path="../shared/data/gsm8k/train.jsonl", format="text", train_on="all",
                                         text_fields=("question", "answer"), overlong="split"),
    )


# --------------------------------------------------------------------------------------------------------------
# The algorithm: loss function + batches


def make_sft_loss(
    normalize: str = "tokens", *, fused: bool = False, chunk_len: int | None = None
) -> Callable[[nnx.Module, dict[str, jax.Array]], tuple[jax.Array, dict]]:
    """`loss_fn(model, batch)` for the shared train step.

    batch: `tokens`, `targets`, `loss_mask`, `positions`, `segment_ids`, each [B, T] (see `tempax.data.packing`).
    The loss is `causal_lm_loss` (mean next-token NLL over supervised tokens, or of per-example means); its
    `loss_weight` is the micro-batch's supervised token count (or sequence count), which makes gradient
    accumulation equal to one pass over the whole batch. `fused` computes the same loss with
    `fused_causal_lm_loss` (head + cross-entropy in chunks of `chunk_len` positions, no logits kept).
    """
    if normalize not in SFT_NORMALIZATIONS:
        raise ConfigError(f"loss.normalize must be one of {SFT_NORMALIZATIONS}, got {normalize!r}")

    def loss_fn(model: nnx.Module, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
        kw = dict(positions=batch["positions"], segment_ids=batch["segment_ids"])
        if fused:
            hidden_btd, _ = model.hidden_states(batch["tokens"], **kw)
            head, vocab_major = lm_head_of(model, master=True)
            loss, metrics = fused_causal_lm_loss(
                hidden_btd, head, batch["targets"], batch["loss_mask"], vocab_major=vocab_major,
                normalize=normalize, chunk_len=chunk_len, softcap=model.config.final_logit_softcap,
            )
        else:
            logits_btv, _ = model(batch["tokens"], **kw)
            loss, metrics = causal_lm_loss(logits_btv, batch["targets"], batch["loss_mask"], normalize=normalize)
        metrics = dict(metrics)
        metrics["loss_weight"] = metrics["num_tokens"] if normalize == "tokens" else metrics["num_sequences"]
        return loss, metrics

    return loss_fn


def _text_rows(rows: list[Any], fields: tuple[str, ...]) -> list[Any]:
    """Rows with `fields` joined into a `text` field (rows missing a field are left for the report to flag)."""
    from tempax.data.sources import Row

    out = []
    for row in rows:
        data = row.data
        if data is not None and all(isinstance(data.get(f), str) for f in fields):
            data = {"text": "\n".join(data[f] for f in fields)}
        out.append(Row(data=data, source=row.source, index=row.index, error=row.error))
    return out


@dataclass
class SFTData:
    """The loaders and the data report of a run."""

    train: Any
    eval_examples: list[Any]
    report: Any
    eval_loader: Callable[[], Any] | None


def read_data_rows(cfg: SFTConfig) -> list[Any]:
    """The dataset's rows (raises `DataError` naming the path when it does not exist)."""
    from tempax.data.sources import read_rows

    return read_rows(cfg.data.path, split=cfg.data.split)


def build_data(
    cfg: SFTConfig, tokenizer: Any, rows: list[Any] | None = None, eval_rows: list[Any] | None = None
) -> SFTData:
    """Rows -> examples -> a resumable loader of packed batches, and held-out batches: of `eval_rows` when given
    (already split off by the caller), else of `data.eval_fraction` of the rows."""
    from tempax.data.formats import FormatOptions, tokenize_rows
    from tempax.data.loader import sft_loader
    from tempax.data.sources import holdout_split

    d, t = cfg.data, cfg.train
    rows = read_data_rows(cfg) if rows is None else rows
    if d.max_rows is not None:
        rows = rows[: d.max_rows]
    if eval_rows is None:
        eval_rows = []
        if d.eval_fraction > 0:
            rows, eval_rows = holdout_split(rows, d.eval_fraction, seed=t.seed)
    if d.text_fields:
        rows, eval_rows = _text_rows(rows, d.text_fields), _text_rows(eval_rows, d.text_fields)
    options = FormatOptions(format=d.format, train_on=d.train_on, max_length=t.seq_len, overlong=d.overlong,
                            max_bad_fraction=d.max_bad_fraction)
    examples, report = tokenize_rows(rows, tokenizer, options, name=d.path)
    pad = tokenizer.pad_id
    train = sft_loader(examples, batch_size=t.batch_size, seq_len=t.seq_len, pad_id=pad, packing=d.packing,
                       seed=t.seed, shuffle=d.shuffle)
    eval_examples: list[Any] = []
    eval_loader: Callable[[], Any] | None = None
    if eval_rows:
        eval_examples, _ = tokenize_rows(eval_rows, tokenizer, options, name=f"{d.path} (held out)", check=False)
        if eval_examples:
            def held_out() -> Any:  # a fresh single pass over the held-out rows, in order, for each evaluation
                return sft_loader(eval_examples, batch_size=t.batch_size, seq_len=t.seq_len, pad_id=pad,
                                  packing=d.packing, shuffle=False, num_epochs=1, drop_remainder=False)

            eval_loader = held_out
    return SFTData(train=train, eval_examples=eval_examples, report=report, eval_loader=eval_loader)


# --------------------------------------------------------------------------------------------------------------
# Entry point


def write_run_files(run: Run, data: SFTData, tokenizer: Any) -> None:
    """Reports the data and writes data_report.json and the tokenizer into the run dir (`start_run` wrote
    config.yaml); shared with the distillation main, which reads its data the same way."""
    run.say(data.report.summary())
    for where, reason, detail in data.report.bad_rows[:5]:
        run.say(f"  skipped {where}: {reason}" + (f" ({detail})" if detail else ""))
    run.write_json("data_report.json", data.report.to_dict())
    run.save_tokenizer(tokenizer)


def main(
    cfg: SFTConfig,
    *,
    hooks: tuple = (),
    log: Callable[[str], None] | None = None,
    model: nnx.Module | None = None,
    tokenizer: Any = None,
) -> TrainResult:
    """Trains per `cfg`; writes config.yaml, data_report.json, the tokenizer, metrics and checkpoints to run_dir.

    `model` / `tokenizer`: an already built model (with its adapters, when `cfg.lora` is set, applied here) and
    tokenizer to train instead of loading `cfg.model` (`tempax demo` passes the model it evaluated).
    `result.extras` holds `data_report` and `model` (the trained model).
    """
    run = start_run(cfg, log=log)
    rows = read_data_rows(cfg)  # a wrong path fails here, before any model is loaded
    mesh = cfg.train.mesh.build()
    model, tokenizer, trainable = build_model(cfg, mesh, model=model, tokenizer=tokenizer)
    data = build_data(cfg, tokenizer, rows)
    write_run_files(run, data, tokenizer)
    trainer = Trainer(
        model, make_sft_loss(cfg.loss.normalize, fused=cfg.loss.fused, chunk_len=cfg.loss.chunk_len), cfg.train,
        trainable=trainable, mesh=mesh, log=run.say,
        checkpoint_meta={"algorithm": type(cfg).__name__, "model_source": cfg.model.source},
        loss_chunk_len=cfg.loss.chunk_len if cfg.loss.fused else None,
    )
    del model  # the trainer holds its own copies; do not keep a second set of weights alive during training
    result = run.train(trainer, data.train, hooks=hooks, eval_batches=data.eval_loader)
    result.extras.update(data_report=data.report, model=trainer.model)
    return result
