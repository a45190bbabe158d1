"""Supervised fine-tuning and continued pre-training: `causal_lm_loss` + the data layer's batches on the shared
training core.

    cfg = load_config(SFTConfig, "recipes/sft_lora_smollm2.yaml", ["train.steps=20"])
    result = main(cfg)

The algorithm is two pieces, everything else is `tempax.train`:
  * `make_sft_loss(normalize)` -> `loss_fn(model, batch) -> (loss, metrics)`: next-token cross-entropy on the
    batch's `targets` where `loss_mask` is 1, attention restricted to each packed example by `segment_ids`.
    It reports `loss_weight` = supervised tokens (or sequences), so gradient accumulation reproduces the
    full-batch token mean exactly.
  * `tempax.data.sft.build_data`: rows -> tokenised examples (chat template, assistant-only loss mask, bad rows
    skipped and reported) -> a resumable loader of packed [batch_size, seq_len] batches.

Continued pre-training is the same with plain-text rows (`format: text`, every token trained): `PretrainConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

import jax
from flax import nnx

from tempax.algorithms.common import ModelSourceConfig, build_model
from tempax.algorithms.run import RunResult, make_trainer, start_run, write_run_files
from tempax.algorithms.sft.losses import SFT_NORMALIZATIONS, causal_lm_loss
from tempax.configlib import help_field
from tempax.data.sft import SFTDataConfig, build_data, read_data_rows
from tempax.errors import ConfigError
from tempax.models.decoder import lm_head_of
from tempax.models.lora import LoraConfig
from tempax.ops import fused_causal_lm_loss
from tempax.train.config import TrainConfig
from tempax.train.trainable import Trainable


# --------------------------------------------------------------------------------------------------------------
# Config


@dataclass(frozen=True)
class SFTLossConfig:
    """The SFT loss."""

    normalize: Literal["tokens", "sequences"] = help_field(
        "tokens: mean over every supervised token; sequences: mean of per-example means.", "tokens"
    )
    fused: bool = help_field(
        "Compute the LM head and cross-entropy together with the gradient formed in the forward pass (no [B, T, V] "
        "logits kept for the backward); false: plain logits + causal_lm_loss.",
        True,
    )
    chunk_len: int | None = help_field(
        "With fused: sequence positions of each row per chunk of logits (a chunk holds this many positions of every "
        "row of the batch; the largest divisor of the length not above it is used); null: whole sequences. Chunks "
        "keep the [B, T, V] temporaries small.",
        64,
    )

    def validate(self) -> None:
        if self.chunk_len is not None and self.chunk_len < 1:
            raise ConfigError(f"loss.chunk_len must be >= 1 or null, got {self.chunk_len}")


@dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning (full, LoRA, QLoRA)."""

    model: ModelSourceConfig = help_field("The model.", default_factory=ModelSourceConfig)
    lora: LoraConfig | None = help_field("LoRA/QLoRA adapters; null: full fine-tuning.", None)
    data: SFTDataConfig = help_field("The data.", default_factory=SFTDataConfig)
    loss: SFTLossConfig = help_field("The loss.", default_factory=SFTLossConfig)
    train: TrainConfig = help_field("The training loop.", default_factory=TrainConfig)


@dataclass(frozen=True)
class PretrainConfig(SFTConfig):
    """Continued pre-training on plain text: every token is trained."""

    data: SFTDataConfig = help_field(
        "The data (plain text; data.path is required).",
        default_factory=lambda: SFTDataConfig(format="text", train_on="all", overlong="split"),
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


# --------------------------------------------------------------------------------------------------------------
# Entry point


def main(
    cfg: SFTConfig,
    *,
    hooks: tuple = (),
    log: Callable[[str], None] | None = None,
    model: nnx.Module | None = None,
    tokenizer: Any = None,
) -> RunResult:
    """Trains per `cfg`; writes config.yaml, data_report.json, the tokenizer, metrics and checkpoints to run_dir.

    `model` / `tokenizer`: an already built model (with its adapters, when `cfg.lora` is set, applied here) and
    tokenizer to train instead of loading `cfg.model` (`tempax demo` passes the model it evaluated).
    `result.extras` holds `data_report`; `result.model` is the trained model.
    """
    run = start_run(cfg, log=log)
    rows = read_data_rows(cfg.data)  # a wrong path fails here, before any model is loaded
    base, tok, trainable = build_model(cfg, run.mesh, model=model, tokenizer=tokenizer)
    t, loss = cfg.train, cfg.loss
    data = build_data(cfg.data, tok, batch_size=t.batch_size, seq_len=t.seq_len, seed=t.seed, rows=rows)
    write_run_files(run, data, tok)
    trainer = make_trainer(cfg, Trainable(base, logit_positions=loss.chunk_len if loss.fused else None),
                           make_sft_loss(loss.normalize, fused=loss.fused, chunk_len=loss.chunk_len),
                           algorithm=type(cfg).__name__, trainable=trainable, mesh=run.mesh, log=run.say)
    del base  # the trainer holds the weights now
    result = run.train(trainer, data.train, hooks=hooks, eval_batches=data.eval_loader)
    result.extras.update(data_report=data.report)
    return result
