"""`tempax recommend`: the decision matrix of post-training made executable.

What the data holds decides the method:

  raw text                                   -> continued pre-training (`tempax pretrain`)
  demonstrations (chat, prompt/completion)   -> supervised fine-tuning (`tempax sft`)
  question/answer rows with checkable        -> GRPO with a verifiable reward (`tempax grpo`); the model must
  answers (GSM8K's "#### <number>")             sometimes be right already, else SFT on the worked answers first
  question/answer rows without them          -> continued pre-training on question + answer text
  preference pairs                           -> DPO (`tempax dpo`); reward model + PPO is the alternative that
                                                can keep improving past the fixed pairs, at twice the models

How much data and memory decide full fine-tuning vs LoRA vs QLoRA: full fine-tuning only pays when there is
a lot of data (>= `FULL_FT_MIN_TOKENS` training tokens; below that LoRA matches it and overfits less, Hu et al.
2021; Biderman et al. 2024, "LoRA Learns Less and Forgets Less") and the memory plan (`tempax.train.memory`)
says it fits; then LoRA if it fits, then QLoRA (4-bit NF4 base, Dettmers et al. 2023). For each the largest
micro-batch and the lightest activation recomputation that fit are chosen. `recommend()` is a pure function of a
`DataProfile`, a model config and a capacity, so tests pin every decision; `write_recipe` writes a recipe that
`tempax validate` accepts.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from tempax.algorithms.registry import resolve
from tempax.configlib import dump_yaml, from_dict
from tempax.data.stats import DataProfile
from tempax.models.config import ModelConfig
from tempax.train import memory as mem

FULL_FT_MIN_TOKENS = 20_000_000  # below this many training tokens, LoRA is recommended even when full FT fits
CHECKABLE_MIN_FRACTION = 0.9  # share of qa rows with a checkable answer for GRPO
QLORA_BYTES_PER_PARAM = 0.5625  # NF4 in blocks of 64 with a float32 scale per block
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


def _round_up(x: float, multiple: int) -> int:
    return int(math.ceil(max(x, 1) / multiple) * multiple)


def _method_of(profile: DataProfile) -> tuple[str, list[str], list[str]]:
    """(command, reasons, alternatives) from what the data holds."""
    n = f"{profile.rows:,} rows, ~{profile.total_tokens / 1e6:.1f}M tokens"
    if profile.kind == "preference":
        return "dpo", [
            f"the data holds preference pairs (chosen / rejected; {n}): learn from the comparison directly with "
            "DPO (Rafailov et al. 2023), which needs no reward model and no sampling",
        ], [
            "reward model + PPO: `tempax reward-model` on these pairs, then PPO against it; it can keep improving "
            "past the fixed pairs with fresh samples, but holds policy, reference, reward and value models and is "
            "far more expensive and fragile; this command writes the DPO recipe only",
            "other DPO-family losses on the same recipe: dpo.loss=ipo | hinge | orpo | simpo",
        ]
    if profile.kind == "qa" and profile.checkable_fraction >= CHECKABLE_MIN_FRACTION:
        return "grpo", [
            f"the data holds prompts with checkable answers ({profile.checkable_fraction:.0%} of {n} end in "
            "'#### <number>'): a verifiable reward (format + answer correctness) lets RL optimise what is "
            "measured, with GRPO (Shao et al. 2024) needing no value model or reward model",
            "GRPO learns only where some of a prompt's samples are right: a model that never solves a problem "
            "gets no signal; watch groups/zero_spread_frac",
        ], [
            "SFT on the worked answers first (a warm-start teaching the answer format, as `tempax demo` does), "
            "then GRPO from that checkpoint: needed when the base model almost never gets the format right",
        ]
    if profile.kind == "qa":
        return "pretrain", [
            f"question/answer rows without a checkable final answer ({n}): no verifiable reward, so train on "
            "question + answer text (continued pre-training on the joined fields)",
        ], ["convert the rows to prompt/completion and run SFT to train on the answers only"]
    if profile.kind in ("messages", "prompt_completion"):
        return "sft", [
            f"the data holds demonstrations ({profile.kind.replace('_', '/')}; {n}): supervised fine-tuning "
            f"on the assistant tokens ({profile.loss_token_share:.0%} of the tokens carry loss)",
        ], ["with preference pairs of the same domain, DPO after SFT"]
    return "pretrain", [
        f"the data is raw text ({n}): continued pre-training, every token trained, documents packed and long "
        "ones split",
    ], ["for a new domain vocabulary, `tempax tokenizer extend` first and pre-train the extended model"]


def _plan_inputs(command: str, model: ModelConfig, adaptation: str, micro_rows: int, seq_len: int,
                 precision: str, remat: str) -> mem.PlanInputs:
    trainable = None if adaptation == "full" else mem.lora_param_estimate(model, rank=16)
    return mem.PlanInputs(
        model=model, micro_batch_size=micro_rows, seq_len=seq_len, trainable_params=trainable, precision=precision,
        remat=remat, frozen_bytes_per_param=QLORA_BYTES_PER_PARAM if adaptation == "qlora" else None,
        loss_chunk_len=64 if command in ("sft", "pretrain") else None,
    )


def _extra_bytes(command: str, model: ModelConfig, adaptation: str, rows: int, seq_len: int) -> int:
    """Memory the train-step plan does not count: DPO/GRPO's frozen reference copy under full fine-tuning (LoRA
    switches its adapters off instead) and GRPO's KV cache for sampling (float32 K and V per layer)."""
    extra = 0
    if command in ("dpo", "grpo") and adaptation == "full":
        extra += model.num_params() * 4
    if command == "grpo":
        extra += 2 * model.num_layers * model.num_kv_heads * model.head_dim * rows * seq_len * 4
    return extra


