"""The math of RLHF with PPO, as pure functions of arrays.

    per-token rewards   r_t = -beta (log pi(y_t) - log ref(y_t)) + [t = last] * score      (Ziegler et al. 2019)
    advantages          GAE(gamma, lambda) over the completion tokens        (`gae`, Schulman et al. 2016)
    whitening           A <- (A - mean(A)) / std(A) over the batch's valid tokens
    policy loss         PPO's clipped surrogate, token mean                  (Schulman et al. 2017)
    value loss          PPO2's clipped value loss                            (`clipped_value_loss`)
    diagnostics         approx-KL(pi_old || pi), clip fractions, explained variance of the values

Shapes: per-token arrays are [B, T] over completion tokens (B completions, T the generation budget); `mask` is 1
on a completion's own tokens (a contiguous run from position 0) and 0 on padding after it. `score` is [B], one
scalar per completion (the reward model's, plus any other reward functions). Every function takes the mask and
never lets a padding position reach a valid one.

`gae`, `clipped_value_loss`, the clipped surrogate and the k3 KL estimator are shared with GRPO and live in
`tempax.rl.losses`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tempax.errors import ConfigError
from tempax.models.logprobs import masked_mean
from tempax.rl.losses import clipped_surrogate, clipped_value_loss, kl_k3

__all__ = [
    "adaptive_kl_coef", "approx_kl", "explained_variance", "kl_penalized_rewards",
    "last_token_mask", "missing_eos_penalty", "ppo_loss", "ppo_policy_loss", "whiten",
]


def last_token_mask(mask_bt: jax.Array) -> jax.Array:
    """[B, T] float32 one-hot of each row's last valid token (all zeros for an empty row).

    Example: mask [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]] -> [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]].
    """
    mask = jnp.asarray(mask_bt, jnp.float32)
    next_mask = jnp.pad(mask[:, 1:], ((0, 0), (0, 1)))
    return mask * (1.0 - next_mask)


def kl_penalized_rewards(
    scores_b: jax.Array,
    logp_bt: jax.Array,
    ref_logp_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    kl_coef: float | jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Per-token rewards of RLHF: a KL penalty on every token, the sequence score on the last one.

        k1_t = log pi(y_t) - log ref(y_t)
        r_t  = -beta k1_t + [t is the completion's last token] * score

    (Ziegler et al. 2019, "Fine-tuning language models from human preferences", eq. 2: R(x, y) = r(x, y) -
    beta log(pi(y|x) / rho(y|x)), the log-ratio spread over the tokens it is made of; Stiennon et al. 2020 and
    Ouyang et al. 2022 use the same shaping.) k1 is the plain single-sample estimator: its sum over a completion
    is an unbiased estimate of KL(pi || ref) of the whole sequence, and as a per-token reward it gives the
    gradient of -beta KL exactly; it can be negative on a single token. Padding positions get r_t = 0.

    Args:
      scores_b: [B] sequence rewards (reward model + other functions, penalties included).
      logp_bt, ref_logp_bt: [B, T] log-probs of the sampled tokens under the policy that sampled and the reference.
      mask_bt: [B, T] completion mask.
      kl_coef: beta >= 0.

    Returns:
      (rewards [B, T], k1 [B, T]), float32, both 0 at padding.
    """
    mask = jnp.asarray(mask_bt, jnp.float32)
    k1 = jnp.where(mask > 0, jnp.asarray(logp_bt, jnp.float32) - jnp.asarray(ref_logp_bt, jnp.float32), 0.0)
    rewards = -kl_coef * k1 + last_token_mask(mask) * jnp.asarray(scores_b, jnp.float32)[:, None]
    return rewards, k1


def missing_eos_penalty(scores_b: jax.Array, truncated_b: jax.Array, *, penalty: float) -> jax.Array:
    """Scores with a penalty for completions that did not end on their own (cut at the length budget).

        s'_i = s_i - penalty * [completion i has no EOS]

    A reward model scores a truncated answer as if it were complete, so without this PPO can learn to ramble to
    the budget; the penalty (TRL's `missing_eos_penalty`, cf. the truncation reward of Huang et al. 2024, "The
    N+ implementation details of RLHF with PPO") makes ending the answer pay.

    Args:
      scores_b: [B] sequence scores.
      truncated_b: [B] bool, True where the completion hit the budget without a stop token.
      penalty: >= 0, subtracted from those scores.

    Returns:
      [B] float32.
    """
    return jnp.asarray(scores_b, jnp.float32) - penalty * jnp.asarray(truncated_b, jnp.float32)


def adaptive_kl_coef(
    coef: float, observed_kl: float, *, target: float | None, horizon: float, n_steps: int
) -> float:
    """The next KL coefficient: fixed, or Ziegler et al.'s proportional controller (2019, section 2.2).

        e       = clip(KL_observed / KL_target - 1, -0.2, 0.2)
        beta'   = beta (1 + e n_steps / horizon)

    KL_observed is the mean per-sequence KL of the last rollout (sum over tokens of k1); n_steps the number of
    completions that rollout had; horizon the number of completions over which the controller closes the gap
    (10 000 in the paper). The clip keeps one unusual batch from moving beta by more than 20% x n/horizon.
    `target=None` is the fixed coefficient: beta' = beta.

    Args:
      coef: beta > 0 now.
      observed_kl: the measured KL (nats per sequence).
      target: KL_target > 0 in nats per sequence, or None for a fixed coefficient.
      horizon: > 0.
      n_steps: completions in the rollout just measured.

    Returns:
      beta' (a Python float).
    """
    if target is None:
        return float(coef)
    if not target > 0 or not horizon > 0:
        raise ConfigError(f"the adaptive KL controller needs target > 0 and horizon > 0; got {target}, {horizon}")
    error = min(max(observed_kl / target - 1.0, -0.2), 0.2)
    return float(coef) * (1.0 + error * n_steps / horizon)


