"""Per-token log-probabilities, entropies and masked reductions.

Every algorithm (SFT, DPO, GRPO, PPO, distillation) and the generation engine turn logits into the same two
quantities, so they live here once:

    log p(y_t)  = z_t[y_t] / tau - logsumexp_v(z_t[v] / tau)
    H_t         = -sum_v p_t(v) log p_t(v)

where z are the logits and tau the sampling temperature. Both are computed in float32 whatever the logits'
dtype: a bfloat16 logsumexp over a 50k-150k vocabulary loses several bits, and the PPO/GRPO importance ratio
exp(logp - old_logp) amplifies that error.

Masks are 0/1 (or boolean) arrays of the same shape as the values; a masked reduction over an empty mask returns
0, never NaN, so an all-padding row in a fixed-shape batch is harmless.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _scaled_logits_f32(logits_btv: jax.Array, temperature: float) -> jax.Array:
    # Division by 1.0 is exact in IEEE arithmetic, so tau = 1 matches the unscaled log-softmax bit for bit.
    return logits_btv.astype(jnp.float32) / temperature


def token_logprobs(logits_btv: jax.Array, targets_bt: jax.Array, *, temperature: float = 1.0) -> jax.Array:
    """Log-probability of each target token, `log p(y_t) = z_t[y_t]/tau - logsumexp_v(z_t[v]/tau)`.

    Args:
      logits_btv: [batch, time, vocab] logits at the positions that predict `targets_bt` (any float dtype).
      targets_bt: [batch, time] integer token ids. Ids outside [0, vocab) (an ignore index such as -100, or
        padding) are clamped into range, so they give a finite but meaningless value that the caller masks.
      temperature: tau > 0, the sampling temperature the tokens were (or will be) drawn at. Greedy decoding has
        no finite-temperature distribution; report its log-probs at tau = 1.

    Returns:
      [batch, time] float32 log-probabilities (always <= 0).
    """
    logits = _scaled_logits_f32(logits_btv, temperature)
    target_logit = jnp.take_along_axis(logits, targets_bt[..., None].astype(jnp.int32), axis=-1, mode="clip")
    return target_logit[..., 0] - jax.nn.logsumexp(logits, axis=-1)


def token_entropy(logits_btv: jax.Array, *, temperature: float = 1.0) -> jax.Array:
    """Entropy of the next-token distribution, `H_t = -sum_v p_t(v) log p_t(v)` with `p_t = softmax(z_t/tau)`.

    Computed as `logsumexp(z) - sum_v p(v) z(v)` (the same quantity, one fewer [B, T, V] temporary), in float32.
    Logits of -inf (a masked vocabulary) are allowed.

    Args:
      logits_btv: [batch, time, vocab] logits.
      temperature: tau > 0.

    Returns:
      [batch, time] float32 entropies in nats, in [0, log vocab].
    """
    logits = _scaled_logits_f32(logits_btv, temperature)
    probs = jax.nn.softmax(logits, axis=-1)
    # Masked-out vocabulary entries (-inf logits) have p = 0 and contribute 0 * -inf; zero their logits first so
    # neither the value nor the gradient becomes NaN.
    finite_logits = jnp.where(probs > 0, logits, 0.0)
    return jax.nn.logsumexp(logits, axis=-1) - jnp.sum(probs * finite_logits, axis=-1)


def masked_sum(x: jax.Array, mask: jax.Array, axis: int | tuple[int, ...] | None = None) -> jax.Array:
    """`sum(x * mask)` over `axis` (all axes when None).

    Uses `where(mask, x, 0)` rather than a product so a NaN or inf at a masked position (say the log-prob of an
    out-of-range padding id) cannot leak into the sum.
    """
    return jnp.sum(jnp.where(mask.astype(bool), x, 0), axis=axis)


def masked_mean(x: jax.Array, mask: jax.Array, axis: int | tuple[int, ...] | None = None) -> jax.Array:
    """`sum(x * mask) / sum(mask)` over `axis`; 0 (not NaN) where the mask is empty.

    Example: x = [[1, 2, 3], [4, 5, 6]], mask = [[1, 1, 0], [0, 0, 0]]: all axes -> (1 + 2) / 2 = 1.5; axis=1 ->
    [1.5, 0.0].
    """
    count = jnp.sum(mask.astype(jnp.float32), axis=axis)
    return masked_sum(x, mask, axis=axis) / jnp.maximum(count, 1.0)


def shift_for_next_token(tokens_bt: jax.Array, mask_bt: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Targets and loss mask for next-token prediction, keeping the sequence length.

    The model reads `tokens_bt` unchanged; its logits at position t predict token t + 1, so

        targets_bt[:, t]   = tokens_bt[:, t + 1]      (0 at the last position)
        loss_mask_bt[:, t] = mask_bt[:, t + 1]        (0 at the last position)

    where `mask_bt` marks which tokens should be *predicted* (e.g. assistant turns only). Keeping length T rather
    than slicing to T - 1 keeps batch shapes on the bucket sizes the jitted step was compiled for.

    Args:
      tokens_bt: [batch, time] token ids.
      mask_bt: [batch, time] 1 where the token at that position counts towards the loss.

    Returns:
      (targets_bt, loss_mask_bt), both [batch, time]; the mask has `mask_bt`'s dtype.
    """
    targets_bt = jnp.pad(tokens_bt[:, 1:], ((0, 0), (0, 1)))
    loss_mask_bt = jnp.pad(mask_bt[:, 1:], ((0, 0), (0, 1)))
    return targets_bt, loss_mask_bt
