"""`tempax grpo --config RECIPE.yaml`: GRPO (and variants) with verifiable rewards, from a `GRPOConfig`.

    cfg = load_config(GRPOConfig, "recipes/grpo_gsm8k_smollm2.yaml", ["train.steps=20"])
    result = main(cfg)

`main` builds the model (LoRA/QLoRA when configured), the task's prompts, the reward functions, the trainer and the
rollout source (`GRPOSource`), trains with `Trainer.fit`; evaluates on the held-out split before and after training (answer accuracy, format accuracy,
pass@k; greedy and sampled); and writes config.yaml, metrics.jsonl / TensorBoard, checkpoints, eval.json and
the adapters (PEFT layout) into `train.run_dir`.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from flax import nnx

from tempax.algorithms.grpo.config import EvalSpec, GRPOConfig, RewardSpec, TaskSpec
from tempax.algorithms.grpo.rollout import PromptSampler, encode_prompts, round_up
from tempax.algorithms.grpo.source import GRPOSource, grpo_hooks, make_grpo_trainer
from tempax.train.loop import TrainResult
from tempax.errors import ConfigError

__all__ = ["GRPOConfig", "GRPORun", "build_rewards", "load_task", "main", "PLOT_METRICS"]

# The curves worth plotting (`tempax plot RUN_DIR --metrics ...`; the demo draws them).
PLOT_METRICS = (
    "reward/total_mean", "reward/correctness_mean", "reward/format_mean", "groups/zero_spread_frac", "entropy",
    "kl", "completion/length_mean", "clip_frac", "perf/step_s",
)


def length_reward(prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
    """Characters / 100: the benchmark's trivial reward (bench/grpo_step.py); not a training objective."""
    del prompts, columns
    return [len(c) / 100.0 for c in completions]


def _builtin_rewards() -> dict[str, Callable[..., Any]]:
    from tempax.rewards import answer_correctness_reward, format_reward

    return {"format": format_reward, "correctness": answer_correctness_reward, "length": length_reward}


def build_rewards(spec: RewardSpec) -> Any:
    """A `CombinedReward` of the named functions (built-in names or 'package.module:function')."""
    from tempax.rewards import combine_rewards

    builtins = _builtin_rewards()
    named: dict[str, Callable[..., Any]] = {}
    for name in spec.functions:
        if name in builtins:
            named[name] = builtins[name]
            continue
        if ":" not in name:
            raise ConfigError(
                f"rewards.functions: unknown reward {name!r}; use one of {sorted(builtins)} or 'package.module:function'"
            )
        module_name, fn_name = name.split(":", 1)
        try:
            fn = getattr(importlib.import_module(module_name), fn_name)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"rewards.functions: cannot import {name!r} ({e})") from None
        named[fn_name.removesuffix("_reward") or fn_name] = fn
    return combine_rewards(named, spec.weights, timeout_s=spec.timeout_s)


