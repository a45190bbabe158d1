"""`tempax recommend`: the decision matrix of post-training made executable.

What the data holds decides the method; how much data and memory there is decides full fine-tuning, LoRA or
QLoRA. Each training command that can be recommended says for which data in its record's `recommend` hook (a
`Recommender`, kept beside the algorithm), so this module holds no list of methods (`_choose` gives the matrix the
packaged hooks make). `recommend()` is a pure function of a `DataProfile`, a model config and a capacity, so tests
pin every decision; `write_recipe` writes a recipe that `tempax validate` accepts.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from tempax.algorithms.registry import algorithms, get, resolve
from tempax.configlib import dump_yaml, from_dict
from tempax.errors import ConfigError
from tempax.data.stats import DataProfile
from tempax.models.config import ModelConfig
from tempax.train import memory as mem

FULL_FT_MIN_TOKENS = 20_000_000  # below this many training tokens, LoRA is recommended even when full FT fits
QLORA_BYTES_PER_PARAM = mem.NF4_BYTES_PER_PARAM  # NF4 in blocks of 64 with a float32 scale per block
ADAPTATIONS = ("full", "lora", "qlora")
# The memory plan is an estimate within ~25% (tempax/train/memory.py): a setting is chosen only when its predicted
# peak leaves this share of the capacity free.
HEADROOM = 0.15


@dataclass(frozen=True)
class Recommendation:
    """The method, why, its main settings, the memory plan and the recipe as plain config data."""

    command: str  # the tempax command that runs the recipe: pretrain, sft, dpo, grpo
    method: str  # e.g. "SFT with LoRA (rank 16)"
    adaptation: str  # full, lora, qlora
    reasons: list[str]
    hyperparameters: dict[str, Any]
    peak_bytes: int
    capacity: int | None
    plan: mem.MemoryPlan
    recipe: dict[str, Any]
    alternatives: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.peak_bytes <= self.capacity * (1 - HEADROOM)

    def to_dict(self) -> dict[str, Any]:
        """The recommendation as JSON-able data (without the memory plan's breakdown and the recipe's data)."""
        return {"command": self.command, "method": self.method, "adaptation": self.adaptation,
                "reasons": self.reasons, "alternatives": self.alternatives, "warnings": self.warnings,
                "hyperparameters": self.hyperparameters, "peak_bytes": self.peak_bytes, "capacity": self.capacity}


def round_up(x: float, multiple: int) -> int:
    """`x` rounded up to a multiple of `multiple` (at least one multiple)."""
    return int(math.ceil(max(x, 1) / multiple) * multiple)


class Recommender:
    """One training command's side of `recommend`: whether it suits a dataset and the settings where it differs
    from the others. An algorithm's record names an instance in its `recommend` hook; the defaults are those of a
    method that trains on packed rows of text (SFT).

    Attributes:
      command: the training command it recommends.
      method: its name in the recommendation ("SFT", "DPO").
      fallback: it suits data no other method claims (it is chosen only when none does).
      unit: what one item of the batch is, in the memory line (" pairs", " prompts"; "" for rows).
      batch: items a step before the data or the memory shrinks it.
      rows_per_item: sequences one item puts through the model (a pair 2, a group of completions its size).
      learning_rates: adaptation ("full", "lora", "qlora") -> learning rate.
      loss_chunk_len: the loss's logit chunk, for the memory plan (None: the whole sequence at once).
      evaluates_loss: the recipe evaluates a held-out loss during training (`train.eval_every`).
    """

    command: str = ""
    method: str = ""
    fallback: bool = False
    unit: str = ""
    batch: int = 16
    rows_per_item: int = 1
    learning_rates: dict[str, float]
    loss_chunk_len: int | None = None
    evaluates_loss: bool = True

    def suits(self, profile: DataProfile) -> tuple[list[str], list[str]] | None:
        """(reasons, alternatives) when the method suits what `profile` holds, else None."""
        raise NotImplementedError

    def seq_len(self, profile: DataProfile, context: int) -> int:
        """The training sequence length for this data on a model of `context` positions."""
        raise NotImplementedError

    def items_per_epoch(self, profile: DataProfile, seq_len: int) -> float:
        """Batch items one pass over the data gives (a small dataset caps the batch at it)."""
        return profile.rows

    def extra_bytes(self, model: ModelConfig, adaptation: str, rows: int, seq_len: int) -> int:
        """Memory the train-step plan does not count (a frozen reference copy, a KV cache for sampling)."""
        return 0

    def schedule(self, profile: DataProfile, batch: int, seq_len: int) -> tuple[int, int]:
        """(epochs, optimizer steps) of the recipe."""
        raise NotImplementedError

    def sections(self, profile: DataProfile, adaptation: str) -> dict[str, Any]:
        """The recipe's sections besides `model`, `lora` and `train`: the data or task and the method's own."""
        raise NotImplementedError

    def hyperparameters(self, profile: DataProfile) -> dict[str, Any]:
        """The method's own settings the recommendation lists beside the common ones."""
        return {}


