"""`tempax grpo --config RECIPE.yaml`: GRPO (and variants) with verifiable rewards, from a `GRPOConfig`.

    cfg = load_config(GRPOConfig, "recipes/grpo_gsm8k_smollm2.yaml", ["train.steps=20"])
    result = main(cfg)

`main` states what GRPO adds to the shared skeleton (`tempax.algorithms.run.run_algorithm`): the task's prompts,
the reward functions, the rollout source (`GRPOSource`) and the loss; the skeleton builds the trainer and trains
with `Trainer.fit`. It evaluates on the held-out split before and after training (answer accuracy, format accuracy,
pass@k; greedy and sampled); and writes config.yaml, metrics.jsonl / TensorBoard, checkpoints, eval.json and
the adapters (PEFT layout) into `train.run_dir`.
"""

from __future__ import annotations

from typing import Any, Callable

from tempax.algorithms.common import base_model, build_model
from tempax.algorithms.grpo.config import GRPOConfig
from tempax.algorithms.grpo.source import GRPOSource, grpo_hooks, grpo_loss, grpo_trainable
from tempax.algorithms.run import PolicyRun, Run, Training, evaluate_before, finish_policy, run_algorithm, task_prompts
from tempax.data.tasks.spec import load_task
from tempax.eval.spec import eval_options
from tempax.rewards.registry import build_rewards
from tempax.rl.rollout import PromptSampler, round_up

__all__ = ["GRPOConfig", "PolicyRun", "load_task", "main", "PLOT_METRICS"]

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
) -> PolicyRun:
    """Trains per `cfg` (see the module docstring). `model` / `tokenizer`: an already built starting policy (LoRA
    adapters, when `cfg.lora` is set, are applied here; the model given is the reference) instead of loading
    `cfg.model` (`tempax demo` passes its SFT model)."""
    def plan(run: Run) -> Training:
        s = cfg.grpo
        base, tok = base_model(cfg, run.mesh, model=model, tokenizer=tokenizer)
        prompts, held_rows = task_prompts(run, tok, max_prompt_len=s.max_prompt_len, section="grpo")
        prompt_len = min(round_up(max(len(p.ids) for p in prompts), 8), s.max_prompt_len)
        reward_fn = build_rewards(cfg.rewards)
        options = eval_options(cfg.eval, s.max_new_tokens, seed=cfg.train.seed)
        before = evaluate_before(run, base, tok, held_rows, options)
        policy, tok, trainable = build_model(cfg, run.mesh, model=base, tokenizer=tok)
        source = GRPOSource(tok, PromptSampler(prompts, seed=cfg.train.seed), reward_fn, s, prompt_len=prompt_len,
                            reference=policy if cfg.lora is None else None)
        return Training(grpo_trainable(policy, s, prompt_len=prompt_len), grpo_loss(s, cfg.guard), source,
                        algorithm="GRPO", trainable=trainable, hooks=grpo_hooks(source, s, cfg.guard),
                        kept=dict(source=source, tokenizer=tok, held_rows=held_rows, options=options, before=before))

    return finish_policy(run_algorithm(cfg, plan, hooks=hooks, log=log))
