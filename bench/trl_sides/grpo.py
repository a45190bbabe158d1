"""GRPO on the demo's arithmetic task: the shared start (the demo's SFT warm-start, exported), tempax's prompts in
tempax's order for TRL's GRPOTrainer with the demo's two reward functions, and the row's metric, greedy answer
accuracy on the held-out problems.

Sampling cannot be made equal across the libraries (their random streams and kernels differ), so this row
compares one run of each from the same start on the same prompts, not one run twice: its first loss checks
nothing (0 on both sides with beta 0 and one pass over each rollout), and the held-out difference is one draw.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from bench.trl_sides.common import TrlSide, side_outcomes, trl_arguments

START = "start"  # ROW/start: the warm-start both sides train from (a Hugging Face folder)
# The demo's rewards (`tempax.experiments.demo.demo_grpo_config`), by their tempax names; TRL's child imports
# these two modules only (plain Python, no JAX).
REWARDS = ("format", "correctness")


def warm_start(cfg: Any, row_dir: str) -> list[str]:
    """The row's setup (the preparation child, in neither budget): the demo's SFT warm-start on the task's worked
    solutions from the base, adapters merged, written as ROW/start; both sides then start from it
    (`model.source=ROW/start`)."""
    from tempax.data.tasks.spec import load_task
    from tempax.experiments.demo import demo_sft_config
    from tempax.experiments.stages import run_sft
    from tempax.models.hf_io import save_hf_checkpoint

    folder = os.path.join(os.path.abspath(row_dir), START)
    model, tokenizer = cfg.model.build(seed=cfg.train.seed)
    train_rows, _ = load_task(cfg.task, eval_problems=cfg.eval.num_problems)
    sft = demo_sft_config()
    sft = dataclasses.replace(
        sft, model=cfg.model, data=dataclasses.replace(sft.data, path=os.path.join(row_dir, "sft_examples.jsonl")),
        train=dataclasses.replace(sft.train, run_dir=os.path.join(row_dir, "warm_start"), seed=cfg.train.seed,
                                  progress_bar=False))
    model, _ = run_sft(model, tokenizer, train_rows, sft, print)
    save_hf_checkpoint(model, folder, tokenizer=tokenizer)
    return [f"model.source={folder}"]


def grpo_rows(cfg: Any, base: str) -> tuple[list[dict], dict[str, Any]]:
    """GRPOTrainer's rows: the prompts tempax's sampler draws over the run (`train.batch_size` a step), in that
    order, each with its rendered text, tempax's token ids and its answer column; and GRPOTrainer's arguments: a
    step is batch_size x group_size completions, one generation a step, tempax's sampling, clip and loss."""
    from tempax.data.tasks.spec import load_task
    from tempax.models.registry import load_tokenizer
    from tempax.rl.rollout import PromptSampler, encode_prompts

    s = cfg.grpo
    if tuple(cfg.rewards.functions) != REWARDS:
        raise SystemExit(f"bench/learning_trl.py's GRPO row maps the rewards {list(REWARDS)} only")
    unmapped = {"advantage": (s.advantage, "grpo"), "scale_rewards": (s.scale_rewards, True),
                "loss_aggregation": (s.loss_aggregation, "seq_mean_token_mean"), "num_iterations": (s.num_iterations, 1),
                "importance_sampling": (s.importance_sampling, "token"), "dynamic_sampling": (s.dynamic_sampling, False),
                "top_p": (s.top_p, 1.0), "entropy_coef": (s.entropy_coef, 0.0), "beta": (s.beta, 0.0),
                "reward_combination": (s.reward_combination, "sum"),
                "overlong_penalty_tokens": (s.overlong_penalty_tokens, 0)}
    off = {k: v for k, (v, want) in unmapped.items() if v != want}
    if off:
        raise SystemExit(f"bench/learning_trl.py's GRPO row maps the demo's GRPO settings only; these differ: {off}")
    tokenizer = load_tokenizer(base)
    train_rows, _ = load_task(cfg.task, eval_problems=cfg.eval.num_problems)
    prompts, _ = encode_prompts(tokenizer, train_rows, max_prompt_len=s.max_prompt_len)
    sampler = PromptSampler(prompts, seed=cfg.train.seed)
    rows = []
    for _ in range(cfg.train.steps):
        for p in sampler.next(cfg.train.batch_size):
            rows.append({"prompt": p.text, "prompt_ids": list(p.ids), "answer": p.columns["answer"]})
    weights = list(cfg.rewards.weights) if cfg.rewards.weights else [1.0] * len(REWARDS)
    return rows, trl_arguments(
        cfg, cfg.train.batch_size * s.group_size, num_generations=s.group_size, max_completion_length=s.max_new_tokens,
        temperature=s.temperature, top_p=1.0, top_k=0, beta=0.0, epsilon=s.epsilon,
        epsilon_high=s.epsilon_high if s.epsilon_high is not None else s.epsilon, num_iterations=1,
        # tempax's seq_mean_token_mean: each completion's mean token loss, averaged over completions.
        loss_type="grpo", scale_rewards="group", reward_weights=weights, shuffle_dataset=False,
        mask_truncated_completions=False, disable_dropout=True, log_completions=False)


def tempax_prompts(trainer_cls: type, inputs: dict[str, Any]) -> tuple[type, dict[str, Any]]:
    """GRPOTrainer fed tempax's prompt tokens (not its own tokenisation of the prompt text) and the demo's reward
    functions, which take TRL's call (`prompts`, `completions`, the dataset's columns as keywords) as they are."""
    from tempax.rewards.correctness import answer_correctness_reward
    from tempax.rewards.formatting import format_reward

    ids_of = {row["prompt"]: [int(t) for t in row["prompt_ids"]] for row in inputs["rows"]}

    class TempaxPrompts(trainer_cls):
        def _tokenize_prompts(self, prompts: list) -> tuple[list[list[int]], None, dict]:
            return [ids_of[p] for p in prompts], None, {}

    return TempaxPrompts, {"reward_funcs": [format_reward, answer_correctness_reward]}


GRPO_SIDE = TrlSide("GRPO", grpo_rows, specialise=tempax_prompts)


def answer_outcomes(cfg: Any, base: str, adapters: str | None) -> list[bool]:
    """Per held-out problem: is the greedy answer of the model (the start, with `adapters` when given) right?
    tempax's evaluation, with the run's eval settings (`eval.num_problems`, `eval.max_new_tokens`)."""
    from tempax.data.tasks.spec import load_task
    from tempax.eval.evaluate import evaluate
    from tempax.eval.spec import eval_options
    from tempax.models.lora import load_adapters
    from tempax.models.registry import load

    model, tokenizer = load(base)
    _, held_rows = load_task(cfg.task, eval_problems=cfg.eval.num_problems)
    if adapters is not None:
        model = load_adapters(model, adapters)
    options = eval_options(cfg.eval, cfg.grpo.max_new_tokens, seed=cfg.train.seed)
    result = evaluate(model, tokenizer, held_rows, options, label="eval")
    return [bool(r.correct[0]) for r in result.greedy_records]


def evaluate_answers(cfg: Any, base: str, row_dir: str) -> dict[str, list[bool]]:
    """Per-problem outcomes of the start and of each side's final adapters."""
    return side_outcomes(answer_outcomes, cfg, base, row_dir)