def size_of(profile: DataProfile) -> str:
    """The data's size in words, for a reason: rows and estimated tokens."""
    return f"{profile.rows:,} rows, ~{profile.total_tokens / 1e6:.1f}M tokens"


def data_section(profile: DataProfile, **settings: Any) -> dict[str, Any]:
    """A recipe's `data:` section for the profiled file: its path, its split when it has one, then `settings`."""
    return {"path": profile.path, **({"split": profile.split} if profile.split else {}), **settings}


def reference_copy_bytes(model: ModelConfig, adaptation: str) -> int:
    """A frozen float32 reference model kept beside the trained one under full fine-tuning (LoRA switches its
    adapters off for the reference instead, so it costs nothing)."""
    return model.num_params() * 4 if adaptation == "full" else 0


def recommenders() -> list[Recommender]:
    """The `Recommender` of every training command whose record has a `recommend` hook, in the registry's order."""
    return [hook for a in algorithms().values() if (hook := a.recommender()) is not None]


def _choose(profile: DataProfile) -> tuple[Recommender, list[str], list[str]]:
    """(the method, why, the alternatives): the first hook that claims the data, else the first fallback.

    The packaged hooks give

      raw text                                   -> continued pre-training (`tempax pretrain`)
      demonstrations (chat, prompt/completion)   -> supervised fine-tuning (`tempax sft`)
      question/answer rows with checkable        -> GRPO with a verifiable reward (`tempax grpo`); the model must
      answers (GSM8K's "#### <number>")             sometimes be right already, else SFT on the worked answers first
      question/answer rows without them          -> continued pre-training on question + answer text
      preference pairs                           -> DPO (`tempax dpo`); reward model + PPO is the alternative that
                                                    can keep improving past the fixed pairs, at twice the models

    The first hook (in the registry's order) that claims the data wins; a hook marked `fallback` (continued
    pre-training, which reads any text) wins only when no other claims it.
    """
    fallback = None
    for hook in recommenders():
        fit = hook.suits(profile)
        if fit is None:
            continue
        if not hook.fallback:
            return hook, *fit
        fallback = fallback or (hook, *fit)
    if fallback is None:
        raise ConfigError(f"no training command here suits {profile.kind} data ({profile.path})")
    return fallback


def lora_target_modules(model: ModelConfig, targets: tuple[str, ...] | None = None) -> list[str]:
    """The `lora.target_modules` a recommended recipe writes: `targets` (of `tempax.train.memory.lora_choices`), or
    for None LoRA's default targets (the attention and MLP projections; on a mixture of experts they adapt its
    routed experts too)."""
    if targets is not None:
        return list(targets)
    # Deferred: the model code loads when a recipe is recommended, not when an algorithm's hook imports this module.
    from tempax.models.lora import DEFAULT_TARGETS

    return list(DEFAULT_TARGETS)


def model_size(model: ModelConfig) -> str:
    """The model's size in words: "135M-parameter model", or for a mixture of experts its total and active
    parameters."""
    if model.moe is None:
        return f"{model.num_params() / 1e6:.0f}M-parameter model"
    active = model.num_params(active=True) / 1e6
    return (f"{model.num_params() / 1e6:.0f}M-parameter mixture of experts ({active:.0f}M active per token, "
            f"{model.moe.experts_per_token} of {model.moe.num_experts} experts)")


@dataclass(frozen=True)
class _Option:
    """One way to train the model: full fine-tuning, or LoRA / QLoRA on `targets` (None: LoRA's default targets;
    `what`: what they adapt, in words)."""

    adaptation: str
    targets: tuple[str, ...] | None = None
    what: str = ""

    def adapters(self, model: ModelConfig) -> mem.AdapterParams | None:
        return None if self.adaptation == "full" else mem.adapter_params(model, mem.LORA_RANK, self.targets)


