"""Rollouts: prompts -> groups of sampled completions -> rewards -> group advantages -> a fixed-shape batch.

A rollout holds P prompts with G completions each, in arrays shaped [P, G, ...] (the generator's rows
i * G + j reshaped). The training batch keeps that grouping, one batch row per prompt (`build_batch` gives the
layout), so the training forward runs each prompt once and gradient accumulation never splits a group.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax.numpy as jnp
import numpy as np

from tempax.envs.environment import SingleTurnEnvironment
from tempax.envs.registry import EnvFactory
from tempax.rl.advantages import combine_and_estimate
from tempax.rl.episodes import play_episodes
from tempax.rl.losses import overlong_penalty
from tempax.errors import DataError

# Row keys that are not reward columns (`prompt_messages` is one: a reward model scores the messages).
_NOT_COLUMNS: tuple[str, ...] = ()


@dataclass(frozen=True)
class Prompt:
    """One encoded task prompt.

    Attributes:
      ids: token ids of the chat prompt (template and generation prompt included).
      text: the rendered prompt text (what reward functions receive as `prompts`).
      columns: the row's other fields (answer, question, ...), passed to reward functions as dataset columns.
    """

    ids: tuple[int, ...]
    text: str
    columns: dict[str, Any]


def encode_prompts(
    tokenizer: Any, rows: Sequence[dict[str, Any]], *, max_prompt_len: int, env_factory: EnvFactory | None = None
) -> tuple[list[Prompt], int]:
    """Chat-template each row's first messages (with the generation prompt); returns (prompts, dropped).

    The first messages are the row's `prompt_messages`, or with `env_factory` what a fresh environment's
    `reset(row)` gives (a tool environment adds its tool list). Rows whose prompt is longer than `max_prompt_len`
    tokens are dropped and counted.
    """
    prompts, dropped = [], 0
    for row in rows:
        if env_factory is not None:
            messages = env_factory().reset(row)
        elif "prompt_messages" in row:
            messages = row["prompt_messages"]
        else:
            raise DataError(f"task row has no 'prompt_messages' (keys: {sorted(row)}); rows come from tempax.data.tasks")
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) > max_prompt_len:
            dropped += 1
            continue
        columns = {k: v for k, v in row.items() if k not in _NOT_COLUMNS}
        prompts.append(Prompt(ids=tuple(ids), text=text, columns=columns))
    return prompts, dropped


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class PromptSampler:
    """Draws batches of prompts in shuffled epochs; its position can be saved and restored (resume).

    Epoch e visits every prompt once in the order `random.Random(f"{seed}:{e}")` shuffles them to.
    """

    def __init__(self, prompts: Sequence[Prompt], *, seed: int = 0, shuffle: bool = True):
        if not prompts:
            raise DataError("no training prompts left (all were dropped or the task is empty)")
        self.prompts = list(prompts)
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.index = 0
        self._order = self._order_of(0)

    def _order_of(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def next(self, n: int) -> list[Prompt]:
        out = []
        while len(out) < n:
            if self.index >= len(self._order):
                self.epoch += 1
                self.index = 0
                self._order = self._order_of(self.epoch)
            out.append(self.prompts[self._order[self.index]])
            self.index += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def restore(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._order = self._order_of(self.epoch)


@dataclass
class Rollout:
    """P prompts x G completions with their rewards and advantages (host arrays).

    Attributes:
      prompts: the P prompts.
      completion_tokens: [P, G, T] int32, pad id after each completion's end.
      completion_mask: [P, G, T] int32, 1 on generated tokens.
      logprobs: [P, G, T] float32 sampling-time log p_tau (0 outside the mask).
      lengths: [P, G] int32 completion lengths in tokens.
      truncated: [P, G] bool, cut by max_new_tokens rather than ended by a stop token.
      texts: [P][G] completion texts.
      rewards: [P, G] float32 total (weighted) rewards.
      reward_parts: name -> [P, G] unweighted rewards of each function (and `overlong` when enabled).
      reward_failures: name -> samples that got 0 because the function failed.
      advantages: [P, G] float32.
      zero_spread: [P] bool, the group's rewards are all equal (its advantages are 0).
      seconds: name -> wall time of the stages that produced it (generation, reward).
      groups_sampled: groups generated to make this rollout (> P with dynamic sampling).
      zero_spread_sampled: of those, groups with zero reward spread.
      turns: [P, G] int32 replies per episode (None: one each).
      turn_of: [P, G, T] int32, k + 1 on the policy tokens of turn k, 0 elsewhere (None: one turn).
      env_metrics: name -> [P, G] the environments' counters (tool calls, malformed calls, tool errors, ...).
      prefilled_tokens: tokens the engine prefilled for these episodes (prompts once, then each turn's new ones).
      reprefill_tokens: what re-prefilling the whole conversation every turn would have cost instead.

    With multi-turn episodes `completion_tokens` holds the whole episode after the prompt (replies and the
    environment's messages) and `completion_mask` is 1 on the policy's tokens only (`tempax.rl.episodes`).
    """

    prompts: list[Prompt]
    completion_tokens: np.ndarray
    completion_mask: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    texts: list[list[str]]
    rewards: np.ndarray
    reward_parts: dict[str, np.ndarray]
    reward_failures: dict[str, int]
    advantages: np.ndarray
    zero_spread: np.ndarray
    seconds: dict[str, float] = field(default_factory=dict)
    groups_sampled: int = 0
    zero_spread_sampled: int = 0
    turns: np.ndarray | None = None
    turn_of: np.ndarray | None = None
    env_metrics: dict[str, np.ndarray] = field(default_factory=dict)
    prefilled_tokens: int = 0
    reprefill_tokens: int = 0

    @property
    def num_prompts(self) -> int:
        return len(self.prompts)

    @property
    def group_size(self) -> int:
        return int(self.completion_tokens.shape[1])

    def select(self, groups: Sequence[int]) -> "Rollout":
        """The rollout restricted to the given groups (in that order)."""
        idx = np.asarray(list(groups), dtype=np.int64)
        return Rollout(
            prompts=[self.prompts[i] for i in idx],
            completion_tokens=self.completion_tokens[idx], completion_mask=self.completion_mask[idx],
            logprobs=self.logprobs[idx], lengths=self.lengths[idx], truncated=self.truncated[idx],
            texts=[self.texts[i] for i in idx], rewards=self.rewards[idx],
            reward_parts={k: v[idx] for k, v in self.reward_parts.items()},
            reward_failures=dict(self.reward_failures), advantages=self.advantages[idx],
            zero_spread=self.zero_spread[idx], seconds=dict(self.seconds),
            groups_sampled=self.groups_sampled, zero_spread_sampled=self.zero_spread_sampled,
            turns=None if self.turns is None else self.turns[idx],
            turn_of=None if self.turn_of is None else self.turn_of[idx],
            env_metrics={k: v[idx] for k, v in self.env_metrics.items()},
            prefilled_tokens=self.prefilled_tokens, reprefill_tokens=self.reprefill_tokens,
        )


def concat_rollouts(parts: Sequence[Rollout]) -> Rollout:
    """Groups of several rollouts in one (stage times, failure counts and group counts are summed)."""
    first = parts[0]
    cat = lambda name: np.concatenate([getattr(p, name) for p in parts], axis=0)  # noqa: E731
    seconds: dict[str, float] = {}
    failures: dict[str, int] = {}
    for p in parts:
        for k, v in p.seconds.items():
            seconds[k] = seconds.get(k, 0.0) + v
        for k, v in p.reward_failures.items():
            failures[k] = failures.get(k, 0) + v
    return Rollout(
        prompts=[q for p in parts for q in p.prompts],
        completion_tokens=cat("completion_tokens"), completion_mask=cat("completion_mask"), logprobs=cat("logprobs"),
        lengths=cat("lengths"), truncated=cat("truncated"), texts=[t for p in parts for t in p.texts],
        rewards=cat("rewards"), reward_parts={k: np.concatenate([p.reward_parts[k] for p in parts]) for k in
                                              first.reward_parts},
        reward_failures=failures, advantages=cat("advantages"), zero_spread=cat("zero_spread"), seconds=seconds,
        groups_sampled=sum(p.groups_sampled for p in parts),
        zero_spread_sampled=sum(p.zero_spread_sampled for p in parts),
        turns=None if first.turns is None else cat("turns"),
        turn_of=None if first.turn_of is None else cat("turn_of"),
        env_metrics={k: np.concatenate([p.env_metrics[k] for p in parts]) for k in first.env_metrics},
        prefilled_tokens=sum(p.prefilled_tokens for p in parts),
        reprefill_tokens=sum(p.reprefill_tokens for p in parts),
    )


RewardCall = Callable[..., Any]  # a tempax.rewards.CombinedReward


def score(
    reward_fn: RewardCall,
    prompts: Sequence[Prompt],
    texts: list[list[str]],
    lengths: np.ndarray,
    *,
    max_new_tokens: int,
    overlong_penalty_tokens: int = 0,
) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, int]]:
    """Rewards [P, G] of grouped completion texts: (total, per-function parts, failures per function).

    Every completion is scored with its prompt's text and columns (one reward call for the whole rollout). The
    DAPO overlong penalty (`overlong_penalty`, in tokens) is added to the total as the part `overlong`.
    """
    p, g = lengths.shape
    flat_prompts = [prompts[i].text for i in range(p) for _ in range(g)]
    flat_texts = [t for group in texts for t in group]
    keys = sorted({k for q in prompts for k in q.columns})
    columns = {k: [prompts[i].columns.get(k) for i in range(p) for _ in range(g)] for k in keys}
    breakdown = reward_fn(flat_prompts, flat_texts, **columns)
    total = np.asarray(breakdown.total, np.float32).reshape(p, g)
    parts = {k: np.asarray(v, np.float32).reshape(p, g) for k, v in breakdown.per_function.items()}
    if overlong_penalty_tokens:
        penalty = np.asarray(
            overlong_penalty(jnp.asarray(lengths.reshape(-1)), max_len=max_new_tokens, cache_len=overlong_penalty_tokens)
        ).reshape(p, g)
        parts["overlong"] = penalty.astype(np.float32)
        total = total + penalty
    return total, parts, dict(breakdown.failed_samples)


def sample_rollout(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    reward_fn: RewardCall | None,
    *,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    seed: int = 0,
    advantage: str = "grpo",
    reward_combination: str = "sum",
    reward_weights: dict[str, float] | None = None,
    overlong_penalty_tokens: int = 0,
    env_factory: EnvFactory | None = None,
    max_turns: int = 1,
    episode_tokens: int | None = None,
    engine: str = "batch",
    slots: int = 0,
) -> Rollout:
    """Plays `group_size` episodes per prompt (one shared prefill each), scores them, computes advantages.

    One path for every task (`tempax.rl.episodes.play_episodes`): without `env_factory` an episode is one reply
    to the prompt (`SingleTurnEnvironment`). An episode's reward is the task's reward functions on its final
    reply (scored for the whole rollout in one call) plus the reward parts its environment gave on each turn,
    each part logged under its own name.

    Args:
      model: the current policy.
      tokenizer: its tokenizer (stop tokens, decoding, the chat template).
      prompts: the P prompts (`encode_prompts` with the same `env_factory`).
      reward_fn: a `tempax.rewards.CombinedReward` on final replies (returns a `RewardBreakdown`; never raises),
        or None when the environment gives every reward.
      group_size: G.
      max_new_tokens: most tokens per reply.
      temperature, top_p: sampling knobs.
      seed: base of the random streams (use a different one per rollout).
      advantage: the estimator, `advantages.ADVANTAGE_ESTIMATORS` (grpo, dr_grpo, rloo, reinforce_pp).
      reward_combination: 'sum' (the estimator on the weighted total) or 'normalize_each' (on each reward part,
        then weighted and batch-normalised; `advantages.combine_and_estimate`).
      reward_weights: part name -> weight for normalize_each (missing names, e.g. `overlong`, weigh 1).
      overlong_penalty_tokens: DAPO's soft overlong zone (0: off), over the episode's tokens.
      env_factory: a fresh environment per episode (None: the one-turn task).
      max_turns: most replies per episode.
      episode_tokens: T, the batch's completion length (None: max_new_tokens x max_turns).
      engine, slots: the decode engine ("batch" or the continuously batched "slots") and its slots
        (`play_episodes`).
    """
    p, g = len(prompts), group_size
    t = episode_tokens or max_new_tokens * max_turns
    t0 = time.perf_counter()
    episodes = play_episodes(
        model, tokenizer, [q.ids for q in prompts], [q.columns for q in prompts],
        env_factory or (lambda: SingleTurnEnvironment(tokenizer)), group_size=g, max_new_tokens=max_new_tokens,
        max_turns=max_turns, episode_tokens=t, temperature=temperature, top_p=top_p, seed=seed, engine=engine,
        slots=slots,
    )
    t1 = time.perf_counter()
    shape3 = (p, g, t)
    lengths = episodes.lengths.reshape(p, g)
    texts = [episodes.texts[i * g:(i + 1) * g] for i in range(p)]
    finals = [episodes.final_texts[i * g:(i + 1) * g] for i in range(p)]
    total, parts, failures = _episode_rewards(reward_fn, prompts, finals, lengths, episodes.turn_rewards,
                                              episode_tokens=t, overlong_penalty_tokens=overlong_penalty_tokens)
    t2 = time.perf_counter()
    if reward_combination == "sum":
        arrays, weights = [total.reshape(-1)], [1.0]
    else:
        names = sorted(parts)
        arrays = [parts[k].reshape(-1) for k in names]
        weights = [(reward_weights or {}).get(k, 1.0) for k in names]
    adv, zero = combine_and_estimate(arrays, weights, g, estimator=advantage, combination=reward_combination)
    zero_spread = np.asarray(zero).reshape(p, g)[:, 0]
    multi = max_turns > 1
    return Rollout(
        prompts=list(prompts), completion_tokens=episodes.tokens.reshape(shape3),
        completion_mask=episodes.mask.reshape(shape3), logprobs=episodes.logprobs.reshape(shape3),
        lengths=lengths, truncated=episodes.truncated.reshape(p, g), texts=texts if multi else finals,
        rewards=np.asarray(total, np.float32), reward_parts=parts, reward_failures=failures,
        advantages=np.asarray(adv, np.float32).reshape(p, g), zero_spread=zero_spread,
        seconds={"generation": t1 - t0, "reward": t2 - t1}, groups_sampled=p,
        zero_spread_sampled=int(zero_spread.sum()),
        turns=episodes.turns.reshape(p, g) if multi else None,
        turn_of=episodes.turn_of.reshape(shape3) if multi else None,
        env_metrics={k: v.reshape(p, g) for k, v in episodes.env_metrics.items()},
        prefilled_tokens=episodes.prefilled_tokens, reprefill_tokens=episodes.reprefill_tokens,
    )


def _episode_rewards(reward_fn: RewardCall | None, prompts: Sequence[Prompt], finals: list[list[str]],
                     lengths: np.ndarray, turn_rewards: Sequence[dict[str, float]], *, episode_tokens: int,
                     overlong_penalty_tokens: int) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, int]]:
    """(each episode's reward [P, G], its parts by name [P, G], the reward functions' failed samples): the task's
    reward functions on the final replies (`score`; none when `reward_fn` is None) plus every part the environment
    gave on the episode's turns, each part also logged under its own name."""
    p, g = lengths.shape
    if reward_fn is not None:
        total, parts, failures = score(reward_fn, prompts, finals, lengths, max_new_tokens=episode_tokens,
                                       overlong_penalty_tokens=overlong_penalty_tokens)
    else:
        total, parts, failures = np.zeros((p, g), np.float32), {}, {}
    for name in sorted({k for r in turn_rewards for k in r}):
        values = np.asarray([r.get(name, 0.0) for r in turn_rewards], np.float32).reshape(p, g)
        parts[name] = parts.get(name, 0.0) + values
        total = total + values
    return total, parts, failures


def fill_with_spread(rounds: Sequence[Rollout], num_prompts: int) -> Rollout:
    """DAPO dynamic sampling: the first `num_prompts` groups with reward spread across `rounds`, in order.

    A batch that is still short is completed with zero-spread groups (zero advantage: no policy-gradient
    signal, so they only keep the batch shape fixed).
    """
    merged = concat_rollouts(rounds)
    spread = [i for i in range(merged.num_prompts) if not merged.zero_spread[i]]
    flat = [i for i in range(merged.num_prompts) if merged.zero_spread[i]]
    chosen = (spread + flat)[:num_prompts]
    out = merged.select(chosen)
    return out


def build_batch(rollout: Rollout, *, prompt_len: int, pad_id: int, with_old_logp: bool) -> dict[str, np.ndarray]:
    """The fixed-shape training batch of a rollout.

    The batch keeps the rollout's [P, G] grouping: one batch row per *prompt*, holding the prompt once and its G
    completions,

        prompt_tokens      [P, Lp]      int32, left-padded to the fixed prompt length Lp (pad id, segment 0)
        prompt_segments    [P, Lp]      int32, 1 on prompt tokens, 0 on padding
        completion_tokens  [P, G, T]    int32, T = max_new_tokens, pad id after each completion's end
        completion_mask    [P, G, T]    float32, 1 on generated tokens (the stop token included); in a multi-turn
                                        episode 1 on the policy's tokens only (the loss mask)
        completion_segments [P, G, T]   int32, 1 on every token of the completion or episode (what later tokens
                                        attend to: the environment's messages included), 0 on padding
        advantages         [P, G]       float32, group-relative advantages
        old_logp           [P, G, T]    float32, sampling-time log p_tau of each token (only when needed)
        ref_logp           [P, G, T]    float32, reference log p_tau (added by the batch source when beta > 0)

    so the training forward can run each prompt once and share its keys/values among the G completions
    (`tempax.rl.logprobs.completion_logprobs`), like the sampler's shared prefill; and gradient
    accumulation, which splits the batch by rows, never splits a group.

    Args:
      rollout: P groups.
      prompt_len: Lp, the fixed (left-padded) prompt length; every prompt must fit.
      pad_id: the padding token.
      with_old_logp: include the sampling-time log-probs as `old_logp` (needed when a batch is trained on more
        than once; a single on-policy pass uses the current log-probs with a stopped gradient instead).
    """
    p = rollout.num_prompts
    prompt_tokens = np.full((p, prompt_len), pad_id, np.int32)
    prompt_segments = np.zeros((p, prompt_len), np.int32)
    for i, q in enumerate(rollout.prompts):
        n = len(q.ids)
        if n > prompt_len:
            raise ValueError(f"prompt {i} has {n} tokens, more than the batch's prompt length {prompt_len}")
        prompt_tokens[i, prompt_len - n:] = q.ids
        prompt_segments[i, prompt_len - n:] = 1
    batch = {
        "prompt_tokens": prompt_tokens,
        "prompt_segments": prompt_segments,
        "completion_tokens": rollout.completion_tokens.astype(np.int32),
        "completion_mask": rollout.completion_mask.astype(np.float32),
        "completion_segments": (np.arange(rollout.completion_tokens.shape[2]) < rollout.lengths[..., None]).astype(np.int32),
        "advantages": rollout.advantages.astype(np.float32),
    }
    if with_old_logp:
        batch["old_logp"] = rollout.logprobs.astype(np.float32)
    return batch


def _stats(prefix: str, x: np.ndarray) -> dict[str, float]:
    x = np.asarray(x, np.float64).reshape(-1)
    return {f"{prefix}_mean": float(x.mean()), f"{prefix}_std": float(x.std())}


def rollout_metrics(rollout: Rollout) -> dict[str, float]:
    """Per-step rollout metrics: rewards (per function), zero-spread groups, advantages, completion lengths.

    `groups/zero_spread_frac` is measured over every group sampled for the step (before dynamic sampling dropped
    any), since it says how much of the sampling produced no learning signal.
    """
    m: dict[str, float] = {}
    m.update(_stats("reward/total", rollout.rewards))
    for name, values in rollout.reward_parts.items():
        m.update(_stats(f"reward/{name}", values))
        m[f"reward/{name}_failures"] = float(rollout.reward_failures.get(name, 0))
    sampled = max(rollout.groups_sampled, 1)
    m["groups/zero_spread_frac"] = rollout.zero_spread_sampled / sampled
    m["groups/sampled"] = float(rollout.groups_sampled)
    m["groups/zero_spread_in_batch"] = float(rollout.zero_spread.sum())
    adv = rollout.advantages.reshape(-1)
    m["advantage/mean"] = float(adv.mean())
    m["advantage/std"] = float(adv.std())
    m["advantage/abs_mean"] = float(np.abs(adv).mean())
    m["advantage/max"] = float(adv.max())
    m["advantage/min"] = float(adv.min())
    lengths = rollout.lengths.reshape(-1)
    m["completion/length_mean"] = float(lengths.mean())
    m["completion/length_max"] = float(lengths.max())
    m["completion/truncated_frac"] = float(rollout.truncated.mean())
    m["completion/duplicate_frac"] = duplicate_fraction(rollout.completion_tokens)
    if rollout.turns is not None:
        m.update(episode_metrics(rollout))
    return m


def episode_metrics(rollout: Rollout) -> dict[str, float]:
    """Multi-turn numbers: turns, the environments' counters per episode (tool calls, malformed calls, tool
    errors, tool seconds), the malformed-call rate (malformed / all calls), the share of episode tokens that are
    the policy's, tokens prefilled per episode (and what re-prefilling every turn would cost), and per turn k the
    sampled tokens' mean -log p_tau (`entropy/turn_k`, a Monte Carlo estimate of the policy's entropy on that
    turn, which the collapse guard watches beside the loss's entropy)."""
    episodes = max(rollout.num_prompts * rollout.group_size, 1)
    m = {"episode/turns_mean": float(np.mean(rollout.turns))}
    for name, values in sorted(rollout.env_metrics.items()):
        m[f"episode/{name}_mean"] = float(np.mean(values))
    if "malformed_calls" in rollout.env_metrics and "tool_calls" in rollout.env_metrics:
        bad = float(np.sum(rollout.env_metrics["malformed_calls"]))
        m["episode/malformed_call_rate"] = bad / max(bad + float(np.sum(rollout.env_metrics["tool_calls"])), 1.0)
    m["episode/policy_token_frac"] = float(rollout.completion_mask.sum()) / max(float(rollout.lengths.sum()), 1.0)
    m["episode/prefilled_tokens"] = rollout.prefilled_tokens / episodes
    m["episode/reprefill_tokens"] = rollout.reprefill_tokens / episodes
    if rollout.turn_of is not None:
        for k in range(1, int(rollout.turn_of.max()) + 1):
            on = rollout.turn_of == k
            m[f"entropy/turn_{k}"] = float(-rollout.logprobs[on].mean())
    return m


def duplicate_fraction(completion_tokens: np.ndarray) -> float:
    """Fraction of completions [P, G, T] that repeat an earlier completion of their group token for token (pad
    after the end included): G - distinct completions, summed over groups, over P * G. A sign of collapse."""
    p, g = completion_tokens.shape[:2]
    repeats = sum(g - len(np.unique(group.reshape(g, -1), axis=0)) for group in completion_tokens)
    return repeats / max(p * g, 1)

