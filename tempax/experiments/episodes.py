"""A recipe's environment played with a policy, each episode written as a tool-calling transcript for an SFT
warm-start (`tempax data episodes`).

The recipe (a GRPO or RFT recipe with `env:` and `task:`) gives the environment, the task rows it is reset with,
the reward functions that score each final reply (so a caller can keep only correct episodes) and the model.
The policy is a scripted `policy(messages, task_row)` or, when none is given, the recipe's model sampling one
reply a turn at the reply length of the recipe's own sampling (a `max_new_tokens` in a knobs section its record
names). The transcripts are `tempax.envs.transcripts`' layout, which `tempax sft` reads.
"""

from __future__ import annotations

from typing import Any

from tempax.algorithms.registry import get
from tempax.data.tasks.spec import load_task
from tempax.envs.transcripts import Policy, record_transcripts
from tempax.models.registry import load_tokenizer
from tempax.rewards.registry import build_rewards

DEFAULT_REPLY_TOKENS = 128  # a sampled reply's length when neither the caller nor the recipe sets one


def recipe_reply_length(cfg: Any, command: str) -> int | None:
    """The `max_new_tokens` of the first knobs section of `command`'s record that sets one (None: none does)."""
    return next((getattr(cfg, k).max_new_tokens for k in get(command).knobs
                 if hasattr(getattr(cfg, k, None), "max_new_tokens")), None)


def write_episodes(cfg: Any, command: str, out: str, *, policy: Policy | None = None, limit: int | None = None,
                   attempts: int = 1, min_reward: float | None = None, temperature: float = 1.0,
                   max_new_tokens: int | None = None, seed: int = 0) -> tuple[int, int]:
    """Plays `attempts` episodes on each of the first `limit` task rows (None: all) of the recipe `cfg` of
    `command` with `policy` (None: its model samples, at `temperature`, `max_new_tokens` a reply or the
    recipe's), writes those whose total reward reaches `min_reward` (None: all) to `out`; (written, played)."""
    if policy is None:
        from tempax.generate.chat import sampled_replies  # only sampling loads the model and the engine

        model, tokenizer = cfg.model.build(seed=seed)
        policy = sampled_replies(
            model, tokenizer, temperature=temperature, seed=seed,
            max_new_tokens=max_new_tokens or recipe_reply_length(cfg, command) or DEFAULT_REPLY_TOKENS)
    else:
        tokenizer = load_tokenizer(cfg.model.tokenizer or cfg.model.source)
    rows, _ = load_task(cfg.task, eval_problems=0)
    return record_transcripts(
        out, cfg.env.build(tokenizer), rows[:limit] if limit else rows, policy, tokenizer=tokenizer,
        max_turns=cfg.env.max_turns, attempts=attempts, min_reward=min_reward,
        reward_fn=build_rewards(cfg.rewards) if cfg.rewards.functions else None)
