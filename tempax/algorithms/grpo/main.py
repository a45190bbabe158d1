"""`tempax grpo --config RECIPE.yaml`: GRPO (and variants) with verifiable rewards, from a `GRPOConfig`.

    cfg = load_config(GRPOConfig, "recipes/grpo_gsm8k_smollm2.yaml", ["train.steps=20"])
    result = main(cfg)

`main` reads top to bottom: it starts the run (`tempax.algorithms.run.start_run`); builds the starting policy and
the run's plan (`GRPOPlan`: what the recipe settles, the environment and the episode budget among it, derived once
and passed down as values), the task's prompts, the reward functions, the rollout source (`GRPOSource`), the loss
and the trainer; evaluates
the starting policy on the held-out split (answer accuracy, format accuracy, pass@k; greedy and sampled); trains
with `Trainer.fit` (`Run.train`); and finishes with the evaluation after training (`finish_policy`). It writes
config.yaml, metrics.jsonl / TensorBoard, checkpoints, eval.json and the adapters (PEFT layout) into
`train.run_dir`.
"""

from __future__ import annotations

from typing import Any, Callable

from tempax.algorithms.common import base_model, build_model
from tempax.algorithms.episode_eval import episode_evaluation
from tempax.algorithms.grpo.config import GRPOConfig
from tempax.algorithms.grpo.plan import GRPOPlan
from tempax.algorithms.grpo.source import GRPOSource, grpo_hooks, grpo_loss, grpo_trainable
from tempax.algorithms.run import RunResult, evaluate_before, finish_policy, make_trainer, start_run, task_prompts
from tempax.data.tasks.spec import load_task
from tempax.eval.spec import eval_options
from tempax.rewards.registry import build_rewards
from tempax.rl.rollout import PromptSampler, round_up
from tempax.rl.workers import require_ray

__all__ = ["GRPOConfig", "GRPOPlan", "RunResult", "load_task", "main", "PLOT_METRICS"]

# The curves worth plotting (`tempax plot RUN_DIR --metrics ...`; the demo draws them).
PLOT_METRICS = (
    "reward/total_mean", "reward/correctness_mean", "reward/format_mean", "groups/zero_spread_frac", "entropy",
    "kl", "completion/length_mean", "clip_frac", "perf/step_s",
)


def main(
    cfg: GRPOConfig,
    *,
    hooks: tuple = (),
    log: Callable[[str], None] | None = None,
    model: Any = None,
    tokenizer: Any = None,
) -> RunResult:
    """Trains per `cfg` (see the module docstring). `model` / `tokenizer`: an already built starting policy (LoRA
    adapters, when `cfg.lora` is set, are applied here; the model given is the reference) instead of loading
    `cfg.model` (`tempax demo` passes its SFT model)."""
    s = cfg.grpo
    if s.workers:
        require_ray()  # before anything is loaded: the install hint, not a failure minutes later
    run = start_run(cfg, log=log)
    base, tok = base_model(cfg, run.mesh, model=model, tokenizer=tokenizer)
    plan = GRPOPlan.build(s, cfg.env, tok)
    prompts, held_rows = task_prompts(run, tok, max_prompt_len=s.max_prompt_len, section="grpo",
                                      env_factory=plan.env_factory)
    prompt_len = min(round_up(max(len(p.ids) for p in prompts), 8), s.max_prompt_len)
    reward_fn = build_rewards(cfg.rewards) if cfg.rewards.functions else None
    options = eval_options(cfg.eval, s.max_new_tokens, seed=cfg.train.seed)
    evaluate_fn = episode_evaluation(plan.env_factory, plan.rollout.max_turns, plan.rollout.episode_tokens, run.say)
    # The starting policy is evaluated before its (zero-initialised) adapters go on.
    before = evaluate_before(run, base, tok, held_rows, options, evaluate_fn=evaluate_fn)
    policy, tok, trainable = build_model(cfg, run.mesh, model=base, tokenizer=tok)
    source = GRPOSource(tok, PromptSampler(prompts, seed=cfg.train.seed), reward_fn, plan, prompt_len=prompt_len,
                        reference=policy if cfg.lora is None else None, ray=cfg.ray)
    trainer = make_trainer(cfg, grpo_trainable(policy, plan, prompt_len=prompt_len), grpo_loss(s, cfg.guard),
                           algorithm="GRPO", trainable=trainable, mesh=run.mesh, log=run.say)
    del base, policy  # the trainer holds the weights now
    try:
        result = run.train(trainer, source, hooks=[*grpo_hooks(source, cfg.guard), *hooks])
    finally:
        source.close()  # the rollout workers, when there are any
    return finish_policy(run, result, tokenizer=tok, held_rows=held_rows, options=options, before=before,
                         evaluate_fn=evaluate_fn)