def _options(model: ModelConfig, adaptations: tuple[str, ...]) -> list[_Option]:
    """The options to try, in order: for LoRA and then QLoRA each of `mem.lora_choices` (on a mixture of experts
    the routed experts' adapters first, then the attention projections' alone)."""
    out = []
    for adaptation in adaptations:
        choices = [(None, "")] if adaptation == "full" else mem.lora_choices(model)
        out += [_Option(adaptation, targets, what) for targets, what in choices]
    return out


def _plan_inputs(method: Recommender, model: ModelConfig, option: _Option, micro_rows: int, micro_batches: int,
                 seq_len: int, precision: str, remat: str) -> mem.PlanInputs:
    # With more than one micro-batch the step keeps a float32 gradient accumulator beside the gradients.
    p = mem.PlanInputs(model=model, micro_batch_size=micro_rows, num_micro_batches=micro_batches, seq_len=seq_len,
                       precision=precision, remat=remat, loss_chunk_len=method.loss_chunk_len)
    adapters = option.adapters(model)
    if adapters is None:
        return p
    return mem.with_adapters(p, adapters.total, base_bytes_per_param=QLORA_BYTES_PER_PARAM
                             if option.adaptation == "qlora" else None)


def _least(method: Recommender, model: ModelConfig, option: _Option, batch: int, seq_len: int,
           precision: str, capacity: int | None) -> tuple[mem.MemoryPlan, int]:
    """(plan, peak bytes) of `option` at its smallest: one item a micro-batch, full remat."""
    rows = method.rows_per_item
    plan = mem.plan_memory(_plan_inputs(method, model, option, rows, batch, seq_len, precision, "full"), capacity)
    return plan, plan.total + method.extra_bytes(model, option.adaptation, rows, seq_len)


def _fit(method: Recommender, model: ModelConfig, option: _Option, batch_rows: int, seq_len: int, precision: str,
         capacity: int | None) -> tuple[mem.MemoryPlan, int, int, str] | None:
    """(plan, peak bytes, micro-batch in items, remat) with the largest micro-batch and least remat that fit."""
    rows_per_item = method.rows_per_item
    adaptation = option.adaptation
    for remat in ("none", "dots", "full"):
        for micro in mem.micro_batch_candidates(batch_rows, 1):
            p = _plan_inputs(method, model, option, micro * rows_per_item, batch_rows // micro, seq_len, precision,
                             remat)
            plan = mem.plan_memory(p, capacity)
            peak = plan.total + method.extra_bytes(model, adaptation, micro * rows_per_item, seq_len)
            if capacity is None or peak <= capacity * (1 - HEADROOM):
                return plan, peak, micro, remat
    return None


