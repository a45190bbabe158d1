"""Reward-model training: a scalar head on the decoder, Bradley-Terry loss on preference pairs, on the shared core.

    cfg = load_config(RewardModelConfig, "recipes/reward_model_smollm2_lora.yaml")
    result = main(cfg)          # prints held-out preference accuracy before and after, saves the reward model

  * `RewardLoss` — `loss_fn(model, batch)`: one forward pass over a stacked [2B, T]
    batch gives r(chosen) and r(rejected) at each row's last token; L = -log sigmoid(r_c - r_r - m).
  * the batches: the same preference pairs as DPO (`tempax.data.preference`), plus an optional per-pair
    `margin` read from a row field (`reward.margin_field`).

With LoRA/QLoRA the adapters and the head are trained (the head is always fully trainable: it starts random);
with full fine-tuning everything is. At the end the model is saved to `<run_dir>/reward_model` (adapters merged)
for `tempax score`, `tempax.models.reward_model.load_reward_model` and `tempax.rewards.reward_model.RewardScorer`
(a reward function for GRPO, PPO and best-of-n).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tempax.algorithms.preference.batches import (
    annotate,
    check_micro_batching,
    pair_loaders,
    pair_mask,
    per_pair_mean,
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
from tempax.algorithms.common import ModelSourceConfig, build_model
from tempax.algorithms.preference.losses import bradley_terry_loss
from tempax.algorithms.run import RunResult, make_trainer, start_run
from tempax.errors import DataError
from tempax.models.lora import LoraConfig
from tempax.models.reward_model import RewardModel, reward_scores, save_reward_model
from tempax.train.config import TrainConfig
from tempax.train.loop import Trainer
from tempax.train.trainable import Trainable
from tempax.configlib import help_field
from tempax.data.sources import read_rows


# The batch key of an optional per-pair Bradley-Terry margin ([2B], equal on a pair's two rows).
MARGIN = "margin"




@dataclass(frozen=True)
class RewardLoss:
    """`loss_fn(model, batch) -> (loss, metrics)` of reward-model training on stacked preference batches.

        L = mean over real pairs of -log sigmoid(r_c - r_r - m)

    m is `margin` (a constant) plus, when the batch carries it, the per-pair `margin` key (e.g. how strongly
    the rater preferred the chosen response; Touvron et al. 2023, Llama 2). Metrics: loss, chosen_reward,
    rejected_reward, reward_margin, accuracy (r_c > r_r), loss_weight (real pairs).
    """

    margin: float = 0.0

    def __call__(self, model: RewardModel, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
        rc, rr = split_pairs(reward_scores(model, batch))
        m = jnp.full(rc.shape, self.margin, jnp.float32)
        if MARGIN in batch:
            m = m + split_pairs(batch[MARGIN])[0]
        return per_pair_mean(
            lambda chosen, rejected, margin: bradley_terry_loss(chosen, rejected, margin=margin),
            {"chosen": rc, "rejected": rr, "margin": m},
            pair_mask(batch),
        )


@dataclass(frozen=True)
class RewardModelKnobsConfig:
    """The Bradley-Terry loss and where the trained reward model goes."""

    margin: float = help_field("Constant margin m in -log sigmoid(r_c - r_r - m); 0 = plain Bradley-Terry.", 0.0)
    margin_field: str | None = help_field(
        "Row field holding a per-pair margin added to `margin` (e.g. a rating gap, as in Llama 2); null: none.", None
    )
    head_init_std: float | None = help_field("Std of the head's initial weights; null: 1/sqrt(hidden + 1).", None)
    save_dir: str | None = help_field("Where to save the trained reward model; null: <run_dir>/reward_model.", None)
    save: bool = help_field("Save the reward model at the end (merged adapters, head, tokenizer).", True)


@dataclass(frozen=True)
class RewardModelConfig:
    """Bradley-Terry reward-model training with full weights, LoRA or QLoRA."""

    RENAMED_KEYS: ClassVar[Mapping[str, str]] = {"eval_before": "eval.before"}

    model: ModelSourceConfig = help_field("The backbone the scalar head sits on.", default_factory=ModelSourceConfig)
    lora: LoraConfig | None = help_field("LoRA/QLoRA adapters on the backbone; null: full fine-tuning.", None)
    data: PreferenceDataConfig = help_field("Preference pairs.", default_factory=PreferenceDataConfig)
    reward: RewardModelKnobsConfig = help_field("The loss and saving.", default_factory=RewardModelKnobsConfig)
    eval: PreferenceEvalConfig = help_field("The held-out pairs' evaluation.", default_factory=PreferenceEvalConfig)
    train: TrainConfig = help_field(
        "The training loop; batch_size and micro_batch_size count rows, two per pair.", default_factory=TrainConfig
    )

    def validate(self) -> None:
        pairs = pairs_per_batch(self.train.batch_size)
        check_micro_batching(pairs, self.train.accumulation_steps)


@dataclass
class RewardRun:
    """What `main` trains with (built by `prepare`)."""

    trainer: Trainer
    loss_fn: RewardLoss
    train_batches: Any
    eval_batches: Callable[[], list[dict[str, np.ndarray]]] | None
    data: Any
    tokenizer: Any


def _with_margins(pairs: list[Any], rows: dict[str, dict[str, Any]], field_name: str, what: str) -> list[Any]:
    """Pairs carrying `margin` = float(row[field_name]) on both rows."""
    out = []
    for item in annotate(pairs):
        value = (rows.get(item.source) or {}).get(field_name)
        try:
            m = float(value)
        except (TypeError, ValueError):
            raise DataError(
                f"{what} {item.source}: reward.margin_field={field_name!r} is {value!r}, not a number; fix the row "
                "or set reward.margin_field=null"
            ) from None
        if not math.isfinite(m):
            raise DataError(f"{what} {item.source}: margin {m} is not finite")
        out.append(item.with_values(**{MARGIN: (m, m)}))
    return out


def build_reward_model(cfg: RewardModelConfig, mesh: Any = None) -> tuple[RewardModel, Any, Any]:
    """(the reward model a run starts from, its tokenizer, the filter of what trains): the backbone with its
    adapters (`build_model`), and the scalar head drawn from seed train.seed + 2, so a run's starting head is a
    function of its config (a peer trainer can be started from the same one: bench/learning_trl.py)."""
    backbone, tokenizer, trainable = build_model(cfg, mesh)
    model = RewardModel(backbone, rngs=nnx.Rngs(cfg.train.seed + 2), head_init_std=cfg.reward.head_init_std)
    if cfg.lora is not None:
        # The head starts random, so it always trains, adapters or not.
        trainable = nnx.Any(trainable, nnx.PathContains("score"))
    return model, tokenizer, trainable


def prepare(cfg: RewardModelConfig, *, log: Callable[[str], None] | None = None) -> RewardRun:
    """Builds the reward model, data and `Trainer` of a run (no training step yet)."""
    say = log or (lambda text: print(text, file=sys.stderr))
    t = cfg.train
    mesh = t.mesh.build()
    model, tokenizer, trainable = build_reward_model(cfg, mesh)
    data = build_preference_data(cfg.data, tokenizer, seq_len=t.seq_len, seed=t.seed)
    report_data(data, t.run_dir, say)
    pairs = pairs_per_batch(t.batch_size)
    check_enough_pairs(data.train, pairs, cfg.data.path)
    train_items: list[Any] = list(data.train)
    eval_items: list[Any] = list(data.eval)
    if cfg.reward.margin_field:
        train_items = _with_margins(train_items, data.rows, cfg.reward.margin_field, "training row")
        if eval_items:
            d = cfg.data
            eval_rows = ({r.where: r.data for r in read_rows(d.eval_path, split=d.eval_split) if r.data is not None}
                         if d.eval_path is not None else data.rows)
            eval_items = _with_margins(eval_items, eval_rows, cfg.reward.margin_field, "held-out row")
    loader, eval_batches = pair_loaders(train_items, eval_items, pairs=pairs, seq_len=t.seq_len,
                                        pad_id=tokenizer.pad_id, seed=t.seed, shuffle=cfg.data.shuffle)
    loss_fn = RewardLoss(margin=cfg.reward.margin)
    # The backbone is the trunk; the scalar head reads hidden states: no vocabulary logits to plan for.
    trainer = make_trainer(cfg, Trainable(model, trunks=("backbone",), logit_positions=0), loss_fn,
                           algorithm="reward_model", trainable=trainable, mesh=mesh, log=say)
    del model  # the trainer holds the weights now
    # The trainer may have picked the micro-batch itself (auto_micro_batch); pairs must still stay whole.
    check_micro_batching(pairs, trainer.num_micro_batches)
    return RewardRun(trainer, loss_fn, loader, eval_batches, data, tokenizer)


def save_trained(run: RewardRun, folder: str, *, max_length: int) -> str:
    """Saves the trainer's current reward model (adapters merged into the backbone) to `folder`."""
    return save_reward_model(run.trainer.model, folder, tokenizer=run.tokenizer, extra={"max_length": max_length})


