"""Policy-gradient math that GRPO and PPO share: the clipped surrogate, the k3 KL estimator, DAPO's overlong
penalty, GAE and the clipped value loss. Advantage estimators live in `advantages.py`; GRPO's own loss (its
aggregation modes, GSPO's sequence ratio, the entropy bonus) in `tempax.algorithms.grpo.losses`.

Shapes: a rollout batch holds P prompts x G completions per prompt, flattened prompt-major to B = P * G rows
(rows g*G .. g*G + G - 1 are prompt g's group). Per-token arrays are [B, T] over completion tokens; `mask` is 1 on
completion tokens that count and 0 on prompt/padding positions. `logp`, `old_logp` and `ref_logp` are per-token
log-probabilities of the sampled tokens (`tempax.models.logprobs.token_logprobs`) under the policy being trained,
the policy that sampled, and the frozen reference.

Log-ratios are clamped to +-20 before `exp`: a ratio of e^20 is far outside any clip range, and the clamp keeps
one wildly off-policy (or garbage padding) token from overflowing to inf, which `where`/`min` would turn into a
NaN gradient (0 * inf) even at masked positions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tempax.errors import ConfigError
from tempax.models.logprobs import masked_mean

_MAX_LOG_RATIO = 20.0


def clamped_exp(log_ratio: jax.Array) -> jax.Array:
    return jnp.exp(jnp.clip(log_ratio, -_MAX_LOG_RATIO, _MAX_LOG_RATIO))


def overlong_penalty(lengths: jax.Array, *, max_len: int, cache_len: int) -> jax.Array:
    """DAPO soft overlong punishment (Yu et al. 2025), added to the task reward; lengths counted in tokens.

        R(L) = 0                                  L <= max_len - cache_len
        R(L) = ((max_len - cache_len) - L) / cache_len    max_len - cache_len < L <= max_len
        R(L) = -1                                 L > max_len

    The penalty ramps linearly from 0 to -1 across the last `cache_len` tokens of the budget, so the model learns
    to finish early instead of being hit by the cliff of a truncated (and usually unrewarded) answer.

    Args:
      lengths: [B] completion lengths in tokens.
      max_len: the generation budget L_max.
      cache_len: the width of the soft zone L_cache, 0 < cache_len <= max_len.

    Returns:
      [B] float32 penalties in [-1, 0].

    Raises:
      ConfigError: when cache_len is not in (0, max_len].
    """
    if not 0 < cache_len <= max_len:
        raise ConfigError(
            f"the overlong penalty needs 0 < cache_len <= max_len; got cache_len={cache_len}, max_len={max_len}"
        )
    lengths = jnp.asarray(lengths, dtype=jnp.float32)
    soft_start = float(max_len - cache_len)
    ramp = (soft_start - lengths) / float(cache_len)
    return jnp.where(lengths <= soft_start, 0.0, jnp.where(lengths <= max_len, ramp, -1.0))


# ------------------------------------------------------------------------------------------- per-token terms


def kl_k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """Per-token k3 estimator of KL(pi || ref) (Schulman 2020, "Approximating KL divergence"), as used by GRPO.

        d = log ref(y_t) - log pi(y_t),   k3 = exp(d) - d - 1

    Unbiased for KL(pi || ref) under samples from pi, and always >= 0 (exp(d) >= 1 + d), unlike the plain
    estimator -d. d is clamped to +-20 (see the module docstring).

    Args:
      logp, ref_logp: [B, T] log-probabilities of the sampled tokens.

    Returns:
      [B, T] float32 estimates; mask them yourself.
    """
    d = jnp.clip(
        jnp.asarray(ref_logp, jnp.float32) - jnp.asarray(logp, jnp.float32), -_MAX_LOG_RATIO, _MAX_LOG_RATIO
    )
    return jnp.exp(d) - d - 1.0


def clipped_objective(
    ratio_bt: jax.Array,
    advantages: jax.Array,
    eps_low: float,
    eps_high: float,
    mask_bt: jax.Array | None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    adv = jnp.asarray(advantages, jnp.float32)
    if adv.ndim == 1:
        adv = adv[:, None]
    unclipped = ratio_bt * adv
    clipped = jnp.clip(ratio_bt, 1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -jnp.minimum(unclipped, clipped)
    # "Clipped" means the clip is active, i.e. the min picked the constant term and the token gets no gradient.
    clipped_low = ((ratio_bt < 1.0 - eps_low) & (adv < 0)).astype(jnp.float32)
    clipped_high = ((ratio_bt > 1.0 + eps_high) & (adv > 0)).astype(jnp.float32)
    mask = jnp.ones(ratio_bt.shape, jnp.float32) if mask_bt is None else mask_bt.astype(jnp.float32)
    any_token = jnp.any(mask > 0)
    metrics = {
        "clip_frac_low": masked_mean(clipped_low, mask),
        "clip_frac_high": masked_mean(clipped_high, mask),
        "clip_frac": masked_mean(clipped_low + clipped_high, mask),
        "ratio_mean": masked_mean(ratio_bt, mask),
        # An empty batch reports 1 rather than -inf/inf.
        "ratio_max": jnp.where(any_token, jnp.max(jnp.where(mask > 0, ratio_bt, -jnp.inf)), 1.0),
        "ratio_min": jnp.where(any_token, jnp.min(jnp.where(mask > 0, ratio_bt, jnp.inf)), 1.0),
    }
    return per_token, metrics


def clipped_surrogate(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages_b: jax.Array,
    *,
    eps_low: float,
    eps_high: float,
    mask: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO clipped surrogate per token (Schulman et al. 2017), with separate low/high clip ranges.

        r_t = exp(log pi(y_t) - log pi_old(y_t))
        l_t = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)

    eps_high > eps_low is DAPO's clip-higher (Yu et al. 2025): it lets low-probability tokens with positive
    advantage grow further, which keeps entropy from collapsing. Symmetric eps_low = eps_high is PPO/GRPO.

    Clip fractions count tokens where the clip is active (the token gets no gradient): `clip_frac_low` is
    r < 1 - eps_low with A < 0, `clip_frac_high` is r > 1 + eps_high with A > 0.

    Args:
      logp, old_logp: [B, T] log-probabilities under the current and the sampling policy.
      advantages_b: [B] per-sequence advantages (broadcast over tokens), or [B, T] per-token (PPO with GAE).
      eps_low, eps_high: clip ranges below and above 1.
      mask: optional [B, T]; masked positions get log-ratio 0 and are left out of the metrics.

    Returns:
      (per-token loss [B, T], metrics: clip_frac_low, clip_frac_high, clip_frac, ratio_mean, ratio_max, ratio_min).
    """
    log_ratio = jnp.asarray(logp, jnp.float32) - jnp.asarray(old_logp, jnp.float32)
    if mask is not None:
        log_ratio = jnp.where(mask.astype(bool), log_ratio, 0.0)
    return clipped_objective(clamped_exp(log_ratio), advantages_b, eps_low, eps_high, mask)