def load_task(spec: TaskSpec, *, eval_problems: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, held-out rows) of the task."""
    from tempax.data.tasks import generate_arithmetic, load_gsm8k

    if spec.name == "arithmetic":
        train = generate_arithmetic(spec.num_train_problems, split="train", seed=spec.seed, config=spec.arithmetic)
        held = generate_arithmetic(eval_problems, split="test", seed=spec.seed, config=spec.arithmetic) \
            if eval_problems else []
    else:
        train = list(load_gsm8k(spec.train_split, spec.source, limit=spec.max_train_rows))
        held = list(load_gsm8k(spec.eval_split, spec.source, limit=eval_problems)) if eval_problems else []
    if spec.max_train_rows is not None:
        train = train[: spec.max_train_rows]
    return train, held


def eval_options(spec: EvalSpec, default_max_new_tokens: int, seed: int = 0) -> Any:
    from tempax.eval.evaluate import EvalOptions

    return EvalOptions(
        max_new_tokens=spec.max_new_tokens or default_max_new_tokens, greedy=spec.greedy,
        num_samples=spec.num_samples, temperature=spec.temperature, ks=spec.ks if spec.num_samples else (1,),
        batch_size=spec.batch_size, seed=seed,
    )


@dataclass
class GRPORun:
    """What `main` returns: the training result, evaluations, the rollout source and the trained policy."""

    result: TrainResult
    source: GRPOSource
    policy: Any
    before: Any = None
    after: Any = None
    files: dict[str, str] = field(default_factory=dict)


def build_policy(cfg: GRPOConfig, mesh: Any = None) -> tuple[nnx.Module, Any, Any]:
    """(model, tokenizer, trainable filter) with LoRA/QLoRA applied when configured."""
    model, tokenizer = cfg.model.build(seed=cfg.train.seed, mesh=mesh)
    if tokenizer is None:
        raise ConfigError(f"model.source={cfg.model.source} has no tokenizer; set model.tokenizer")
    trainable: Any = nnx.Param
    if cfg.lora is not None:
        from tempax.models.lora import apply_lora, lora_filter

        model = apply_lora(model, cfg.lora, rngs=nnx.Rngs(cfg.train.seed + 1))
        trainable = lora_filter
    return model, tokenizer, trainable


def main(cfg: GRPOConfig, *, hooks: tuple = (), log: Callable[[str], None] | None = None) -> GRPORun:
    """Trains per `cfg` (see the module docstring)."""
    from tempax.configlib import dump_yaml
    from tempax.eval.evaluate import evaluate, format_table

    say = log or (lambda text: print(text, file=sys.stderr))
    run_dir = cfg.train.run_dir
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.yaml"), "w") as f:
        f.write(dump_yaml(cfg))
    mesh = cfg.train.mesh.build()
    model, tokenizer, trainable = build_policy(cfg, mesh)
    train_rows, held_rows = load_task(cfg.task, eval_problems=cfg.eval.num_problems)
    prompts, dropped = encode_prompts(tokenizer, train_rows, max_prompt_len=cfg.grpo.max_prompt_len)
    say(f"task {cfg.task.name}: {len(prompts)} training prompts ({dropped} longer than "
        f"grpo.max_prompt_len={cfg.grpo.max_prompt_len} dropped), {len(held_rows)} held-out problems")
    prompt_len = min(round_up(max(len(p.ids) for p in prompts), 8), cfg.grpo.max_prompt_len)
    reward_fn = build_rewards(cfg.rewards)
    options = eval_options(cfg.eval, cfg.grpo.max_new_tokens, seed=cfg.train.seed)
    before = after = None
    if held_rows and cfg.eval.before:
        before = evaluate(model, tokenizer, held_rows, options)
        say(f"before training: {before.summary_line()}")
    source = GRPOSource(tokenizer, PromptSampler(prompts, seed=cfg.train.seed), reward_fn, cfg.grpo,
                        prompt_len=prompt_len, reference=model if cfg.lora is None else None)
    trainer = make_grpo_trainer(model, cfg.grpo, cfg.train, prompt_len=prompt_len, trainable=trainable, mesh=mesh,
                                log=say, checkpoint_meta={"model_source": cfg.model.source}, guard=cfg.guard)
    del model  # the trainer holds the weights now
    try:
        result = trainer.fit(source, hooks=[*grpo_hooks(source, cfg.grpo, cfg.guard), *hooks])
    finally:
        trainer.close()
    policy = trainer.model
    run = GRPORun(result=result, source=source, policy=policy, before=before)
    if held_rows and cfg.eval.after:
        from tempax.models.lora import merge_lora

        # Adapters folded in: the same function, without the extra adapter matmuls per generated token.
        after = evaluate(merge_lora(policy) if cfg.lora is not None else policy, tokenizer, held_rows, options)
        run.after = after
        say(f"after training: {after.summary_line()}")
    stages = [(name, r) for name, r in (("before", before), ("after", after)) if r is not None]
    if stages:
        table = format_table(stages)
        say("\n" + table)
        path = os.path.join(run_dir, "eval.json")
        with open(path, "w") as f:
            json.dump({name: r.to_dict() for name, r in stages}, f, indent=2)
        run.files["eval"] = path
        _log_evals(run_dir, cfg, stages, result)
    if cfg.lora is not None:
        from tempax.models.lora import save_adapters

        run.files["adapters"] = save_adapters(policy, os.path.join(run_dir, "adapters"),
                                              base_model_name_or_path=cfg.model.source)
    say(f"done: run dir {run_dir} (curves: tempax plot {run_dir} --metrics {','.join(PLOT_METRICS[:4])})")
    return run


def _log_evals(run_dir: str, cfg: GRPOConfig, stages: list[tuple[str, Any]], result: TrainResult) -> None:
    from tempax.train.metrics import MetricsWriter

    writer = MetricsWriter(run_dir, tensorboard=cfg.train.tensorboard)
    try:
        last = result.history[-1][0] if result.history else 0
        for name, r in stages:
            writer.write(0 if name == "before" else last, r.metrics("eval/"))
    finally:
        writer.close()
