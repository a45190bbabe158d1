"""Policy-gradient math for GRPO and its variants (Dr. GRPO, DAPO, GSPO), plus PPO's GAE and value loss.
Advantage estimators live in `advantages.py`.

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

from tempax.algorithms.grpo.advantages import as_groups, group_advantages  # noqa: F401 - group_advantages' old home
from tempax.errors import ConfigError
from tempax.models.logprobs import masked_mean, masked_sum

AGGREGATION_MODES = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")
IMPORTANCE_LEVELS = ("token", "sequence")
_MAX_LOG_RATIO = 20.0


def _clamped_exp(log_ratio: jax.Array) -> jax.Array:
    return jnp.exp(jnp.clip(log_ratio, -_MAX_LOG_RATIO, _MAX_LOG_RATIO))


def dynamic_sampling_keep(rewards: jax.Array, group_size: int) -> jax.Array:
    """Which groups to keep under DAPO dynamic sampling (Yu et al. 2025, "DAPO").

    A group whose rewards are all equal (every completion right, or every one wrong) has zero advantage and
    contributes no gradient; DAPO drops such groups and samples more prompts to fill the batch.

    Args:
      rewards: [P * G] rewards, prompt-major.
      group_size: G.

    Returns:
      [P] bool, True where max(r) > min(r) within the group.
    """
    grouped = as_groups(rewards, group_size)
    return jnp.max(grouped, axis=1) > jnp.min(grouped, axis=1)


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


def _clipped_objective(
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
    return _clipped_objective(_clamped_exp(log_ratio), advantages_b, eps_low, eps_high, mask)


def gspo_sequence_ratio(logp: jax.Array, old_logp: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """GSPO sequence-level importance ratio (Zheng et al. 2025, "Group sequence policy optimization").

        s_i   = exp( (1/|y_i|) sum_t (log pi(y_it) - log pi_old(y_it)) )     (geometric mean of token ratios)
        s_i,t = sg[s_i] * pi(y_it) / sg[pi(y_it)]                            (GSPO-token form)

    s_i,t equals s_i in value at every position, but its gradient with respect to log pi(y_it) is s_i. Fed to
    the clipped surrogate and averaged over each sequence's tokens ('seq_mean_token_mean'), it reproduces GSPO's
    sequence-level gradient s_i A_i (1/|y_i|) sum_t grad log pi(y_it) while keeping the per-token plumbing; the
    clip then acts on whole sequences. Rows with no masked token get s = 1.

    Args:
      logp, old_logp: [B, T] log-probabilities.
      mask: [B, T] completion mask.

    Returns:
      (s [B] with the full sequence gradient, s_token [B, T] in the stop-gradient token form).
    """
    logp = jnp.asarray(logp, jnp.float32)
    log_ratio = jnp.where(mask.astype(bool), logp - jnp.asarray(old_logp, jnp.float32), 0.0)
    seq_ratio = _clamped_exp(masked_mean(log_ratio, mask, axis=-1))
    token_ratio = jax.lax.stop_gradient(seq_ratio)[:, None] * jnp.exp(logp - jax.lax.stop_gradient(logp))
    return seq_ratio, token_ratio


# ------------------------------------------------------------------------------------------------ reduction


def aggregate_token_loss(
    per_token_bt: jax.Array,
    mask_bt: jax.Array,
    mode: str,
    *,
    max_len: int | None = None,
) -> jax.Array:
    """Reduce a per-token loss to a scalar.

        'seq_mean_token_mean'      mean_i [ sum_t m_it l_it / sum_t m_it ]         original GRPO (Shao et al.
                                   2024): every sequence weighs the same, so tokens of long answers weigh less
        'token_mean'               sum_it m_it l_it / sum_it m_it                   DAPO (Yu et al. 2025): every
                                   token weighs the same
        'seq_mean_token_sum_norm'  mean_i [ sum_t m_it l_it / max_len ]             Dr. GRPO (Liu et al. 2025): a
                                   constant denominator, so no length bias

    The outer mean over sequences runs over rows with at least one masked token (all-padding rows in a
    fixed-shape batch are left out); an empty batch gives 0.

    Args:
      per_token_bt: [B, T] per-token loss.
      mask_bt: [B, T] completion mask.
      mode: one of the three names above.
      max_len: the constant for 'seq_mean_token_sum_norm' (the generation budget in tokens).

    Raises:
      ConfigError: for an unknown mode, or 'seq_mean_token_sum_norm' without a positive max_len.
    """
    mask = mask_bt.astype(jnp.float32)
    if mode == "token_mean":
        return masked_mean(per_token_bt, mask)
    if mode == "seq_mean_token_mean":
        per_seq = masked_mean(per_token_bt, mask, axis=-1)
    elif mode == "seq_mean_token_sum_norm":
        if max_len is None or max_len <= 0:
            raise ConfigError(f"loss aggregation 'seq_mean_token_sum_norm' needs max_len > 0 (got {max_len})")
        per_seq = masked_sum(per_token_bt, mask, axis=-1) / float(max_len)
    else:
        raise ConfigError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGGREGATION_MODES)}")
    has_tokens = (jnp.sum(mask, axis=-1) > 0).astype(jnp.float32)
    return jnp.sum(per_seq * has_tokens) / jnp.maximum(jnp.sum(has_tokens), 1.0)


# ------------------------------------------------------------------------------------------------- GRPO loss


def grpo_loss(
    logp: jax.Array,
    old_logp: jax.Array | None,
    ref_logp: jax.Array | None,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    beta: float,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    aggregation: str = "seq_mean_token_mean",
    importance: str = "token",
    max_len: int | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The GRPO objective and its variants, as one per-token loss reduced by `aggregate_token_loss`.

        l_t = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A) + beta * k3_t
        L   = aggregate(l, mask, aggregation)

    with r_t the token ratio pi/pi_old ('token', GRPO/DAPO) or the GSPO sequence ratio in token form
    ('sequence', Zheng et al. 2025), and k3 the KL estimator against the reference (`kl_k3`). Variants are
    settings: GRPO = (token, seq_mean_token_mean, beta > 0); DAPO = (token, token_mean, beta = 0,
    eps_high > eps_low); Dr. GRPO = (seq_mean_token_sum_norm, advantages without std); GSPO = (sequence,
    seq_mean_token_mean, small eps such as 3e-4 / 4e-4).

    Args:
      logp: [B, T] current-policy log-probs of the sampled tokens (differentiated).
      old_logp: [B, T] log-probs under the sampling policy, or None for the on-policy case (one gradient step per
        batch), where pi_old = stop_gradient(pi): the ratio is 1 and the gradient is A grad log pi.
      ref_logp: [B, T] reference log-probs, or None when beta = 0.
      advantages: [B] per-sequence advantages (`group_advantages`), or [B, T].
      mask: [B, T] completion mask.
      beta: KL weight, a Python float; 0 skips the KL term and needs no reference.
      eps_low, eps_high: clip ranges.
      aggregation: see `aggregate_token_loss`.
      importance: 'token' or 'sequence'.
      max_len: for 'seq_mean_token_sum_norm'.

    Returns:
      (loss, metrics) with `loss`, `pg_loss` (the clipped term alone, aggregated the same way), `kl` (masked token
      mean of k3; only when ref_logp is given), clip fractions, `ratio_mean/max/min`, `advantage_mean` and
      `num_tokens`.

    Raises:
      ConfigError: unknown importance level or aggregation.
      ValueError: beta != 0 without ref_logp.
    """
    if importance not in IMPORTANCE_LEVELS:
        raise ConfigError(f"unknown importance ratio level {importance!r}; choose one of {IMPORTANCE_LEVELS}")
    if beta != 0 and ref_logp is None:
        raise ValueError(f"grpo_loss with beta={beta} needs ref_logp (set grpo.beta=0 to train without a reference)")
    logp = jnp.asarray(logp, jnp.float32)
    old_logp = jax.lax.stop_gradient(logp) if old_logp is None else jnp.asarray(old_logp, jnp.float32)
    bool_mask = mask.astype(bool)
    if importance == "token":
        ratio = _clamped_exp(jnp.where(bool_mask, logp - old_logp, 0.0))
    else:
        _, ratio = gspo_sequence_ratio(logp, old_logp, mask)
    pg_bt, metrics = _clipped_objective(ratio, advantages, eps_low, eps_high, mask)
    per_token = pg_bt
    if ref_logp is not None:
        kl_bt = kl_k3(logp, ref_logp)
        metrics["kl"] = masked_mean(kl_bt, mask)
        if beta != 0:
            per_token = per_token + beta * kl_bt
    loss = aggregate_token_loss(per_token, mask, aggregation, max_len=max_len)
    metrics["loss"] = loss
    metrics["pg_loss"] = aggregate_token_loss(pg_bt, mask, aggregation, max_len=max_len)
    metrics["advantage_mean"] = jnp.mean(jnp.asarray(advantages, jnp.float32))
    metrics["num_tokens"] = jnp.sum(mask.astype(jnp.float32))
    return loss, metrics


