"""Off-policy bookkeeping of asynchronous rollouts: how stale a rollout is, and the truncated importance weight
that corrects for it.

With rollout workers (`tempax.rl.async_source`), a rollout may be sampled by an older policy version than the
one being trained. Two pure functions keep that honest:

    staleness(trainer_version, sampled_version)       updates the trainer made since the sampler's weights
    truncated_importance_weights(proximal, behaviour)  min(pi_prox / mu, C) per token

Top-p / top-k and the support mismatch: the sampler's log-probs (`tempax.generate`) are those of the full
temperature-scaled softmax p_tau. With top_p < 1 or top_k > 0 the token is drawn from the renormalised nucleus
mu(y) = p_tau(y) / Z (Z the kept mass), so log p_tau understates log mu by log Z, differently at every step, and
pi / p_tau is not the importance ratio of what was sampled (the bias reported for other async trainers). Tokens
outside the nucleus have mu = 0 and can never be sampled, so no weight can correct for them. tempax therefore
refuses an off-policy (max_staleness > 0) run with top_p < 1 (`GRPOKnobsConfig.validate`): the weights below are
only ever computed against the log-probs of the distribution actually sampled from.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def staleness(trainer_version: int, sampled_version: int) -> int:
    """Policy versions between the sampler and the trainer: `trainer_version - sampled_version` (>= 0).

    A version is the number of optimizer updates applied to the weights. A rollout sampled with version v and
    trained on at version v is on-policy (staleness 0, the synchronous loop); one sampled with v - k is k behind.

    Raises:
      ValueError: the sampler claims a version the trainer has not produced yet.
    """
    lag = int(trainer_version) - int(sampled_version)
    if lag < 0:
        raise ValueError(f"rollout sampled with policy version {sampled_version}, newer than the trainer's "
                         f"{trainer_version}")
    return lag


def truncated_importance_weights(
    proximal_logp: jax.Array,
    behaviour_logp: jax.Array,
    mask: jax.Array,
    *,
    cap: float,
) -> jax.Array:
    """Truncated importance sampling (TIS) weights of off-policy tokens, no gradient.

        w_t = min( exp(log pi_prox(y_t) - log mu(y_t)), C )     on masked tokens, 1 elsewhere

    pi_prox is the policy at the time of the update (the trainer's weights, gradient stopped), mu the policy that
    sampled the token (an older version, the "behaviour" policy), C = `cap`. The policy-gradient term of token t
    is multiplied by w_t, so the expected gradient is that of on-policy samples from pi_prox; truncating at C
    bounds the variance a rare token with a large ratio would bring, at the price of a small bias (IMPALA's
    truncated importance weights, Espeholt et al. 2018, "IMPALA"; applied to LLM RL by Yao et al. 2025, "Your
    efficient RL framework secretly brings you off-policy RL training"). The PPO/GRPO clip then acts on
    pi / pi_prox, which is 1 at the first pass (the decoupled objective of Hilton et al. 2022, "Batch size-invariance
    for policy optimization").

    `behaviour_logp` must be the log-prob of the distribution the token was drawn from (see the module docstring
    on top-p / top-k).

    Args:
      proximal_logp: [B, T] log pi_prox of the sampled tokens.
      behaviour_logp: [B, T] log mu of the same tokens (the sampler's own log-probs).
      mask: [B, T] completion mask.
      cap: C > 0, the truncation.

    Returns:
      [B, T] float32 weights, 1 outside the mask.
    """
    log_ratio = jnp.asarray(proximal_logp, jnp.float32) - jnp.asarray(behaviour_logp, jnp.float32)
    # min(exp(x), C) = exp(min(x, log C)): never overflows.
    w = jnp.exp(jnp.minimum(log_ratio, jnp.log(jnp.float32(cap))))
    return jax.lax.stop_gradient(jnp.where(mask.astype(bool), w, 1.0))