def _fit(command: str, model: ModelConfig, adaptation: str, batch_rows: int, seq_len: int, precision: str,
         capacity: int | None, rows_per_item: int) -> tuple[mem.MemoryPlan, int, int, str] | None:
    """(plan, peak bytes, micro-batch in items, remat) with the largest micro-batch and least remat that fit."""
    for remat in ("none", "dots", "full"):
        for micro in mem.micro_batch_candidates(batch_rows, 1):
            p = _plan_inputs(command, model, adaptation, micro * rows_per_item, seq_len, precision, remat)
            plan = mem.plan_memory(p, capacity)
            peak = plan.total + _extra_bytes(command, model, adaptation, micro * rows_per_item, seq_len)
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
    """The method, adaptation, hyper-parameters and recipe for `profile` on `model` with `capacity` bytes."""
    command, reasons, alternatives = _method_of(profile)
    warnings: list[str] = []
    precision = "bf16" if accelerator else "fp32"
    ctx = model.max_position_embeddings or 2048
    if command == "grpo":
        batch, group = 4, 8
        rows_per_item = group
        completion = _round_up(min(profile.p95_tokens, 1024) * 0.75, 64)
        # The task's prompt adds a system turn on the answer format (~100 tokens) to the question.
        prompt_len = _round_up(min(profile.p95_tokens, 1024) * 0.5 + 128, 64)
        seq_len = min(prompt_len + completion, ctx)
    elif command == "dpo":
        batch, rows_per_item = 8, 2
        seq_len = min(_round_up(profile.p95_tokens, 128), 2048, ctx)
    else:
        batch, rows_per_item = 16, 1
        base = profile.p95_tokens if command == "sft" else 1024
        seq_len = min(_round_up(max(base, 256), 128), 2048, ctx)

    # A small dataset cannot fill the default batch: cap it at the rows one epoch gives (packed rows for
    # SFT / pre-training, at a conservative 80% packing; pairs or prompts otherwise), as a power of two.
    per_epoch = (profile.total_tokens * 0.8 / seq_len if command in ("sft", "pretrain")
                 else profile.rows * (0.98 if command == "dpo" else 1.0))
    if per_epoch < batch:
        batch = 2 ** int(math.log2(max(per_epoch, 1)))
        warnings.append(f"little data: one epoch gives ~{int(per_epoch)} batch rows, so batch_size is {batch}")
    big_data = profile.total_tokens >= FULL_FT_MIN_TOKENS
    order = ADAPTATIONS if big_data else ("lora", "qlora")
    chosen = None
    full_fit = _fit(command, model, "full", batch, seq_len, precision, capacity, rows_per_item)
    for adaptation in order:
        fit = full_fit if adaptation == "full" else _fit(command, model, adaptation, batch, seq_len, precision,
                                                         capacity, rows_per_item)
        if fit is not None:
            chosen = (adaptation, fit)
            break
    gib = lambda b: f"{b / mem.GiB:.2f} GiB"  # noqa: E731
    cap = gib(capacity) if capacity else "unknown memory"
    params = f"{model.num_params() / 1e6:.0f}M-parameter model"
    if chosen is None:
        plan = mem.plan_memory(_plan_inputs(command, model, "qlora", rows_per_item, seq_len, precision, "full"),
                               capacity)
        peak = plan.total + _extra_bytes(command, model, "qlora", rows_per_item, seq_len)
        chosen = ("qlora", (plan, peak, 1, "full"))
        warnings.append(f"nothing fits in {cap}: even QLoRA with micro-batch 1 and full remat needs ~{gib(peak)}; "
                        "use a machine with more memory, several devices (train.mesh.fsdp) or a shorter seq_len")
    adaptation, (plan, peak, micro, remat) = chosen
    if adaptation == "full":
        reasons.append(f"full fine-tuning: ~{profile.total_tokens / 1e6:.0f}M training tokens is enough data to use "
                       f"every weight, and the {params} fits ({gib(peak)} of {cap})")
    elif full_fit is None:
        reasons.append(f"{'QLoRA' if adaptation == 'qlora' else 'LoRA'}: full fine-tuning of the "
                       f"{params} does not fit in {cap} (AdamW keeps ~16 bytes per parameter)"
                       + ("; LoRA does not fit either, so the frozen base is stored in 4 bits" if adaptation == "qlora"
                          else f"; LoRA fits ({gib(peak)})"))
    else:
        reasons.append(f"LoRA rather than full fine-tuning: full would fit ({gib(full_fit[1])} of {cap}) but "
                       f"~{profile.total_tokens / 1e6:.1f}M tokens is little data (< {FULL_FT_MIN_TOKENS // 10**6}M): "
                       "LoRA matches full fine-tuning there, forgets less and needs a fraction of the memory")
    if micro < batch or remat != "none":
        unit = " prompts" if command == "grpo" else " pairs" if command == "dpo" else ""
        reasons.append(f"memory: micro-batch {micro} of {batch}{unit} (gradient accumulation), remat {remat}, "
                       f"leaving {HEADROOM:.0%} of the memory free for the plan's error")

    recipe, hparams = _recipe(command, profile, model_source, tokenizer_source, adaptation, batch, micro, remat,
                              seq_len, precision, run_dir or f"runs/recommended_{command}")
    if command == "grpo":
        recipe["grpo"].update(group_size=group, max_prompt_len=prompt_len, max_new_tokens=completion)
        hparams.update(group_size=group, max_prompt_len=prompt_len, max_new_tokens=completion, beta=0.04)
    method = {"pretrain": "continued pre-training", "sft": "SFT", "dpo": "DPO", "grpo": "GRPO"}[command]
    method += {"full": " (full fine-tuning)", "lora": " with LoRA (rank 16)",
               "qlora": " with QLoRA (NF4 base, rank 16)"}[adaptation]
    return Recommendation(command=command, method=method, adaptation=adaptation, reasons=reasons,
                          hyperparameters=hparams, peak_bytes=peak, capacity=capacity, plan=plan, recipe=recipe,
                          alternatives=alternatives, warnings=warnings)