# ------------------------------------------------------------------------------------------------ reduction


# ------------------------------------------------------------------------------------------------- GRPO loss


# ------------------------------------------------------------------------------------------------ PPO pieces


def gae(
    rewards_bt: jax.Array,
    values_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    gamma: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalized advantage estimation (Schulman et al. 2016, "High-dimensional continuous control using GAE").

        delta_t = r_t + gamma V_{t+1} m_{t+1} - V_t
        A_t     = delta_t + gamma lam m_{t+1} A_{t+1}
        R_t     = A_t + V_t                       (the value targets)

    A completion ends at its last masked token, which is treated as terminal (V after it is 0): an LLM episode
    ends at EOS or at the length budget, and truncation is already penalised by the reward. Positions with
    m_t = 0 get A_t = R_t = 0, and their rewards and values never reach a masked-in token.

    Args:
      rewards_bt: [B, T] per-token rewards (typically the sequence reward on the last token minus a per-token KL
        penalty).
      values_bt: [B, T] value-head estimates V_t.
      mask_bt: [B, T] completion mask (one contiguous run per row).
      gamma: discount.
      lam: GAE lambda (1 = Monte-Carlo returns minus V, 0 = one-step TD).

    Returns:
      (advantages [B, T], returns [B, T]), float32.
    """
    mask = mask_bt.astype(jnp.float32)
    rewards = jnp.where(mask > 0, jnp.asarray(rewards_bt, jnp.float32), 0.0)
    values = jnp.where(mask > 0, jnp.asarray(values_bt, jnp.float32), 0.0)
    next_mask = jnp.pad(mask[:, 1:], ((0, 0), (0, 1)))
    next_values = jnp.pad(values[:, 1:], ((0, 0), (0, 1)))
    deltas = rewards + gamma * next_values * next_mask - values

    def step(next_adv_b: jax.Array, inputs: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        delta_b, next_mask_b, mask_b = inputs
        adv_b = (delta_b + gamma * lam * next_mask_b * next_adv_b) * mask_b
        return adv_b, adv_b

    _, adv_tb = jax.lax.scan(
        step, jnp.zeros(rewards.shape[0], jnp.float32), (deltas.T, next_mask.T, mask.T), reverse=True
    )
    advantages = adv_tb.T
    return advantages, (advantages + values) * mask


def clipped_value_loss(
    values_bt: jax.Array,
    old_values_bt: jax.Array,
    returns_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    clip_range: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO's clipped value loss (as in the PPO2 baselines implementation; Schulman et al. 2017).

        V_clip = V_old + clip(V - V_old, -c, c)
        l_t    = 0.5 * max((V - R)^2, (V_clip - R)^2)
        L      = masked token mean of l

    The max makes the loss pessimistic: the value head cannot profit from moving more than c from the values it
    had when the rollouts were scored.

    Args:
      values_bt: [B, T] current value predictions (differentiated).
      old_values_bt: [B, T] predictions at rollout time.
      returns_bt: [B, T] targets (`gae`'s returns).
      mask_bt: [B, T] completion mask.
      clip_range: c.

    Returns:
      (loss, metrics `value_loss`, `value_clip_frac` (tokens where the clipped term is the larger one)).
    """
    values = jnp.asarray(values_bt, jnp.float32)
    old_values = jnp.asarray(old_values_bt, jnp.float32)
    returns = jnp.asarray(returns_bt, jnp.float32)
    clipped_values = old_values + jnp.clip(values - old_values, -clip_range, clip_range)
    err = (values - returns) ** 2
    err_clipped = (clipped_values - returns) ** 2
    loss = masked_mean(0.5 * jnp.maximum(err, err_clipped), mask_bt)
    metrics = {
        "value_loss": loss,
        "value_clip_frac": masked_mean((err_clipped > err).astype(jnp.float32), mask_bt),
    }
    return loss, metrics