def main(cfg: RewardModelConfig, *, hooks: tuple = (), log: Callable[[str], None] | None = None) -> RunResult:
    """Trains per `cfg`, prints held-out accuracy before and after, and saves the reward model.

    Writes to run_dir: config.yaml, data_report.json, metrics.jsonl (`eval/*` every train.eval_every steps and
    at the end), checkpoints, eval_summary.json and reward_model/ (see `reward_model.save_reward_model`).
    `result.extras` holds `eval_before`, `eval_after`, `reward_model_dir`, `data_report` and `eval_data_report`;
    `result.model` is the trained `RewardModel`.
    """
    run = start_run(cfg, log=log)
    rm = prepare(cfg, log=run.say)
    result = run.train(rm.trainer, rm.train_batches, hooks=hooks, eval_batches=rm.eval_batches,
                       evaluate_before=cfg.eval.before)
    folder = None
    if cfg.reward.save:
        folder = save_trained(rm, cfg.reward.save_dir or run.path("reward_model"), max_length=cfg.train.seq_len)
        run.say(f"reward model saved to {folder}; score with: tempax score {folder} --input PAIRS.jsonl")
    run.report_held_out(result, title=f"held-out pairs ({len(rm.data.eval)}), reward model:",
                        extra={"eval_pairs": len(rm.data.eval), "reward_model_dir": folder})
    result.extras.update(reward_model_dir=folder, data_report=rm.data.report, eval_data_report=rm.data.eval_report)
    return result


__all__ = ["RewardModelConfig", "RewardRun", "RewardModelKnobsConfig", "build_reward_model", "main", "prepare",
           "save_trained"]