def whiten(x_bt: jax.Array, mask_bt: jax.Array, *, shift_mean: bool = True, eps: float = 1e-8) -> jax.Array:
    """Normalise values over the batch's valid tokens:

        mu = sum_t m_t x_t / sum_t m_t,    var = sum_t m_t (x_t - mu)^2 / sum_t m_t
        x' = (x - mu) / sqrt(var + eps)          shift_mean=True
        x' = (x - mu) / sqrt(var + eps) + mu     shift_mean=False (rescale only, keep the mean)

    Padding neither enters the statistics nor receives a value (x' = 0 there). Advantage whitening over the
    batch (Schulman et al. 2017's baselines PPO2; Ziegler et al. 2019) makes the policy loss's scale independent
    of the reward scale; `var` is the population variance over valid tokens.

    Args:
      x_bt: [B, T] values (advantages).
      mask_bt: [B, T] completion mask.
      shift_mean: subtract the mean (True) or keep it.
      eps: added to the variance.

    Returns:
      [B, T] float32.
    """
    x = jnp.asarray(x_bt, jnp.float32)
    mask = jnp.asarray(mask_bt, jnp.float32)
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    out = (x - mean) * jax.lax.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return jnp.where(mask > 0, out, 0.0)


def explained_variance(values_bt: jax.Array, returns_bt: jax.Array, mask_bt: jax.Array) -> jax.Array:
    """How much of the returns' variance the value function explains, over valid tokens:

        EV = 1 - Var[R - V] / Var[R]

    1 is a perfect critic, 0 is no better than predicting the mean return, negative is worse than that. When
    the returns have no variance, EV is reported as 0 (Var[R] clamped to 1e-8 would blow it up otherwise).

    Args:
      values_bt: [B, T] predictions V_t (at rollout time).
      returns_bt: [B, T] targets R_t.
      mask_bt: [B, T] completion mask.

    Returns:
      a float32 scalar.
    """
    v = jnp.asarray(values_bt, jnp.float32)
    r = jnp.asarray(returns_bt, jnp.float32)
    mask = jnp.asarray(mask_bt, jnp.float32)

    def var(x: jax.Array) -> jax.Array:
        return masked_mean((x - masked_mean(x, mask)) ** 2, mask)

    var_r = var(r)
    return jnp.where(var_r > 1e-8, 1.0 - var(r - v) / jnp.maximum(var_r, 1e-8), 0.0)


def approx_kl(logp_bt: jax.Array, old_logp_bt: jax.Array, mask_bt: jax.Array) -> jax.Array:
    """Approximate KL(pi_old || pi) of one PPO update, the masked token mean of Schulman's k3 (2020):

        rho_t = pi(y_t) / pi_old(y_t),    k3_t = (rho_t - 1) - log rho_t  >= 0

    over tokens sampled from pi_old. It watches how far an epoch of updates moved the policy from the one that
    sampled (0 on the first mini-batch of a rollout).
    """
    return masked_mean(kl_k3(old_logp_bt, logp_bt), mask_bt)


def ppo_policy_loss(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    advantages_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    clip_range: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO's clipped policy loss with per-token advantages (Schulman et al. 2017, eq. 7), a token mean:

        rho_t = exp(log pi(y_t) - log pi_old(y_t))
        L     = sum_t m_t * -min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps) A_t) / sum_t m_t

    Args:
      logp_bt: [B, T] current log-probs (differentiated).
      old_logp_bt: [B, T] log-probs of the policy that sampled.
      advantages_bt: [B, T] (whitened) GAE advantages.
      mask_bt: [B, T] completion mask.
      clip_range: eps.

    Returns:
      (loss, metrics: pg_loss, clip_frac (and _low / _high), ratio_mean/max/min, approx_kl).
    """
    per_token, metrics = clipped_surrogate(
        logp_bt, old_logp_bt, advantages_bt, eps_low=clip_range, eps_high=clip_range, mask=mask_bt
    )
    loss = masked_mean(per_token, mask_bt)
    return loss, {**metrics, "pg_loss": loss, "approx_kl": approx_kl(logp_bt, old_logp_bt, mask_bt)}


def ppo_loss(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    values_bt: jax.Array,
    old_values_bt: jax.Array,
    advantages_bt: jax.Array,
    returns_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    clip_range: float,
    value_clip_range: float,
    vf_coef: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The PPO objective of one mini-batch: clipped policy loss plus weighted clipped value loss.

        L = L_clip(pi) + c_v * L_value(V)        (Schulman et al. 2017, eq. 9, without the entropy bonus)

    Args:
      logp_bt, old_logp_bt: [B, T] current and sampling-time log-probs.
      values_bt, old_values_bt: [B, T] current and rollout-time values.
      advantages_bt: [B, T] whitened advantages; returns_bt: [B, T] value targets (`gae`).
      mask_bt: [B, T] completion mask.
      clip_range, value_clip_range: eps of the policy ratio and c of the value change.
      vf_coef: c_v.

    Returns:
      (loss, metrics: loss, pg_loss, value_loss, value_clip_frac, clip fractions, ratios, approx_kl, num_tokens).
    """
    pg, metrics = ppo_policy_loss(logp_bt, old_logp_bt, advantages_bt, mask_bt, clip_range=clip_range)
    vf, value_metrics = clipped_value_loss(values_bt, old_values_bt, returns_bt, mask_bt, clip_range=value_clip_range)
    loss = pg + vf_coef * vf
    return loss, {
        **metrics, **value_metrics, "loss": loss,
        "num_tokens": jnp.sum(jnp.asarray(mask_bt, jnp.float32)),
    }
