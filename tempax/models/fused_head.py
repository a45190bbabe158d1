"""The LM head and the causal-LM cross-entropy fused, computed over sequence chunks, with the gradient formed in
the forward pass.

`causal_lm_loss(logits, ...)` needs the [B, T, V] float32 logits, and autodiff then keeps them (or their softmax)
for the backward pass and writes a second [B, T, V] array for d loss / d logits. At V = 49k and 2k tokens per
micro-batch that is 0.4 GB per copy and several memory passes. Because the loss is linear in the per-token NLLs
with coefficients known up front (the loss mask over its normaliser), the gradient with respect to the logits is
known as soon as they are:

    z = h W                                    logits of one chunk   [C, V]   (W: [D, V], or the tied [V, D]^T)
    nll_i = logsumexp(z_i) - z_i[y_i]
    L = sum_i c_i nll_i,      c_i = mask_i / sum(mask)          (tokens)   or  mask_i / (n_row(i) * rows)  (sequences)
    dL/dz_i = c_i (softmax(z_i) - onehot(y_i))
    dL/dh_i = dL/dz_i W^T,    dL/dW = sum_i h_i^T dL/dz_i

so a custom VJP computes the three matmuls chunk by chunk in the forward pass and keeps only dL/dh [B, T, D] and
dL/dW (the size of the head's own gradient) for the backward. Only one chunk's logits exist at a time; the matmul
count is the same as plain autodiff (no recomputation). Token accuracy uses argmax == target <=> z[y] >= max(z),
free once the max is known (ties count as a hit; they have probability ~0 with real logits).

The head may be a float32 master weight under bfloat16 hidden states (`train.precision=bf16`): it is cast to
the hidden states' dtype once, every product is bf16 x bf16 with float32 accumulation, and dL/dW is summed in
float32 and returned in the master's dtype (float32), never rounded to bf16 on the way.

Gemma-2-style final soft-capping z = cap tanh(z' / cap) is applied inside, with dz'/dz = 1 - tanh^2.

This is the same quantity as `tempax.algorithms.sft.losses.causal_lm_loss` (tested equal, value and gradients);
only the way it is computed differs. Liger-Kernel's "fused linear cross-entropy" is the same idea on GPUs.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tempax.models.decoder import BF16, row_major_transpose


def head_logits(h: jax.Array, w: jax.Array, vocab_major: bool) -> jax.Array:
    """h [..., D] times the head: W [V, D] (vocab_major, a tied embedding) or [D, V]; float32 result."""
    dims = ((h.ndim - 1,), (1,) if vocab_major else (0,))
    return jax.lax.dot_general(h, w, (dims, ((), ())), preferred_element_type=jnp.float32)


def _chunk_stats(h, w, targets, vocab_major, softcap, with_probs=False):
    """(z, capped tanh or None, lse, target logit, max, softmax(z) or None) for one chunk; z is [B, C, V] float32.

    `with_probs` (bf16 training) also returns softmax(z) = e / sum(e) from e = exp(z - max) written out once
    (behind an optimization barrier), instead of a second exp(z - lse) pass: XLA:CPU otherwise sends the fused
    exp-and-sum to YNNPACK, which took 55 ms on [8, 64, 49152] alone; max, exp, sum and the gradient's
    e / sum took 46 ms against 72.5 ms this way (jax.jit, best of 20, AMD EPYC Zen 5)."""
    z = head_logits(h, w, vocab_major)
    y = None
    if softcap is not None:
        y = jnp.tanh(z / softcap)
        z = softcap * y
    m = jnp.max(z, axis=-1)
    p = None
    if with_probs:
        e = jax.lax.optimization_barrier(jnp.exp(z - m[..., None]))
        total = jnp.sum(e, axis=-1)
        lse, p = m + jnp.log(total), e * (1.0 / total)[..., None]
    else:
        lse = m + jnp.log(jnp.sum(jnp.exp(z - m[..., None]), axis=-1))
    zt = jnp.take_along_axis(z, targets[..., None].astype(jnp.int32), axis=-1, mode="clip")[..., 0]
    return z, y, lse, zt, m, p


def split_chunks(x: jax.Array, chunk: int) -> jax.Array:
    """[B, T, ...] -> [T / chunk, B, chunk, ...]: scan over sequence chunks, the (sharded) batch axis kept."""
    b, t = x.shape[:2]
    return x.reshape(b, t // chunk, chunk, *x.shape[2:]).swapaxes(0, 1)


def unsplit_chunks(x: jax.Array) -> jax.Array:
    n, b, c = x.shape[:3]
    return x.swapaxes(0, 1).reshape(b, n * c, *x.shape[3:])


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _weighted_nll(h, w, targets, coef, chunk, vocab_major, softcap):
    """(sum c_i nll_i, nll [B, T], hit [B, T]); only the first output is differentiable. `w` may be a float32
    master of a lower-precision `h` (module docstring)."""
    w = w.astype(h.dtype)

    def body(_, xs):
        hc, tc = xs
        _, _, lse, zt, m, _ = _chunk_stats(hc, w, tc, vocab_major, softcap)
        return None, (lse - zt, (zt >= m).astype(jnp.float32))

    _, (nll, hit) = jax.lax.scan(body, None, (split_chunks(h, chunk), split_chunks(targets, chunk)))
    nll, hit = unsplit_chunks(nll), unsplit_chunks(hit)
    return jnp.sum(coef * nll), nll, hit


def _weighted_nll_fwd(h, w_master, targets, coef, chunk, vocab_major, softcap):
    w = w_master.astype(h.dtype)  # the compute copy, made once for every chunk

    def body(dw, xs):
        hc, tc, cc = xs
        z, y, lse, zt, m, p = _chunk_stats(hc, w, tc, vocab_major, softcap, with_probs=hc.dtype == BF16)
        vocab = jax.lax.broadcasted_iota(jnp.int32, z.shape, z.ndim - 1)
        p = jnp.exp(z - lse[..., None]) if p is None else p
        g = (p - (vocab == tc[..., None]).astype(jnp.float32)) * cc[..., None]
        if y is not None:
            g = g * (1.0 - y * y)
        g = g.astype(hc.dtype)
        # dL/dh = g W^T; dL/dW = h^T g (or g^T h for a [V, D] head), summed over batch and chunk positions.
        dh = jax.lax.dot_general(g, w, (((g.ndim - 1,), (0,) if vocab_major else (1,)), ((), ())),
                                 preferred_element_type=jnp.float32).astype(hc.dtype)
        # The sum is kept as [D, V] for either head layout: h^T g reads g [.., V] in its own layout, where g^T h
        # had XLA:CPU transpose every chunk's [C, V] g first (bench-tiny: 10 ms a chunk); a float32 [V, D]
        # head's gradient is transposed once, after the scan. A bf16 [V, D] head's is summed as [V, D] from g^T
        # made row-major (`row_major_transpose`): the once-transposed [D, V] sum was read transposed by each of
        # the optimizer's fusions on the tied embedding instead (bench-small: 3 x ~98 ms a step, where a
        # row-major [576, 1536] update of the same kind runs at ~9x the rate per element).
        if vocab_major_dw:
            g_vc = row_major_transpose(g.reshape(-1, g.shape[-1]))
            dw_chunk = jax.lax.dot_general(g_vc, hc.reshape(-1, hc.shape[-1]), (((1,), (0,)), ((), ())),
                                           preferred_element_type=jnp.float32)
        else:
            dw_chunk = jnp.einsum("bcd,bcv->dv", hc, g, preferred_element_type=jnp.float32)
        return dw + dw_chunk, (lse - zt, (zt >= m).astype(jnp.float32), dh)

    vocab_major_dw = vocab_major and h.dtype == BF16
    dw0 = jnp.zeros(w.shape[::-1] if vocab_major and not vocab_major_dw else w.shape, jnp.float32)
    dw, (nll, hit, dh) = jax.lax.scan(body, dw0, (split_chunks(h, chunk), split_chunks(targets, chunk), split_chunks(coef, chunk)))
    nll, hit, dh = unsplit_chunks(nll), unsplit_chunks(hit), unsplit_chunks(dh)
    dw = dw.T if vocab_major and not vocab_major_dw else dw
    return (jnp.sum(coef * nll), nll, hit), (dh, dw.astype(w_master.dtype), nll, targets)


def _weighted_nll_bwd(chunk, vocab_major, softcap, residuals, cotangents):
    dh, dw, nll, targets = residuals
    ct = cotangents[0]  # the NLL and hit outputs are reported, not differentiated
    zero_targets = np.zeros(targets.shape, dtype=jax.dtypes.float0)
    return (dh * ct.astype(dh.dtype), dw * ct.astype(dw.dtype), zero_targets, nll * ct)


_weighted_nll.defvjp(_weighted_nll_fwd, _weighted_nll_bwd)


def chunk_size(length: int, chunk_len: int | None) -> int:
    """The largest divisor of `length` that is at most `chunk_len` (None or >= length: the whole length). A
    divisor under a quarter of `chunk_len` (e.g. a prime length) would mean a long scan of tiny matmuls, slower
    than one whole-length chunk, so the whole length is used then."""
    if not chunk_len or chunk_len >= length:
        return length
    best = max(d for d in range(1, chunk_len + 1) if length % d == 0)
    return best if 4 * best >= chunk_len else length


def fused_causal_lm_loss(
    hidden_btd: jax.Array,
    head: jax.Array,
    targets_bt: jax.Array,
    loss_mask_bt: jax.Array,
    *,
    vocab_major: bool,
    normalize: str = "tokens",
    chunk_len: int | None = None,
    softcap: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`causal_lm_loss(hidden @ head, targets, loss_mask)` without materialising the logits (module docstring).

    Args:
      hidden_btd: [batch, time, hidden] final-norm hidden states.
      head: the LM head, [vocab, hidden] when `vocab_major` (a tied embedding table), else [hidden, vocab]; in
        hidden's dtype or a float32 master of bf16 hidden states (gradient returned in float32).
      targets_bt, loss_mask_bt: [batch, time] next-token targets and 0/1 mask.
      normalize: "tokens" (mean over supervised tokens) or "sequences" (mean of per-row means).
      chunk_len: at most this many sequence positions per chunk (`chunk_size`); None: the whole sequence.
      softcap: final-logit soft-cap (Gemma 2), or None.

    Returns:
      (loss, metrics) with the keys and meaning of `causal_lm_loss`'s metrics.
    """
    b, t = targets_bt.shape
    chunk = chunk_size(t, chunk_len)
    mask = loss_mask_bt.astype(jnp.float32)
    tokens_b = jnp.sum(mask, axis=-1)
    has_tokens_b = (tokens_b > 0).astype(jnp.float32)
    num_sequences = jnp.sum(has_tokens_b)
    num_tokens = jnp.sum(tokens_b)
    if normalize == "tokens":
        coef = mask / jnp.maximum(num_tokens, 1.0)
    elif normalize == "sequences":
        coef = mask / (jnp.maximum(tokens_b, 1.0) * jnp.maximum(num_sequences, 1.0))[:, None]
    else:
        raise ValueError(f"unknown normalization {normalize!r}")
    loss, nll, hit = _weighted_nll(hidden_btd, head, targets_bt, coef, chunk, vocab_major, softcap)
    nll, hit = jax.lax.stop_gradient(nll), jax.lax.stop_gradient(hit)
    masked_nll = jnp.where(mask > 0, nll, 0.0)
    metrics = {
        "loss": loss,
        "nll_sum": jnp.sum(masked_nll),
        "num_tokens": num_tokens,
        "num_sequences": num_sequences,
        "token_accuracy": jnp.sum(jnp.where(mask > 0, hit, 0.0)) / jnp.maximum(num_tokens, 1.0),
        "per_example_loss": jnp.sum(masked_nll, axis=-1) / jnp.maximum(tokens_b, 1.0),
    }
    return loss, metrics


def lm_head_of(model: Any, *, master: bool = False) -> tuple[jax.Array, bool]:
    """(head weight, vocab_major) of a tempax `Decoder`: the tied embedding table [V, D] or the untied `lm_head`
    kernel [D, V], in the model's compute dtype, or with `master` in its stored dtype (for
    `fused_causal_lm_loss`, which casts it itself and returns its gradient in that dtype)."""
    dtype = jnp.dtype(model.config.dtype)
    weight, vocab_major = ((model.embed_tokens.embedding[...], True) if model.lm_head is None
                           else (model.lm_head.kernel[...], False))
    return (weight if master else weight.astype(dtype)), vocab_major
