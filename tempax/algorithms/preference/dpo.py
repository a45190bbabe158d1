"""Preference tuning — DPO (sigmoid, label smoothing), IPO, hinge, ORPO, SimPO — on the shared training core.

    cfg = load_config(DPOConfig, "recipes/dpo_smollm2_lora.yaml", ["train.steps=20"])
    result = main(cfg)          # prints held-out metrics before and after training

The algorithm is two pieces; everything else (step, optimizer, checkpoints, metrics, eval cadence) is
`tempax.train`: the loss, `DPOLoss`, and the batches, `tempax.data.preference` pairs plus `ref_logps` when the
reference is stored with the data. `resolve_reference` says where the reference log-probs come from, without a
second copy of the weights by default; ORPO and SimPO need none.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tempax.algorithms.preference.batches import (
    LOGPROB_CHUNK,
    REF_LOGPS,
    check_micro_batching,
    compute_reference_logps,
    jit_sequence_logps,
    pair_loaders,
    pair_mask,
    pair_preference_loss,
    sequence_logps,
    split_pairs,
)
from tempax.algorithms.preference.data import (
    PreferenceDataConfig,
    PreferenceEvalConfig,
    build_preference_data,
    check_enough_pairs,
    pairs_per_batch,
    report_data,
)
from tempax.algorithms.preference.losses import PREFERENCE_LOSS_NAMES, preference_loss_needs_reference
from tempax.algorithms.common import ModelSourceConfig, build_model
from tempax.algorithms.run import Run, RunResult, make_trainer, start_run
from tempax.errors import ConfigError
from tempax.models.lora import LoraConfig, disable_adapters
from tempax.train.config import TrainConfig
from tempax.train.loop import Trainer
from tempax.train.trainable import Trainable
from tempax.configlib import help_field

ReferenceMode = Literal["auto", "adapters_off", "precomputed", "frozen_copy"]


def reference_field() -> Any:
    """The documented `reference` field of DPO's and KTO's knobs (one definition for both)."""
    return help_field(
        "Reference log-probs: auto (adapters_off with LoRA, precomputed otherwise), adapters_off (LoRA: the base "
        "with adapters disabled), precomputed (one pass before training, stored with the data), frozen_copy "
        "(a second frozen model; doubles weight memory).",
        "auto",
    )


def reference_batch_size_field() -> Any:
    return help_field(
        "Pairs per forward pass when precomputing reference log-probs; null: half of train.batch_size.", None
    )


def resolve_reference(reference: str, *, needs_reference: bool, has_adapters: bool, section: str) -> str:
    """'none', 'adapters_off', 'precomputed' or 'frozen_copy' for a `<section>.reference` choice and model.

    Where the reference log-probs come from (`dpo.reference`), without a second copy of the weights by default:
      adapters_off  LoRA/QLoRA: the same model with its adapters switched off (`lora.disable_adapters`) inside the
                    loss — the frozen base *is* the reference. One model in memory; one extra forward per step.
      precomputed   one pass of the initial model over every train and held-out pair before training, stored with
                    the pairs and batched as `ref_logps`; training then holds one model and runs one forward per step.
      frozen_copy   a second, frozen copy of the initial weights that scores each batch as it is drawn (only when
                    asked: it doubles weight memory).
      auto          adapters_off with LoRA, precomputed with full fine-tuning.
    ORPO and SimPO need no reference; none is computed for them.
    """
    if not needs_reference:
        return "none"
    if reference == "auto":
        return "adapters_off" if has_adapters else "precomputed"
    if reference == "adapters_off" and not has_adapters:
        raise ConfigError(
            f"{section}.reference=adapters_off needs LoRA adapters (set lora:), since the base with adapters off is "
            "the reference; for full fine-tuning use precomputed or frozen_copy"
        )
    return reference


# --------------------------------------------------------------------------------------------------------------
# Config


@dataclass(frozen=True)
class DPOKnobsConfig:
    """The preference loss and its reference model."""

    loss: Literal["sigmoid", "ipo", "hinge", "orpo", "simpo"] = help_field(
        "sigmoid (DPO), ipo, hinge (SLiC-style), orpo (no reference) or simpo (length-normalised, no reference).",
        "sigmoid",
    )
    beta: float = help_field(
        "sigmoid/ipo/hinge: KL strength (typically 0.1; IPO's tau). simpo: reward scale (paper: 2.0-10.0).", 0.1
    )
    label_smoothing: float = help_field(
        "sigmoid/simpo: assumed probability that a label is flipped (cDPO), in [0, 0.5); 0 = off.", 0.0
    )
    gamma: float = help_field("simpo: target reward margin (paper: 0.3-1.6).", 0.5)
    orpo_lambda: float = help_field("orpo: weight of the odds-ratio term added to the chosen NLL (paper: 0.1-1).", 0.1)
    reference: ReferenceMode = reference_field()
    reference_batch_size: int | None = reference_batch_size_field()

    def validate(self) -> None:
        if self.loss not in PREFERENCE_LOSS_NAMES:
            raise ConfigError(f"dpo.loss must be one of {', '.join(PREFERENCE_LOSS_NAMES)}, got {self.loss!r}")
        if self.beta <= 0:
            raise ConfigError(f"dpo.beta must be > 0, got {self.beta}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ConfigError(f"dpo.label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if self.label_smoothing and self.loss not in ("sigmoid", "simpo"):
            raise ConfigError(f"dpo.label_smoothing applies to the sigmoid and simpo losses, not {self.loss!r}")
        if self.orpo_lambda < 0:
            raise ConfigError(f"dpo.orpo_lambda must be >= 0, got {self.orpo_lambda}")
        if self.reference_batch_size is not None and self.reference_batch_size < 1:
            raise ConfigError(f"dpo.reference_batch_size must be >= 1 or null, got {self.reference_batch_size}")

    @property
    def needs_reference(self) -> bool:
        return preference_loss_needs_reference(self.loss)

    def hparams(self) -> dict[str, float]:
        """The keyword hyper-parameters `losses.preference_loss` takes for this loss."""
        if self.loss == "sigmoid":
            return {"beta": self.beta, "label_smoothing": self.label_smoothing}
        if self.loss in ("ipo", "hinge"):
            return {"beta": self.beta}
        if self.loss == "orpo":
            return {"lam": self.orpo_lambda}
        return {"beta": self.beta, "gamma": self.gamma, "label_smoothing": self.label_smoothing}

    def reference_mode(self, *, has_adapters: bool) -> str:
        """'none', 'adapters_off', 'precomputed' or 'frozen_copy' for this loss and model."""
        return resolve_reference(self.reference, needs_reference=self.needs_reference, has_adapters=has_adapters,
                                 section="dpo")


@dataclass(frozen=True)
class DPOConfig:
    """Preference tuning (DPO, IPO, hinge, ORPO, SimPO) with full weights, LoRA or QLoRA."""

    RENAMED_KEYS: ClassVar[Mapping[str, str]] = {"eval_before": "eval.before"}

    model: ModelSourceConfig = help_field("The policy model (also the reference, see dpo.reference).",
                                          default_factory=ModelSourceConfig)
    lora: LoraConfig | None = help_field("LoRA/QLoRA adapters; null: full fine-tuning.", None)
    data: PreferenceDataConfig = help_field("Preference pairs.", default_factory=PreferenceDataConfig)
    dpo: DPOKnobsConfig = help_field("The preference loss.", default_factory=DPOKnobsConfig)
    eval: PreferenceEvalConfig = help_field("The held-out pairs' evaluation.", default_factory=PreferenceEvalConfig)
    train: TrainConfig = help_field(
        "The training loop; batch_size and micro_batch_size count rows, two per pair.", default_factory=TrainConfig
    )

    def validate(self) -> None:
        pairs = pairs_per_batch(self.train.batch_size)
        check_micro_batching(pairs, self.train.accumulation_steps)


# --------------------------------------------------------------------------------------------------------------
# The loss function


@dataclass(frozen=True)
class DPOLoss:
    """`loss_fn(model, batch) -> (loss, metrics)` for stacked preference batches.

    One forward pass over a stacked [2B, T] batch (chosen rows, then rejected rows) gives each response's summed
    log-prob; `losses.preference_loss` turns them, with the reference log-probs, into the loss and its metrics
    (loss, chosen/rejected implicit rewards, reward margin, preference accuracy, chosen/rejected log-probs),
    averaged over real pairs.

    Attributes:
      loss: the `losses.preference_loss` name.
      hparams: its keyword hyper-parameters, as sorted (name, value) pairs (hashable, so the step's jit cache
        sees a constant).
      reference: 'none', 'batch' (the batch's `ref_logps`) or 'adapters_off' (a second pass with the adapters
        switched off; no gradient flows through it).
    """

    loss: str = "sigmoid"
    hparams: tuple[tuple[str, float], ...] = (("beta", 0.1),)
    reference: Literal["none", "batch", "adapters_off"] = "batch"

    @classmethod
    def from_spec(cls, spec: DPOKnobsConfig, mode: str) -> "DPOLoss":
        reference = {"none": "none", "adapters_off": "adapters_off"}.get(mode, "batch")
        return cls(spec.loss, tuple(sorted(spec.hparams().items())), reference)

    def __call__(self, model: nnx.Module, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
        logps, num_tokens = sequence_logps(model, batch)
        ref = None
        if self.reference == "batch":
            ref = batch[REF_LOGPS]
        elif self.reference == "adapters_off":
            with disable_adapters(model):
                ref, _ = sequence_logps(model, batch)
        weights = pair_mask(batch)
        loss, metrics = pair_preference_loss(self.loss, logps, num_tokens, weights, ref_logps=ref,
                                             **dict(self.hparams))
        # The policy's own preference, meaningful before training too (when every implicit reward is 0, a tie):
        # does it give the chosen reply a higher mean per-token log-prob than the rejected one?
        (pc, pr), (nc, nr) = split_pairs(logps), split_pairs(num_tokens)
        prefers = (pc / jnp.maximum(nc, 1.0) > pr / jnp.maximum(nr, 1.0)).astype(jnp.float32)
        metrics["mean_logp_accuracy"] = jnp.sum(prefers * weights) / jnp.maximum(jnp.sum(weights), 1.0)
        return loss, metrics


# --------------------------------------------------------------------------------------------------------------
# Set-up and entry point


@dataclass
class PreferenceRun:
    """Everything a DPO or KTO `main` trains with (built by `prepare`, so tests can inspect a run without training it).

    Attributes:
      trainer: the `Trainer` (holds the one model: trainable params + frozen rest).
      loss_fn: the `DPOLoss`.
      reference: 'none', 'adapters_off', 'precomputed' or 'frozen_copy'.
      train_batches: the resumable training loader.
      eval_batches: zero-argument callable giving the held-out batches, or None.
      data: the tokenised pairs and their reports.
      tokenizer: the tokenizer.
      reference_model: the frozen copy ('frozen_copy' only; else None).
    """

    trainer: Trainer
    loss_fn: DPOLoss
    reference: str
    train_batches: Any
    eval_batches: Callable[[], list[dict[str, np.ndarray]]] | None
    data: Any
    tokenizer: Any
    reference_model: nnx.Module | None = None


def _frozen_copy(model: nnx.Module) -> nnx.Module:
    """A copy of `model` with its own buffers: the trainer donates the policy's, so sharing them would break it."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(lambda x: x.copy(), state))