def entropy_bonus(
    entropy_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    coef: jax.Array | float,
    aggregation: str = "token_mean",
    max_len: int | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The entropy bonus added to a policy loss: `-coef * agg_t(H_t)`, so minimising the loss raises entropy.

        H_t = -sum_v pi(v | context_t) log pi(v | context_t)      per-token entropy of the policy (nats)
        term = -coef * aggregate(H, mask)                          aggregated like the policy loss

    Entropy regularisation (Williams & Peng 1991; the c2 S[pi] term of PPO, Schulman et al. 2017) keeps the
    policy from collapsing onto one completion. `aggregate` is `aggregate_token_loss` with the policy loss's
    mode, so the bonus weighs tokens the way the loss does (GRPO: each sequence the same; DAPO: each token).
    `coef` may be traced (the collapse guard raises it during a run without recompiling the step).

    Args:
      entropy_bt: [B, T] per-token entropy, with its gradient (do not stop it: the bonus acts through it).
      mask_bt: [B, T] completion mask.
      coef: c >= 0.
      aggregation, max_len: as `aggregate_token_loss`.

    Returns:
      (term to add to the loss, {"entropy_bonus": term}).
    """
    term = -jnp.asarray(coef, jnp.float32) * aggregate_token_loss(entropy_bt, mask_bt, aggregation, max_len=max_len)
    return term, {"entropy_bonus": term}


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