def recommend(
    profile: DataProfile,
    model: ModelConfig,
    *,
    model_source: str,
    capacity: int | None,
    tokenizer_source: str | None = None,
    accelerator: bool = False,
    run_dir: str | None = None,
) -> Recommendation:
    """The method, adaptation, hyper-parameters and recipe for `profile` on `model` with `capacity` bytes.

    How much data and memory decide full fine-tuning vs LoRA vs QLoRA: full fine-tuning only pays when there is
    a lot of data (>= `FULL_FT_MIN_TOKENS` training tokens; below that LoRA matches it and overfits less, Hu et al.
    2021; Biderman et al. 2024, "LoRA Learns Less and Forgets Less") and the memory plan (`tempax.train.memory`)
    says it fits; then LoRA if it fits, then QLoRA (4-bit NF4 base, Dettmers et al. 2023). For each the largest
    micro-batch and the lightest activation recomputation that fit are chosen. A mixture of experts holds all its
    experts but computes with the k a token is routed to: its memory is that of its total parameters. Its LoRA
    adapts the attention projections and the routed experts (each expert its own A and B, `LoraExperts`: by far the
    most adapter parameters, `tempax.train.memory.adapter_params`) when that fits, else the attention projections
    alone; QLoRA, when the base does not fit at its own precision, stores the experts in 4 bits too and tries the
    same two target sets.
    """
    method, reasons, alternatives = _choose(profile)
    command = method.command
    warnings: list[str] = []
    precision = "bf16" if accelerator else "fp32"
    ctx = model.max_position_embeddings or 2048
    batch, seq_len = method.batch, method.seq_len(profile, ctx)

    # A small dataset cannot fill the default batch: cap it at the items one epoch gives, as a power of two.
    per_epoch = method.items_per_epoch(profile, seq_len)
    if per_epoch < batch:
        batch = 2 ** int(math.log2(max(per_epoch, 1)))
        warnings.append(f"little data: one epoch gives ~{int(per_epoch)} batch rows, so batch_size is {batch}")
    big_data = profile.total_tokens >= FULL_FT_MIN_TOKENS
    options = _options(model, ADAPTATIONS if big_data else ("lora", "qlora"))
    full = _Option("full")
    full_fit = _fit(method, model, full, batch, seq_len, precision, capacity)
    chosen = None
    for option in options:
        fit = full_fit if option.adaptation == "full" else _fit(method, model, option, batch, seq_len, precision,
                                                                capacity)
        if fit is not None:
            chosen = (option, fit)
            break
    gib = lambda b: f"{b / mem.GiB:.2f} GiB"  # noqa: E731
    cap = gib(capacity) if capacity else "unknown memory"
    params = model_size(model)
    if chosen is None:
        option = options[-1]  # QLoRA on the fewest adapters
        plan, peak = _least(method, model, option, batch, seq_len, precision, capacity)
        chosen = (option, (plan, peak, 1, "full"))
        warnings.append(f"nothing fits in {cap}: even QLoRA with micro-batch 1 and full remat needs ~{gib(peak)}; "
                        "use a machine with more memory, several devices (train.mesh.fsdp) or a shorter seq_len")
    option, (plan, peak, micro, remat) = chosen
    adaptation = option.adaptation
    if adaptation == "full":
        reasons.append(f"full fine-tuning: ~{profile.total_tokens / 1e6:.0f}M training tokens is enough data to use "
                       f"every weight, and the {params} fits ({gib(peak)} of {cap})")
    elif full_fit is None:
        lora_least = min(_least(method, model, o, batch, seq_len, precision, capacity)[1] for o in options
                         if o.adaptation == "lora")
        reasons.append(f"{'QLoRA' if adaptation == 'qlora' else 'LoRA'}: full fine-tuning of the "
                       f"{params} does not fit in {cap} (AdamW keeps ~16 bytes per parameter)"
                       + (f"; LoRA does not fit either (~{gib(lora_least)} at micro-batch 1 with full remat, over "
                          f"{1 - HEADROOM:.0%} of it), so the frozen base is stored in 4 bits" if adaptation == "qlora"
                          else f"; LoRA fits ({gib(peak)})"))
    else:
        reasons.append(f"LoRA rather than full fine-tuning: full would fit ({gib(full_fit[1])} of {cap}) but "
                       f"~{profile.total_tokens / 1e6:.1f}M tokens is little data (< {FULL_FT_MIN_TOKENS // 10**6}M): "
                       "LoRA matches full fine-tuning there, forgets less and needs a fraction of the memory")
    if micro < batch or remat != "none":
        reasons.append(f"memory: micro-batch {micro} of {batch}{method.unit} (gradient accumulation), remat {remat}, "
                       f"leaving {HEADROOM:.0%} of the memory free for the plan's error")
    targets = lora_target_modules(model, option.targets)
    adapters = option.adapters(model)
    if model.moe is not None and adapters is not None:
        reasons.append(_experts_reason(method, model, option, adapters, targets, batch, seq_len, precision, capacity))

    recipe, hparams = _recipe(method, profile, model_source, tokenizer_source, adaptation, batch, micro, remat,
                              seq_len, precision, run_dir or f"runs/recommended_{command}", targets)
    if adapters is not None:
        hparams.update(lora_target_modules=targets, adapter_params=adapters.total)
    name = method.method + {"full": " (full fine-tuning)", "lora": f" with LoRA (rank {mem.LORA_RANK})",
                            "qlora": f" with QLoRA (NF4 base, rank {mem.LORA_RANK})"}[adaptation]
    if model.moe is not None and option.targets == mem.ATTENTION_TARGETS:
        name += " on attention only"
    return Recommendation(command=command, method=name, adaptation=adaptation, reasons=reasons,
                          hyperparameters=hparams, peak_bytes=peak, capacity=capacity, plan=plan, recipe=recipe,
                          alternatives=alternatives, warnings=warnings)