def prepare_run(
    cfg: Any,
    *,
    mode_of: Callable[[bool], str],
    build_data: Callable[..., Any],
    items_of: Callable[[list[Any]], list[Any]],
    losses_of: Callable[[str], tuple[Any, Any]],
    reference_batch_size: int | None,
    meta: dict[str, Any],
    log: Callable[[str], None] | None = None,
) -> PreferenceRun:
    """Builds model, data, reference log-probs and the `Trainer` of a stacked-batch preference run (DPO family or
    KTO; no training step yet).

    Args:
      cfg: a config with `model`, `lora`, `data` (a `PreferenceDataConfig`) and `train`.
      mode_of: has_adapters -> the reference mode ('none', 'adapters_off', 'precomputed', 'frozen_copy').
      build_data: `build_preference_data`-like (spec, tokenizer, seq_len=, seed=) -> `PreferenceData`.
      items_of: the training examples -> stacked-batch items (`PreferencePair` / `AnnotatedPair`).
      losses_of: mode -> (training loss_fn, evaluation loss_fn or None for the same).
      reference_batch_size: pairs per forward pass when precomputing (None: half of train.batch_size).
      meta: what the checkpoints record besides the model source (e.g. {"algorithm": "dpo", "loss": ...}).
    """
    say = log or (lambda text: print(text, file=sys.stderr))
    t = cfg.train
    mesh = t.mesh.build()
    model, tokenizer, trainable = build_model(cfg, mesh)
    mode = mode_of(cfg.lora is not None)
    data = build_data(cfg.data, tokenizer, seq_len=t.seq_len, seed=t.seed)
    report_data(data, t.run_dir, say)
    pairs = pairs_per_batch(t.batch_size)
    check_enough_pairs(data.train, pairs, cfg.data.path)
    pad = tokenizer.pad_id
    train_items: list[Any] = items_of(list(data.train))
    eval_items: list[Any] = list(data.eval)
    reference_model = None
    collate = None
    if mode == "precomputed":
        ref_pairs = reference_batch_size or pairs
        say(f"reference: precomputing log-probs of {len(train_items) + len(eval_items)} pairs with the initial model")
        fn = jit_sequence_logps(model, adapters_off=cfg.lora is not None)
        train_items = compute_reference_logps(None, train_items, batch_size=ref_pairs, seq_len=t.seq_len, pad_id=pad,
                                              logps_fn=fn)
        if eval_items:
            eval_items = compute_reference_logps(None, eval_items, batch_size=ref_pairs, seq_len=t.seq_len,
                                                 pad_id=pad, logps_fn=fn)
    elif mode == "frozen_copy":
        say("reference: a frozen copy of the initial model scores each batch (twice the weight memory)")
        reference_model = _frozen_copy(model)
        fn = jit_sequence_logps(reference_model, adapters_off=cfg.lora is not None)  # no adapter dropout either

        def collate(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            batch[REF_LOGPS] = fn(batch)[0].astype(np.float32)
            return batch
    else:
        none = f"none ({meta.get('loss')} needs none)"
        say(f"reference: {none if mode == 'none' else 'the base model with adapters switched off'}")

    loader, eval_batches = pair_loaders(train_items, eval_items, pairs=pairs, seq_len=t.seq_len, pad_id=pad,
                                        seed=t.seed, shuffle=cfg.data.shuffle, collate=collate)
    loss_fn, eval_loss_fn = losses_of(mode)
    # `sequence_logps` runs the head on LOGPROB_CHUNK positions of a row at a time: the memory plan sizes that.
    trainer = make_trainer(cfg, Trainable(model, logit_positions=LOGPROB_CHUNK), loss_fn, algorithm=meta["algorithm"],
                           trainable=trainable, mesh=mesh, log=say, eval_loss_fn=eval_loss_fn, checkpoint_meta=meta)
    del model  # the trainer holds the weights now
    # The trainer may have picked the micro-batch itself (auto_micro_batch); pairs must still stay whole.
    check_micro_batching(pairs, trainer.num_micro_batches)
    return PreferenceRun(trainer, loss_fn, mode, loader, eval_batches, data, tokenizer, reference_model)


def prepare(cfg: DPOConfig, *, log: Callable[[str], None] | None = None) -> PreferenceRun:
    """Builds model, data, reference log-probs and the `Trainer` of a DPO run (no training step yet)."""
    return prepare_run(
        cfg,
        mode_of=lambda has_adapters: cfg.dpo.reference_mode(has_adapters=has_adapters),
        build_data=build_preference_data,
        items_of=lambda items: items,
        losses_of=lambda mode: (DPOLoss.from_spec(cfg.dpo, mode), None),
        reference_batch_size=cfg.dpo.reference_batch_size,
        meta={"algorithm": "dpo", "loss": cfg.dpo.loss},
        log=log,
    )


def main(cfg: DPOConfig, *, hooks: tuple = (), log: Callable[[str], None] | None = None) -> RunResult:
    """Trains per `cfg` and prints held-out metrics before and after.

    Writes to run_dir: config.yaml, data_report.json, the tokenizer, metrics.jsonl (with `eval/*` every
    train.eval_every steps and at the end), checkpoints and eval_summary.json ({"before", "after"}).
    `result.extras` holds `eval_before`, `eval_after`, `reference`, `data_report` and `eval_data_report`.
    """
    run = start_run(cfg, log=log)
    dpo = prepare(cfg, log=run.say)
    run.save_tokenizer(dpo.tokenizer)
    result = run.train(dpo.trainer, dpo.train_batches, hooks=hooks, eval_batches=dpo.eval_batches,
                       evaluate_before=cfg.eval.before)
    return report_pairs(run, dpo, result, what=f"{cfg.dpo.loss} loss", extra={"loss": cfg.dpo.loss})


def report_pairs(run: Run, prepared: PreferenceRun, result: RunResult, *, what: str,
                 extra: dict[str, Any]) -> RunResult:
    """The finish of every pair-scored preference method (DPO family, KTO): the before/after table of the
    held-out pairs (`what` names the scores), eval_summary.json (with `extra`), and the reference mode and data
    reports in `result.extras`."""
    run.report_held_out(result, title=f"held-out pairs ({len(prepared.data.eval)}), {what}:",
                        extra={**extra, "reference": prepared.reference, "eval_pairs": len(prepared.data.eval)})
    result.extras.update(reference=prepared.reference, data_report=prepared.data.report,
                         eval_data_report=prepared.data.eval_report)
    return result