def _recipe(command: str, profile: DataProfile, source: str, tokenizer: str | None, adaptation: str, batch: int,
            micro: int, remat: str, seq_len: int, precision: str,
            run_dir: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(recipe data, the main hyper-parameters)."""
    lr = {("pretrain", "full"): 2e-5, ("sft", "full"): 2e-5, ("dpo", "full"): 5e-7, ("grpo", "full"): 1e-6}.get(
        (command, adaptation), {"pretrain": 2e-4, "sft": 2e-4, "dpo": 5e-5, "grpo": 5e-5}[command])
    if command in ("sft", "pretrain"):
        epochs = 1 if command == "pretrain" or profile.total_tokens >= 5_000_000 else 2
        steps = max(math.ceil(epochs * profile.total_tokens / (batch * seq_len * 0.9)), 1)
    elif command == "dpo":
        epochs = 1
        steps = max(math.ceil(profile.rows / batch), 1)
    else:
        epochs = 1
        steps = max(min(math.ceil(profile.rows / batch), 500), 1)
    warmup = max(int(0.03 * steps), 1)
    recipe: dict[str, Any] = {"model": {"source": source, **({"tokenizer": tokenizer} if tokenizer else {})}}
    if adaptation != "full":
        lora: dict[str, Any] = {"rank": 16, "alpha": 32.0,
                                "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                   "down_proj"]}
        if adaptation == "qlora":
            lora["quantize_base"] = "nf4"
        recipe["lora"] = lora
    elif command == "grpo":
        recipe["lora"] = None
    path = profile.path
    if command == "grpo":
        folder = path if os.path.isdir(path) else os.path.dirname(path)
        has_test = os.path.isfile(os.path.join(folder, "test.jsonl"))
        recipe["task"] = {"name": "gsm8k", "source": folder if has_test else path}
        recipe["grpo"] = {"beta": 0.04, "temperature": 1.0}  # lengths and group size: set by `recommend`
        recipe["eval"] = {"num_problems": 200 if has_test else 0}
    elif command == "dpo":
        # Held-out pairs: the folder's test split when it has one, else 2% of the rows (never the default
        # eval_path, which is HH-RLHF's test file whatever the data).
        held = ({"eval_path": path, "eval_split": "test"} if profile.split and _has_split(path, "test")
                else {"eval_path": None, "eval_fraction": 0.02})
        recipe["data"] = {"path": path, **({"split": profile.split} if profile.split else {}), **held,
                          "max_eval_rows": 200, "overlong": "truncate"}
        recipe["dpo"] = {"loss": "sigmoid", "beta": 0.1,
                         "reference": "adapters_off" if adaptation != "full" else "batch"}
    else:
        data: dict[str, Any] = {"path": path, **({"split": profile.split} if profile.split else {}),
                                "eval_fraction": 0.02}
        if command == "pretrain":
            data.update(format="text", train_on="all", overlong="split")
            if profile.kind == "qa":
                data["text_fields"] = ["question", "answer"]
        else:
            data["train_on"] = "assistant"
        recipe["data"] = data
    train: dict[str, Any] = {
        "steps": steps, "batch_size": batch, "seq_len": seq_len, "precision": precision, "remat": remat,
        "run_dir": run_dir,
        "optimizer": {"learning_rate": lr, "schedule": "cosine", "warmup_steps": warmup,
                      "weight_decay": 0.0 if adaptation != "full" else 0.01},
        "checkpoint": {"every": max(steps // 4, 1), "keep": 2},
    }
    if micro < batch:
        train["micro_batch_size"] = micro
    if command in ("sft", "pretrain", "dpo"):
        train["eval_every"] = max(steps // 4, 1)
    recipe["train"] = train
    hparams = {"learning_rate": lr, "epochs": epochs, "steps": steps, "batch_size": batch, "micro_batch_size": micro,
               "seq_len": seq_len, "precision": precision, "remat": remat}
    if adaptation != "full":
        hparams.update(lora_rank=16, lora_alpha=32)
    if command == "dpo":
        hparams.update(beta=0.1, loss="sigmoid")
    return recipe, hparams


def _has_split(folder: str, split: str) -> bool:
    return os.path.isdir(folder) and any(n.split(".", 1)[0] == split for n in os.listdir(folder))


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
