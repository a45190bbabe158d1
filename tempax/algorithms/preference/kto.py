"""KTO (Ethayarajh et al. 2024) on unpaired feedback, on the shared training core — `tempax kto`.

    cfg = load_config(KTOConfig, "recipes/kto_smollm2_lora.yaml", ["train.steps=20"])
    result = main(cfg)          # prints held-out preference metrics before and after training

Rows are a prompt, one completion and a desirable / undesirable label (`tempax.data.unpaired`), or preference
pairs split into two such rows (`data.convert_pairs`). The run is the DPO machinery with another loss:
  * the batch: the stacked layout of `tempax.algorithms.preference.batches` — for B examples, rows 0..B-1 are
    (x_i, y_i) and rows B..2B-1 the mismatched (x_i, y'_i) that estimate KTO's KL reference point, plus a [2B]
    `desirable` label; micro-batches keep each example with its mismatched row, as they keep pairs.
  * `KTOLoss` — `loss_fn(model, batch)`: the policy scores (x_i, y_i) with gradients and the mismatched rows
    without (the reference point is detached, so their backward pass is never built); the reference scores both;
    `losses.kto_loss` gives the loss and its metrics.
  * the reference: `kto.reference`, as `dpo.reference` (adapters off for LoRA, precomputed for full weights, or a
    frozen copy).
  * evaluation: held-out *preference pairs* scored like DPO's (`DPOLoss`, sigmoid): preference accuracy of the
    implicit rewards beta (log pi - log ref) of the chosen vs the rejected reply, their margin, the policy's
    mean-log-prob preference; its `loss` is the DPO loss of those rewards. Printed before and after training.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from tempax.algorithms.common import ModelSourceConfig
from tempax.algorithms.preference.batches import (
    REF_LOGPS,
    AnnotatedPair,
    check_micro_batching,
    pair_mask,
    sequence_logps,
    split_pairs,
)
from tempax.algorithms.preference.data import (
    PreferenceEvalConfig,
    UnpairedDataConfig,
    build_unpaired_data,
    pairs_per_batch,
)
from tempax.algorithms.preference.losses import kto_loss
from tempax.algorithms.preference.dpo import (
    DPOLoss,
    PreferenceRun,
    ReferenceMode,
    prepare_run,
    report_pairs,
    reference_batch_size_field,
    reference_field,
    resolve_reference,
)
from tempax.algorithms.run import RunResult, start_run
from tempax.configlib import help_field
from tempax.data.preference import PreferencePair
from tempax.errors import ConfigError
from tempax.models.lora import LoraConfig, disable_adapters
from tempax.train.config import TrainConfig

# The batch key holding each row's label ([2B]: 1.0 desirable, 0.0 undesirable; the mismatched row repeats it).
DESIRABLE = "desirable"


@dataclass(frozen=True)
class KTOKnobsConfig:
    """The KTO loss and its reference model."""

    beta: float = help_field("Strength of the implicit KL penalty (the paper's beta, typically 0.1).", 0.1)
    desirable_weight: float = help_field(
        "lambda_D, weight of desirable rows; the paper keeps lambda_D n_D / (lambda_U n_U) in [1, 4/3].", 1.0
    )
    undesirable_weight: float = help_field("lambda_U, weight of undesirable rows.", 1.0)
    reference: ReferenceMode = reference_field()
    reference_batch_size: int | None = reference_batch_size_field()

    def validate(self) -> None:
        if self.beta <= 0:
            raise ConfigError(f"kto.beta must be > 0, got {self.beta}")
        for key in ("desirable_weight", "undesirable_weight"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"kto.{key} must be > 0, got {getattr(self, key)}")
        if self.reference_batch_size is not None and self.reference_batch_size < 1:
            raise ConfigError(f"kto.reference_batch_size must be >= 1 or null, got {self.reference_batch_size}")

    def reference_mode(self, *, has_adapters: bool) -> str:
        """'adapters_off', 'precomputed' or 'frozen_copy' (KTO always needs a reference)."""
        return resolve_reference(self.reference, needs_reference=True, has_adapters=has_adapters, section="kto")


@dataclass(frozen=True)
class KTOConfig:
    """KTO on unpaired feedback with full weights, LoRA or QLoRA."""

    RENAMED_KEYS: ClassVar[Mapping[str, str]] = {"eval_before": "eval.before"}

    model: ModelSourceConfig = help_field("The policy model (also the reference, see kto.reference).",
                                          default_factory=ModelSourceConfig)
    lora: LoraConfig | None = help_field("LoRA/QLoRA adapters; null: full fine-tuning.", None)
    data: UnpairedDataConfig = help_field("Unpaired rows (or pairs to split) and held-out pairs.",
                                   default_factory=UnpairedDataConfig)
    kto: KTOKnobsConfig = help_field("The KTO loss.", default_factory=KTOKnobsConfig)
    eval: PreferenceEvalConfig = help_field("The held-out pairs' evaluation.", default_factory=PreferenceEvalConfig)
    train: TrainConfig = help_field(
        "The training loop; batch_size and micro_batch_size count rows, two per example (its completion and a "
        "mismatched one).",
        default_factory=TrainConfig,
    )

    def validate(self) -> None:
        check_micro_batching(pairs_per_batch(self.train.batch_size), self.train.accumulation_steps)


@dataclass(frozen=True)
class KTOLoss:
    """`loss_fn(model, batch) -> (loss, metrics)` for stacked KTO batches (see the module docstring).

    Attributes:
      beta, desirable_weight, undesirable_weight: `losses.kto_loss`'s hyper-parameters.
      reference: 'batch' (the batch's `ref_logps`) or 'adapters_off' (a pass with the adapters switched off).
    """

    beta: float = 0.1
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0
    reference: Literal["batch", "adapters_off"] = "batch"

    def __call__(self, model: nnx.Module, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
        rows = batch["tokens"].shape[0] // 2
        own = {k: v[:rows] for k, v in batch.items()}
        other = {k: v[rows:] for k, v in batch.items()}
        logps, _ = sequence_logps(model, own)
        kl_logps = jax.lax.stop_gradient(sequence_logps(model, other)[0])
        if self.reference == "batch":
            ref = batch[REF_LOGPS]
        else:
            with disable_adapters(model):
                ref, _ = sequence_logps(model, batch)
        ref, ref_kl = split_pairs(jax.lax.stop_gradient(ref))
        mask = pair_mask(batch)
        loss, metrics = kto_loss(logps, ref, kl_logps, ref_kl, own[DESIRABLE], mask=mask, beta=self.beta,
                                 desirable_weight=self.desirable_weight, undesirable_weight=self.undesirable_weight)
        metrics["loss_weight"] = jnp.sum(mask)
        return loss, metrics


def kto_items(examples: list[Any]) -> list[AnnotatedPair]:
    """`UnpairedExample`s as stacked-batch items: (x_i, y_i) on the first row, (x_i, y'_i) on the second, the
    label on both."""
    return [
        AnnotatedPair(PreferencePair(ex.completion, ex.mismatched, ex.source),
                      {DESIRABLE: (float(ex.desirable), float(ex.desirable))})
        for ex in examples
    ]


def prepare(cfg: KTOConfig, *, log: Callable[[str], None] | None = None) -> PreferenceRun:
    """Builds model, data, reference log-probs and the `Trainer` of a KTO run (no training step yet)."""
    spec = cfg.kto

    def losses_of(mode: str) -> tuple[KTOLoss, DPOLoss]:
        reference = "adapters_off" if mode == "adapters_off" else "batch"
        train_loss = KTOLoss(spec.beta, spec.desirable_weight, spec.undesirable_weight, reference)
        eval_loss = DPOLoss("sigmoid", (("beta", spec.beta), ("label_smoothing", 0.0)), reference)
        return train_loss, eval_loss

    return prepare_run(
        cfg,
        mode_of=lambda has_adapters: spec.reference_mode(has_adapters=has_adapters),
        build_data=build_unpaired_data,
        items_of=kto_items,
        losses_of=losses_of,
        reference_batch_size=spec.reference_batch_size,
        meta={"algorithm": "kto", "loss": "kto"},
        log=log,
    )


def main(cfg: KTOConfig, *, hooks: tuple = (), log: Callable[[str], None] | None = None) -> RunResult:
    """Trains per `cfg` and prints held-out preference metrics before and after.

    Writes what `tempax dpo` writes (config.yaml, data_report.json, the tokenizer, metrics.jsonl, checkpoints,
    eval_summary.json). Training metrics: `losses.kto_loss`'s (desirable / undesirable rewards, `kl`, ...);
    `eval/*`: the held-out pairs' (accuracy, reward_margin, ...). `result.extras` as `tempax dpo`'s.
    """
    run = start_run(cfg, log=log)
    kto = prepare(cfg, log=run.say)
    n_d = sum(ex.desirable for ex in kto.data.train)
    n_u = len(kto.data.train) - n_d
    run.say(f"examples: {n_d} desirable, {n_u} undesirable; lambda_D n_D / (lambda_U n_U) = "
            f"{cfg.kto.desirable_weight * n_d / max(cfg.kto.undesirable_weight * n_u, 1e-9):.3g}"
            " (the paper recommends 1 to 4/3)")
    run.save_tokenizer(kto.tokenizer)
    result = run.train(kto.trainer, kto.train_batches, hooks=hooks, eval_batches=kto.eval_batches,
                       evaluate_before=cfg.eval.before)
    return report_pairs(run, kto, result, what="implicit rewards of the KTO policy", extra={"loss": "kto"})
