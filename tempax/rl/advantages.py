"""Advantage estimators for group-sampled policy gradients, and how several reward functions are combined.

Shapes: rewards are flat [B = P * G] arrays, prompt-major (rows g*G .. g*G + G - 1 are prompt g's group), as in
`losses.py`. Every estimator returns `(advantages [B] float32, zero_spread [B] bool)`; `zero_spread` marks rows
whose group's rewards are all equal (such a group carries no learning signal; the group-relative estimators give
it exactly 0, never the float residue of r - mean(r)).

`estimate_advantages` says which estimator to use when; each estimator's docstring keeps its formula and the
paper it comes from. Several reward functions are combined by `combine_and_estimate` (a weighted sum, or GDPO's
per-reward normalisation).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from tempax.errors import ConfigError

ADVANTAGE_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp")
REWARD_COMBINATIONS = ("sum", "normalize_each")


def as_groups(rewards: jax.Array, group_size: int) -> jax.Array:
    """[P * G] -> [P, G] float32, checking the length divides."""
    rewards = jnp.asarray(rewards, dtype=jnp.float32)
    if rewards.ndim != 1 or group_size < 1 or rewards.shape[0] % group_size != 0:
        raise ValueError(
            f"rewards must be a flat [num_prompts * group_size] array; got shape {rewards.shape} "
            f"with group_size={group_size}"
        )
    return rewards.reshape(-1, group_size)


def _zero_spread(grouped: jax.Array) -> jax.Array:
    """[P, 1] bool: every reward of the group is equal."""
    return jnp.max(grouped, axis=1, keepdims=True) == jnp.min(grouped, axis=1, keepdims=True)


def _flat(advantages: jax.Array, zero_spread: jax.Array) -> tuple[jax.Array, jax.Array]:
    return advantages.reshape(-1), jnp.broadcast_to(zero_spread, advantages.shape).reshape(-1)


def group_advantages(
    rewards: jax.Array,
    group_size: int,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-4,
) -> tuple[jax.Array, jax.Array]:
    """Group-relative advantages (Shao et al. 2024, "DeepSeekMath", GRPO outcome supervision).

        A_i = (r_i - mean_g(r)) / (std_g(r) + eps)     scale_by_std=True  (GRPO)
        A_i =  r_i - mean_g(r)                         scale_by_std=False (Dr. GRPO, Liu et al. 2025,
                                                                           "Understanding R1-Zero-like training")

    where mean_g/std_g run over the G completions of the same prompt; std is the population std (ddof=0;
    Bessel's correction would only rescale every group of size G by sqrt((G-1)/G)). Dr. GRPO drops the std
    because it up-weights prompts that are nearly always solved or nearly never solved.

    Groups whose rewards are all equal carry no learning signal: their advantages are set to exactly 0 (not the
    float residue of r - mean(r)) and reported in `zero_spread_mask`.

    Args:
      rewards: [P * G] scalar rewards, prompt-major.
      group_size: G.
      scale_by_std: divide by the group std (GRPO) or not (Dr. GRPO).
      eps: added to the std.

    Returns:
      (advantages [P * G] float32, zero_spread_mask [P * G] bool, True for rows in an all-equal group).
    """
    grouped = as_groups(rewards, group_size)
    centered = grouped - jnp.mean(grouped, axis=1, keepdims=True)
    if scale_by_std:
        centered = centered / (jnp.std(grouped, axis=1, keepdims=True) + eps)
    zero = _zero_spread(grouped)
    return _flat(jnp.where(zero, 0.0, centered), zero)


def rloo_advantages(rewards: jax.Array, group_size: int) -> tuple[jax.Array, jax.Array]:
    """REINFORCE leave-one-out advantages (Ahmadian et al. 2024, "Back to basics: revisiting REINFORCE style
    optimization for learning from human feedback in LLMs"; Kool et al. 2019).

        A_i = r_i - 1/(G-1) sum_{j != i} r_j  =  G/(G-1) (r_i - mean_g(r))

    The baseline of each sample is the mean reward of the other samples of its prompt, so it is independent of
    the sample and the estimate unbiased; no std division, so small-spread (noisy) groups are not amplified.
    Differences from the paper: it optimises the plain REINFORCE objective at sequence level; here the advantage
    enters the same clipped surrogate as GRPO's (identical when num_iterations = 1, where the ratio is 1).
    A group of one sample has no other sample to compare with: its advantage is 0 (and it counts as zero
    spread), as is every row of an all-equal group.

    Args:
      rewards: [P * G] scalar rewards, prompt-major.
      group_size: G.
    """
    grouped = as_groups(rewards, group_size)
    zero = _zero_spread(grouped)
    if group_size == 1:
        return _flat(jnp.zeros_like(grouped), zero)
    others = (jnp.sum(grouped, axis=1, keepdims=True) - grouped) / (group_size - 1)
    return _flat(jnp.where(zero, 0.0, grouped - others), zero)


def batch_normalize(x: jax.Array, *, eps: float = 1e-4) -> jax.Array:
    """(x - mean(x)) / (std(x) + eps) over the whole flat array; exactly 0 where every value is equal."""
    x = jnp.asarray(x, jnp.float32)
    std = jnp.std(x)
    return jnp.where(std > 0, (x - jnp.mean(x)) / (std + eps), 0.0)


def reinforce_pp_advantages(
    rewards: jax.Array, group_size: int, *, group_baseline: bool = True, eps: float = 1e-4
) -> tuple[jax.Array, jax.Array]:
    """REINFORCE++ advantages with global batch normalisation (Hu 2025, "REINFORCE++: a simple and efficient
    approach for aligning large language models").

        c_i = r_i - mean_g(r)     group_baseline=True  (the paper's REINFORCE++-baseline, for group sampling)
        c_i = r_i                 group_baseline=False (plain REINFORCE++: no groups needed, G may be 1)
        A_i = (c_i - mean_B(c)) / (std_B(c) + eps)

    mean_B / std_B run over the whole batch (all P * G rows), not per prompt: one scale for every prompt, so a
    prompt whose samples barely differ is not inflated to unit scale as under GRPO, while the overall scale stays
    normalised. With the group baseline, all-equal groups get exactly 0 (mean_B(c) is 0 then as well, up to
    rounding). Differences from the paper: its token-level KL penalty is folded into the reward there; here the
    KL is the loss's k3 term (`grpo.beta`), so the advantage is the outcome reward's only. The batch is one
    rollout call's (with DAPO dynamic sampling, one sampling round's).

    Args:
      rewards: [P * G] scalar rewards, prompt-major.
      group_size: G.
      group_baseline: subtract each group's mean first.
      eps: added to the batch std.
    """
    grouped = as_groups(rewards, group_size)
    zero = _zero_spread(grouped)
    centered = grouped - jnp.mean(grouped, axis=1, keepdims=True) if group_baseline else grouped
    adv = batch_normalize(centered, eps=eps)
    if group_baseline:
        adv = jnp.where(zero, 0.0, adv)
    return _flat(adv, zero)


def check_estimator(name: str) -> None:
    if name not in ADVANTAGE_ESTIMATORS:
        raise ConfigError(f"unknown advantage estimator {name!r}; choose one of {', '.join(ADVANTAGE_ESTIMATORS)}")


def estimate_advantages(
    rewards: jax.Array, group_size: int, *, estimator: str = "grpo", eps: float = 1e-4
) -> tuple[jax.Array, jax.Array]:
    """The named estimator on [P * G] rewards -> (advantages, zero_spread).

    Which to use (all plug into the same clipped objective; `GRPOKnobsConfig.advantage` picks one):

        grpo          (r - mean_g) / std_g        GRPO's default. Every prompt gets unit-scale advantages, so rare
                                                  successes on hard prompts and rare failures on easy ones count
                                                  fully; but in a group whose rewards barely differ (noisy rubric or
                                                  reward-model scores) the std division blows noise up to unit scale.
        dr_grpo       r - mean_g                  Dr. GRPO: no std, so no per-prompt re-weighting and no noise
                                                  amplification; the scale follows the reward's own.
        rloo          leave-one-out baseline      RLOO: each sample's baseline is the mean of the *other* G - 1, an
                                                  unbiased baseline (it does not contain the sample itself). Equal to
                                                  dr_grpo times G / (G - 1): one constant factor, which Adam's update
                                                  all but cancels (it still meets gradient clipping).
        reinforce_pp  (r - mean_g) / std_batch    REINFORCE++ (baseline variant): centred per prompt, scaled by one
                                                  std over the whole batch. Keeps dr_grpo's immunity to small-spread
                                                  groups while holding the overall scale at 1 whatever the reward's.

    Raises:
      ConfigError: for an unknown name.
    """
    check_estimator(estimator)
    if estimator in ("grpo", "dr_grpo"):
        return group_advantages(rewards, group_size, scale_by_std=estimator == "grpo", eps=eps)
    if estimator == "rloo":
        return rloo_advantages(rewards, group_size)
    return reinforce_pp_advantages(rewards, group_size, eps=eps)


def combine_and_estimate(
    parts: Sequence[jax.Array],
    weights: Sequence[float],
    group_size: int,
    *,
    estimator: str = "grpo",
    combination: str = "sum",
    eps: float = 1e-4,
) -> tuple[jax.Array, jax.Array]:
    """Advantages from K reward functions' [P * G] rewards `parts` with `weights` w_k.

        sum:             A = est(sum_k w_k r_k)
        normalize_each:  A = batch_normalize(sum_k w_k est(r_k))      (GDPO, Liu et al. 2026, "GDPO: group
                                                                      reward-decoupled normalization policy
                                                                      optimization for multi-reward RL")

    With a sum, different mixtures of the parts collapse onto the same totals (format 1 + correctness 0 ties
    format 0 + correctness 1) and a reward with a large scale drowns one with a small scale; normalising each gives
    every reward the same say in the ranking. Per-reward values stay in the rollout metrics (`reward/<name>`), so
    hacking of one reward shows either way.

    `est` is `estimate_advantages(estimator)`. GDPO is normalize_each with estimator grpo; other estimators
    normalise each reward their way. With normalize_each a group where two rewards separate the samples gets a
    larger advantage than a group where only one does, whatever the rewards' scales (under sum + grpo every
    group is rescaled to unit std, so the reverse can happen; the test shows a case). A row is zero-spread only
    when every reward is constant within its group (its advantage is then exactly 0). One reward (K = 1) with
    normalize_each is est followed by batch_normalize.

    Args:
      parts: K arrays [P * G], the unweighted reward of each function.
      weights: K weights.
      group_size: G.
      estimator: see `ADVANTAGE_ESTIMATORS`.
      combination: 'sum' or 'normalize_each'.
      eps: the estimators' and the batch normalisation's epsilon.

    Returns:
      (advantages [P * G] float32, zero_spread [P * G] bool).

    Raises:
      ConfigError: for an unknown estimator or combination, or len(weights) != len(parts).
    """
    if combination not in REWARD_COMBINATIONS:
        raise ConfigError(f"unknown reward combination {combination!r}; choose one of {', '.join(REWARD_COMBINATIONS)}")
    if len(parts) != len(weights) or not parts:
        raise ConfigError(f"{len(parts)} reward arrays need as many weights, got {len(weights)}")
    stacked = jnp.stack([jnp.asarray(p, jnp.float32) for p in parts])  # [K, B]
    w = jnp.asarray(weights, jnp.float32)[:, None]
    if combination == "sum":
        return estimate_advantages(jnp.sum(w * stacked, axis=0), group_size, estimator=estimator, eps=eps)
    per_reward = [estimate_advantages(p, group_size, estimator=estimator, eps=eps) for p in stacked]
    summed = jnp.sum(w * jnp.stack([a for a, _ in per_reward]), axis=0)
    zero = jnp.all(jnp.stack([z for _, z in per_reward]), axis=0)
    return jnp.where(zero, 0.0, batch_normalize(summed, eps=eps)), zero
