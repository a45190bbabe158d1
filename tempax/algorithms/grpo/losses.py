"""GRPO's loss and its variants (Dr. GRPO, DAPO, GSPO): token aggregation, the sequence-level importance ratio,
dynamic sampling's group filter and the entropy bonus, on top of the shared policy-gradient terms of
`tempax.rl.losses` (clipped surrogate, k3 KL).

Shapes as in `tempax.rl.losses`: B = P * G completion rows, per-token arrays [B, T] with a completion `mask`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tempax.errors import ConfigError
from tempax.models.logprobs import masked_mean, masked_sum
from tempax.rl.advantages import as_groups
from tempax.rl.losses import clamped_exp, clipped_objective, kl_k3

AGGREGATION_MODES = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")
IMPORTANCE_LEVELS = ("token", "sequence")
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
    seq_ratio = clamped_exp(masked_mean(log_ratio, mask, axis=-1))
    token_ratio = jax.lax.stop_gradient(seq_ratio)[:, None] * jnp.exp(logp - jax.lax.stop_gradient(logp))
    return seq_ratio, token_ratio


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
    token_weights: jax.Array | None = None,
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
      token_weights: [B, T] per-token weights of the clipped term, no gradient (off-policy rollouts: the truncated
        importance weights of `tempax.rl.staleness`), or None (all 1). The KL term is not weighted.

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
        ratio = clamped_exp(jnp.where(bool_mask, logp - old_logp, 0.0))
    else:
        _, ratio = gspo_sequence_ratio(logp, old_logp, mask)
    pg_bt, metrics = clipped_objective(ratio, advantages, eps_low, eps_high, mask)
    if token_weights is not None:
        pg_bt = pg_bt * token_weights
        metrics["is_weight_mean"] = masked_mean(token_weights, mask)
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