def _experts_reason(method: Recommender, model: ModelConfig, option: _Option, adapters: mem.AdapterParams,
                    targets: list[str], batch: int, seq_len: int, precision: str, capacity: int | None) -> str:
    """Why a mixture of experts gets adapters on its routed experts or on its attention alone, with the adapter
    parameters of each."""
    gib = lambda b: f"{b / mem.GiB:.2f} GiB"  # noqa: E731
    line = (f"mixture of experts: the weights in memory are all the experts', though a token computes with the active "
            f"ones; LoRA on {option.what} ({', '.join(targets)}: {adapters.describe()}")
    if adapters.experts:
        line += f"; each of the {model.moe.num_experts} experts of a layer has its own A and B)"
    else:
        wider = _Option(option.adaptation, None)
        more = wider.adapters(model)
        _, least = _least(method, model, wider, batch, seq_len, precision, capacity)
        line += (f"), the experts frozen: {'QLoRA' if option.adaptation == 'qlora' else 'LoRA'} on the routed "
                 f"experts too ({more.describe()}, each with a float32 master, gradient and two Adam moments) would "
                 f"need ~{gib(least)} at micro-batch 1 with full remat, over {1 - HEADROOM:.0%} of "
                 f"{gib(capacity) if capacity else 'the memory'}")
    return line + ("; the frozen base, experts included, is stored in 4 bits" if option.adaptation == "qlora" else "")


def _recipe(method: Recommender, profile: DataProfile, source: str, tokenizer: str | None, adaptation: str,
            batch: int, micro: int, remat: str, seq_len: int, precision: str,
            run_dir: str, targets: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(recipe data, the main hyper-parameters); `targets`: the LoRA's target modules."""
    lr = method.learning_rates[adaptation]
    epochs, steps = method.schedule(profile, batch, seq_len)
    warmup = max(int(0.03 * steps), 1)
    recipe: dict[str, Any] = {"model": {"source": source, **({"tokenizer": tokenizer} if tokenizer else {})}}
    if adaptation != "full":
        lora: dict[str, Any] = {"rank": 16, "alpha": 32.0, "target_modules": list(targets)}
        if adaptation == "qlora":
            lora["quantize_base"] = "nf4"
        recipe["lora"] = lora
    elif getattr(get(method.command).config_class()(), "lora", None) is not None:
        recipe["lora"] = None  # the command trains adapters by default: full fine-tuning says so
    recipe.update(method.sections(profile, adaptation))
    train: dict[str, Any] = {
        "steps": steps, "batch_size": batch, "seq_len": seq_len, "precision": precision, "remat": remat,
        "run_dir": run_dir,
        "optimizer": {"learning_rate": lr, "schedule": "cosine", "warmup_steps": warmup,
                      "weight_decay": 0.0 if adaptation != "full" else 0.01},
        "checkpoint": {"every": max(steps // 4, 1), "keep": 2},
    }
    if micro < batch:
        train["micro_batch_size"] = micro
    if method.evaluates_loss:
        train["eval_every"] = max(steps // 4, 1)
    recipe["train"] = train
    hparams = {"learning_rate": lr, "epochs": epochs, "steps": steps, "batch_size": batch, "micro_batch_size": micro,
               "seq_len": seq_len, "precision": precision, "remat": remat}
    if adaptation != "full":
        hparams.update(lora_rank=16, lora_alpha=32)
    hparams.update(method.hyperparameters(profile))
    return recipe, hparams


def write_recipe(rec: Recommendation, path: str) -> str:
    """Writes the recipe with an opening comment (what it does, why, the command that runs it); checks that it
    builds as the command's config first. Returns the path."""
    cls, _ = resolve(rec.command)
    from_dict(cls, rec.recipe)  # every value typed and checked before anything is written
    text = dump_yaml(rec.recipe, command=rec.command)
    where = profile_path(rec)
    head = [f"# {rec.method} on {where}, chosen by the recommend command from what the data holds.",
            f"# Run:  tempax {rec.command} --config {path}"]
    head += [f"# Why: {r}" for r in rec.reasons]
    head += [f"# Predicted peak memory ~{rec.peak_bytes / mem.GiB:.2f} GiB per device"
             + (f" of {rec.capacity / mem.GiB:.2f} GiB." if rec.capacity else ".")]
    head += [f"# Alternative: {a}" for a in rec.alternatives]
    head += [f"# Warning: {w}" for w in rec.warnings]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(line if line.startswith("# Run:") else _wrap(line) for line in head) + "\n" + text)
    return path


def profile_path(rec: Recommendation) -> str:
    """The dataset a recipe trains on."""
    section = rec.recipe.get("data") or rec.recipe.get("task") or {}
    return str(section.get("path") or section.get("source"))


def _wrap(line: str, width: int = 118) -> str:
    """A long comment line folded into several `#` lines."""
    import textwrap

    return "\n".join(textwrap.wrap(line, width=width, subsequent_indent="#   ", break_on_hyphens=False))
