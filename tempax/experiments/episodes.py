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
from tempax.envs.transcripts import Policy, RecordedTranscripts, record_transcripts
from tempax.models.registry import load_tokenizer
from tempax.rewards.registry import build_rewards

DEFAULT_REPLY_TOKENS = 128  # a sampled reply's length when neither the caller nor the recipe sets one


def recipe_reply_length(cfg: Any, command: str) -> int | None:
    """The `max_new_tokens` of the first knobs section of `command`'s record that sets one (None: none does)."""
    return next((getattr(cfg, k).max_new_tokens for k in get(command).knobs
                 if hasattr(getattr(cfg, k, None), "max_new_tokens")), None)


def write_episodes(cfg: Any, command: str, out: str, *, policy: Policy | None = None, limit: int | None = None,
                   attempts: int = 1, min_reward: float | None = None, temperature: float = 1.0,
                   max_new_tokens: int | None = None, seed: int = 0) -> RecordedTranscripts:
    """Plays `attempts` episodes on each of the first `limit` task rows (None: all) of the recipe `cfg` of
    `command` with `policy` (None: its model samples, at `temperature`, `max_new_tokens` a reply or the
    recipe's), writes those whose total reward reaches `min_reward` (None: all) to `out`; returns the counts, the
    longest written reply and the latest reply start in tokens (`reply_limit_warning` checks them against the
    recipe's limits)."""
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


def reply_limit_warning(recorded: RecordedTranscripts, cfg: Any, command: str) -> str | None:
    """A line when the written episodes do not fit the recipe's own limits, naming the settings to raise:
    - a reply longer than the per-turn token limit: a model warm-started on these transcripts writes replies that
      long, and the recipe's RL episodes would cut them (a cut call is a malformed call, so every such episode
      fails alike and its group carries no reward spread);
    - a last reply that starts too late for the episode budget: an RL episode starts a turn only when a whole
      turn's tokens still fit (`tempax.rl.episodes`), so it would end before that reply."""
    limit = recipe_reply_length(cfg, command)
    if limit is None:
        return None
    knobs = next(k for k in get(command).knobs if hasattr(getattr(cfg, k, None), "max_new_tokens"))
    budget = cfg.env.episode_tokens(limit, key=f"{knobs}.max_new_tokens")  # the recipe's own, before any raise
    problems = []
    if recorded.longest_reply_tokens > limit:
        problems.append(f"the longest reply takes {recorded.longest_reply_tokens} tokens, more than the recipe's "
                        f"{knobs}.max_new_tokens={limit}: set it to {recorded.longest_reply_tokens} or more")
        limit = recorded.longest_reply_tokens
    if recorded.latest_reply_start + limit > budget:
        problems.append(f"a last reply starts about {recorded.latest_reply_start} tokens into its episode, and a "
                        f"turn starts only when {knobs}.max_new_tokens={limit} more fit: set env.max_episode_tokens "
                        f"to {recorded.latest_reply_start + limit} or more (now {budget})")
    return ("warning: the recipe's RL episodes would cut these transcripts short; " + "; ".join(problems)
            if problems else None)
