"""What every TRL side shares: TRL's optimiser settings and tempax's learning rate per update, tempax's visiting
order and initial adapters, and the child process that trains TRL's side of a row.

Functions that read tempax's config import tempax (and JAX) inside them; `train_trl` imports only torch,
transformers, peft and TRL, so the TRL child's process time is TRL's own.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable

# The two trainings of a row, each in its own folder OUT/ROW/SIDE.
SIDES = ("tempax", "trl")
# Where the prepared inputs and the starting weights of TRL's side are written (inside its side folder).
INPUTS_FILE = "trl_inputs.json"
INITIAL_ADAPTERS = "initial_adapters"
# A reward model's scalar head beside its adapters: `score.weight` [1, hidden], the name and layout of
# tempax.models.reward_model.HEAD_FILE and of transformers' *ForSequenceClassification `score` layer.
HEAD_FILE = "score.safetensors"


def trl_arguments(cfg: Any, per_batch: int, **extra: Any) -> dict[str, Any]:
    """TRL's config fields (transformers' `TrainingArguments`, which every TRL config extends) with tempax's
    optimisation settings (`cfg.train`): `per_batch` examples a step (pairs, rows or packed rows, whatever the
    trainer's dataset rows are), in tempax's order, AdamW with tempax's betas, epsilon, weight decay and clipping, the seed; the learning rate of each
    update comes from `lr_factors` (`train_trl` installs it)."""
    t, opt = cfg.train, cfg.train.optimizer
    if opt.name != "adamw" or opt.min_lr_ratio or opt.schedule not in ("cosine", "constant"):
        raise SystemExit("bench/learning_trl.py maps AdamW with a cosine schedule to 0, or a constant one, only")
    arguments = dict(
        per_device_train_batch_size=per_batch, gradient_accumulation_steps=1, max_steps=t.steps,
        # The peak rate; `train_trl` replaces transformers' scheduler with tempax's factor per update.
        learning_rate=opt.learning_rate, lr_scheduler_type="constant", weight_decay=opt.weight_decay,
        adam_beta1=opt.b1, adam_beta2=opt.b2, adam_epsilon=opt.eps, max_grad_norm=opt.grad_clip_norm or 0.0,
        seed=t.seed, data_seed=t.seed, train_sampling_strategy="sequential", report_to=[], logging_steps=1,
        save_strategy="no", use_cpu=True, dataloader_num_workers=0,
        # TRL's configs default to bf16 autocast; tempax's precision decides (fp32: float32 throughout; bf16:
        # bfloat16 matmuls over float32 master weights, which is what autocast does).
        bf16=t.precision == "bf16", fp16=False)
    arguments.update(extra)
    return arguments


def lr_factors(cfg: Any) -> list[float]:
    """tempax's learning rate of each update as a fraction of the peak (`tempax.train.optim.make_schedule`), which
    TRL's side follows step for step: transformers' own warm-up gives the first update a rate of 0 and runs one step
    behind tempax's through the warm-up, so its "cosine" is not the same schedule."""
    from tempax.train.optim import make_schedule

    schedule = make_schedule(cfg.train.optimizer, cfg.train.steps)
    return [float(schedule(k)) / cfg.train.optimizer.learning_rate for k in range(cfg.train.steps)]


def ordered(cfg: Any, items: list[Any], per_batch: int) -> list[Any]:
    """The pairs (or stacked unpaired items) in the order tempax's pair loader visits them over cfg.train.steps
    batches of `per_batch`."""
    from tempax.algorithms.preference.batches import annotated_pair_loader

    loader = annotated_pair_loader(items, batch_size=per_batch, seq_len=cfg.train.seq_len, pad_id=0,
                                   seed=cfg.train.seed, shuffle=cfg.data.shuffle)
    order: list[Any] = []
    epoch = 0
    while len(order) < cfg.train.steps * per_batch:
        visit = [items[i] for i in loader.epoch_order(epoch)]
        order.extend(visit[: len(visit) - len(visit) % per_batch])  # tempax drops a short final batch
        epoch += 1
    return order[: cfg.train.steps * per_batch]


def check_lora(cfg: Any) -> None:
    if cfg.lora is None or cfg.lora.dropout:
        raise SystemExit("bench/learning_trl.py compares LoRA runs without adapter dropout")


def initial_adapters(cfg: Any, out: str) -> str:
    """Writes the LoRA adapters tempax's run starts from (A drawn from seed train.seed + 1, B = 0), in PEFT layout,
    to OUT/initial_adapters, so TRL starts from the same adapter weights as well as the same base."""
    from tempax.algorithms.common import build_model
    from tempax.models.lora import save_adapters

    check_lora(cfg)
    model, _, _ = build_model(cfg)
    return save_adapters(model, os.path.join(out, INITIAL_ADAPTERS))


@dataclass(frozen=True)
class TrlSide:
    """TRL's side of a row: its trainer, the rows it trains on and its arguments (`rows(cfg, base)`, tempax's tokens
    in tempax's order), the starting weights written for it (`initial(cfg, out)`), and whether its model is a
    sequence classifier with tempax's scalar head (`score`) on top of the adapted backbone."""

    trainer: str  # TRL's trainer and config class prefix: "KTO" -> trl.KTOTrainer, trl.KTOConfig
    rows: Callable[[Any, str], tuple[list[dict], dict[str, Any]]]
    initial: Callable[[Any, str], str] = initial_adapters
    reward_head: bool = False
    # (trainer class, prepared inputs) -> (its subclass, extra constructor arguments): what a trainer needs beyond
    # rows in tempax's order (GRPO: tempax's prompt tokens and the reward functions). Runs in TRL's child.
    specialise: Callable[[type, dict[str, Any]], tuple[type, dict[str, Any]]] | None = None


def write_inputs(side: TrlSide, cfg: Any, base: str, out: str) -> None:
    """Writes what TRL's child trains on (tempax's tokens in tempax's order, its arguments, tempax's learning rate
    per update, tempax's initial weights) to `out`, so the TRL child imports no JAX and its budget is TRL's own."""
    rows, arguments = side.rows(cfg, base)
    os.makedirs(out, exist_ok=True)
    side.initial(cfg, out)
    with open(os.path.join(out, INPUTS_FILE), "w") as f:
        json.dump({"rows": rows, "arguments": arguments, "lr_factors": lr_factors(cfg)}, f)


def train_trl(side: TrlSide, base: str, out: str) -> None:
    """TRL's trainer on the prepared rows, in their order, from the prepared weights; writes its adapter (PEFT
    layout; a reward model's head beside it as `score.safetensors`) and its log history."""
    import datasets
    import peft
    import torch
    import transformers
    import trl
    from safetensors.torch import load_file, save_file

    trainer_cls, config_cls = getattr(trl, side.trainer + "Trainer"), getattr(trl, side.trainer + "Config")
    with open(os.path.join(out, INPUTS_FILE)) as f:
        inputs = json.load(f)
    factors = inputs["lr_factors"]

    class PreTokenised(trainer_cls):  # the rows are tempax's tokens already: no re-tokenising, re-pairing, packing
        def _prepare_dataset(self, dataset, *unused, **unused_kw):
            return dataset

        def create_scheduler(self, num_training_steps, optimizer=None):  # tempax's rate for each update
            if self.lr_scheduler is None:
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                    optimizer or self.optimizer, lambda k: factors[min(k, len(factors) - 1)])
            return self.lr_scheduler

    extra: dict[str, Any] = {}
    if side.specialise is not None:
        PreTokenised, extra = side.specialise(PreTokenised, inputs)
    start = os.path.join(out, INITIAL_ADAPTERS)
    if side.reward_head:
        model = transformers.AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, dtype="float32")
        with torch.no_grad():
            model.score.weight.copy_(load_file(os.path.join(start, HEAD_FILE))["score.weight"])
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype="float32")
    config = peft.PeftConfig.from_pretrained(start)
    if side.reward_head:
        # tempax's adapters say CAUSAL_LM; a plain PeftModel passes the classifier's inputs through unchanged (its
        # SEQ_CLS class would wrap `score` in a copy saved with the adapters, which tempax's loader refuses).
        config.task_type = None
    policy = peft.PeftModel.from_pretrained(model, start, config=config, is_trainable=True)
    if side.reward_head:  # PEFT freezes what is not an adapter; tempax trains the head beside the adapters
        policy.get_base_model().score.weight.requires_grad_(True)
    trainer = PreTokenised(model=policy, args=config_cls(output_dir=out, **inputs["arguments"]),
                           train_dataset=datasets.Dataset.from_list(inputs["rows"]),
                           processing_class=transformers.AutoTokenizer.from_pretrained(base), **extra)
    if side.reward_head:
        check_last_tokens(inputs["rows"], trainer.model.config.get_text_config().pad_token_id)
    trainer.train()
    adapters = os.path.join(out, "adapters")
    trainer.model.save_pretrained(adapters)
    if side.reward_head:
        head = policy.get_base_model().score.weight.detach().contiguous()
        save_file({"score.weight": head}, os.path.join(adapters, HEAD_FILE))
    with open(os.path.join(out, "log_history.json"), "w") as f:
        json.dump(trainer.state.log_history, f)


def check_last_tokens(rows: list[dict], pad_id: int | None) -> None:
    """transformers' sequence classifier reads the rightmost token that is not the pad id, tempax's reward model the
    last token of the sequence: the two agree only when no sequence ends with the pad id."""
    ending = [r for r in rows if pad_id is not None and pad_id in (r["chosen_ids"][-1], r["rejected_ids"][-1])]
    if ending:
        raise SystemExit(f"{len(ending)} pairs end with the pad id {pad_id}: transformers would score an earlier token "
                         "than tempax; the reward-model row cannot be held equal with this tokenizer")


def side_outcomes(outcomes: Callable[[Any, str, str | None], list], cfg: Any, base: str,
                  row_dir: str) -> dict[str, list]:
    """A row's per-item outcomes: `outcomes(cfg, base, adapters)` of the start (no adapters, "before") and of each
    side's final adapters (ROW/SIDE/adapters) that exist."""
    result: dict[str, list] = {"before": outcomes(cfg, base, None)}
    for side in SIDES:
        folder = os.path.join(row_dir, side, "adapters")
        if os.path.isdir(folder):
            result[side] = outcomes(cfg, base, folder)
    return result
