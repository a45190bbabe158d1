"""`tempax grpo --config RECIPE.yaml`: GRPO (and variants) with verifiable rewards, from a `GRPOConfig`.

    cfg = load_config(GRPOConfig, "recipes/grpo_gsm8k_smollm2.yaml", ["train.steps=20"])
    result = main(cfg)

`main` builds the model (LoRA/QLoRA when configured), the task's prompts, the reward functions, the trainer and the
rollout source (`GRPOSource`), trains with `Trainer.fit`; evaluates on the held-out split before and after training (answer accuracy, format accuracy,
pass@k; greedy and sampled); and writes config.yaml, metrics.jsonl / TensorBoard, checkpoints, eval.json and
the adapters (PEFT layout) into `train.run_dir`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


from tempax.algorithms.common import build_model
from tempax.algorithms.grpo.config import GRPOConfig
from tempax.data.tasks.spec import load_task
from tempax.eval.spec import eval_options
from tempax.rewards.registry import build_rewards
from tempax.rl.rollout import PromptSampler, encode_prompts, round_up
from tempax.rl.workers import require_ray
from tempax.algorithms.grpo.source import GRPOSource, grpo_hooks, make_grpo_trainer
from tempax.algorithms.run import start_run
from tempax.train.loop import TrainResult
from tempax.errors import ConfigError

__all__ = ["GRPOConfig", "GRPORun", "load_task", "main", "PLOT_METRICS"]

# The curves worth plotting (`tempax plot RUN_DIR --metrics ...`; the demo draws them).
PLOT_METRICS = (
    "reward/total_mean", "reward/correctness_mean", "reward/format_mean", "groups/zero_spread_frac", "entropy",
    "kl", "completion/length_mean", "clip_frac", "perf/step_s",
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


def main(
    cfg: GRPOConfig,
    *,
    hooks: tuple = (),
    log: Callable[[str], None] | None = None,
    model: Any = None,
    tokenizer: Any = None,
) -> GRPORun:
    """Trains per `cfg` (see the module docstring). `model` / `tokenizer`: an already built starting policy (LoRA
    adapters, when `cfg.lora` is set, are applied here; the model given is the reference) instead of loading
    `cfg.model` (`tempax demo` passes its SFT model)."""
    from tempax.eval.evaluate import evaluate, format_table

    if cfg.grpo.workers:
        require_ray()  # before anything is loaded: the install hint, not a failure minutes later
    run = start_run(cfg, log=log)
    say = run.say
    mesh = cfg.train.mesh.build()
    if model is None:
        model, built_tokenizer = cfg.model.build(seed=cfg.train.seed, mesh=mesh)
        tokenizer = tokenizer or built_tokenizer
    if tokenizer is None:
        raise ConfigError(f"model.source={cfg.model.source} has no tokenizer; set model.tokenizer")
    train_rows, held_rows = load_task(cfg.task, eval_problems=cfg.eval.num_problems)
    prompts, dropped = encode_prompts(tokenizer, train_rows, max_prompt_len=cfg.grpo.max_prompt_len)
    say(f"task {cfg.task.name}: {len(prompts)} training prompts ({dropped} longer than "
        f"grpo.max_prompt_len={cfg.grpo.max_prompt_len} dropped), {len(held_rows)} held-out problems")
    prompt_len = min(round_up(max(len(p.ids) for p in prompts), 8), cfg.grpo.max_prompt_len)
    reward_fn = build_rewards(cfg.rewards)
    options = eval_options(cfg.eval, cfg.grpo.max_new_tokens, seed=cfg.train.seed)
    before = after = None
    if held_rows and cfg.eval.before:
        # Before the (zero-initialised) adapters go on.
        before = evaluate(model, tokenizer, held_rows, options, label="eval before")
        say(f"before training: {before.summary_line()}")
    model, tokenizer, trainable = build_model(cfg, mesh, model=model, tokenizer=tokenizer)
    source = GRPOSource(tokenizer, PromptSampler(prompts, seed=cfg.train.seed), reward_fn, cfg.grpo,
                        prompt_len=prompt_len, reference=model if cfg.lora is None else None, ray=cfg.ray)
    trainer = make_grpo_trainer(model, cfg.grpo, cfg.train, prompt_len=prompt_len, trainable=trainable, mesh=mesh,
                                log=say, checkpoint_meta={"model_source": cfg.model.source}, guard=cfg.guard)
    del model  # the trainer holds the weights now
    try:
        result = run.train(trainer, source, hooks=[*grpo_hooks(source, cfg.grpo, cfg.guard), *hooks])
    finally:
        source.close()  # the rollout workers, when grpo.workers > 0
    policy = trainer.model
    grpo_run = GRPORun(result=result, source=source, policy=policy, before=before, files=run.files)
    if held_rows and cfg.eval.after:
        from tempax.models.lora import merge_lora

        # Adapters folded in: the same function, without the extra adapter matmuls per generated token.
        after = evaluate(merge_lora(policy) if cfg.lora is not None else policy, tokenizer, held_rows, options,
                         label="eval after")
        grpo_run.after = after
        say(f"after training: {after.summary_line()}")
    stages = [(name, r) for name, r in (("before", before), ("after", after)) if r is not None]
    if stages:
        last = result.history[-1][0] if result.history else 0
        run.report_stages(stages, table=format_table(stages), file="eval.json", steps={"before": 0, "after": last})
    if cfg.lora is not None:
        from tempax.models.lora import save_adapters

        run.files["adapters"] = save_adapters(policy, run.path("adapters"), base_model_name_or_path=cfg.model.source)
    if result.stop_reason:
        say(f"stopped early: {result.stop_reason}")
    return grpo_run
