"""The LM head and the causal-LM cross-entropy fused, computed over sequence chunks, with the gradient formed in
the forward pass.

`causal_lm_loss(logits, ...)` needs the [B, T, V] float32 logits, and autodiff then keeps them (or their softmax)
for the backward pass and writes a second [B, T, V] array for d loss / d logits: 4 B T V bytes per copy (at
V = 49k and 2k tokens per micro-batch, several hundred MB) and several memory passes. Because the loss is linear
in the per-token NLLs with coefficients known up front (the loss mask over its normaliser), the gradient with
respect to the logits is known as soon as they are:

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

Two steps have more than one form (`HeadForms`): each chunk's softmax and how dL/dW is summed. The plain forms
here compute exp once more and sum dL/dW in the head's own layout; `tempax.ops.cpu.lm_head.CPU_FORMS` are the
ones XLA:CPU runs fast. `tempax.ops.fused_causal_lm_loss` passes the forms of the platform's variant.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from tempax.ops.plain import BF16


def head_logits(h: jax.Array, w: jax.Array, vocab_major: bool) -> jax.Array:
    """h [..., D] times the head: W [V, D] (vocab_major, a tied embedding) or [D, V]; float32 result."""
    dims = ((h.ndim - 1,), (1,) if vocab_major else (0,))
    return jax.lax.dot_general(h, w, (dims, ((), ())), preferred_element_type=jnp.float32)


def logsumexp_from_max(z: jax.Array, m: jax.Array) -> jax.Array:
    """logsumexp(z) over the last axis, given its max m: m + log(sum(exp(z - m)))."""
    return m + jnp.log(jnp.sum(jnp.exp(z - m[..., None]), axis=-1))


class HeadForms:
    """How the fused head forms a chunk's softmax and sums dL/dW: the plain forms (any backend).

    The sum of dL/dW over chunks is kept in `gradient_shape` and returned in the head's layout by
    `head_gradient`; here it is the head's own layout throughout.
    """

    def softmax(self, z: jax.Array, m: jax.Array, dtype: jnp.dtype) -> tuple[jax.Array, jax.Array | None]:
        """(logsumexp(z), softmax(z) or None) of a chunk's float32 logits z with max m; `dtype` is the hidden
        states'. None: the caller forms softmax(z) = exp(z - lse)."""
        del dtype
        return logsumexp_from_max(z, m), None

    def gradient_shape(self, w_shape: tuple[int, ...], vocab_major: bool, dtype: jnp.dtype) -> tuple[int, ...]:
        """The shape of the float32 sum of dL/dW over chunks."""
        del vocab_major, dtype
        return w_shape

    def gradient_chunk(self, hc: jax.Array, g: jax.Array, vocab_major: bool) -> jax.Array:
        """One chunk's dL/dW from h [B, C, D] and dL/dz g [B, C, V], summed over batch and chunk positions."""
        return jnp.einsum("bcd,bcv->vd" if vocab_major else "bcd,bcv->dv", hc, g, preferred_element_type=jnp.float32)

    def head_gradient(self, dw: jax.Array, vocab_major: bool, dtype: jnp.dtype) -> jax.Array:
        """The summed dL/dW in the head's layout ([V, D] when vocab_major, else [D, V])."""
        del vocab_major, dtype
        return dw


PLAIN_FORMS = HeadForms()


def _chunk_stats(h, w, targets, vocab_major, softcap):
    """(z, capped tanh or None, target logit, max) for one chunk; z is [B, C, V] float32."""
    z = head_logits(h, w, vocab_major)
    y = None
    if softcap is not None:
        y = jnp.tanh(z / softcap)
        z = softcap * y
    m = jnp.max(z, axis=-1)
    zt = jnp.take_along_axis(z, targets[..., None].astype(jnp.int32), axis=-1, mode="clip")[..., 0]
    return z, y, zt, m


def split_chunks(x: jax.Array, chunk: int) -> jax.Array:
    """[B, T, ...] -> [T / chunk, B, chunk, ...]: scan over sequence chunks, the (sharded) batch axis kept."""
    b, t = x.shape[:2]
    return x.reshape(b, t // chunk, chunk, *x.shape[2:]).swapaxes(0, 1)


def unsplit_chunks(x: jax.Array) -> jax.Array:
    n, b, c = x.shape[:3]
    return x.swapaxes(0, 1).reshape(b, n * c, *x.shape[3:])


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _weighted_nll(h, w, targets, coef, chunk, vocab_major, softcap, forms):
    """(sum c_i nll_i, nll [B, T], hit [B, T]); only the first output is differentiable. `w` may be a float32
    master of a lower-precision `h` (module docstring)."""
    w = w.astype(h.dtype)

    def body(_, xs):
        hc, tc = xs
        z, _, zt, m = _chunk_stats(hc, w, tc, vocab_major, softcap)
        lse = logsumexp_from_max(z, m)
        return None, (lse - zt, (zt >= m).astype(jnp.float32))

    _, (nll, hit) = jax.lax.scan(body, None, (split_chunks(h, chunk), split_chunks(targets, chunk)))
    nll, hit = unsplit_chunks(nll), unsplit_chunks(hit)
    return jnp.sum(coef * nll), nll, hit


def _weighted_nll_fwd(h, w_master, targets, coef, chunk, vocab_major, softcap, forms):
    w = w_master.astype(h.dtype)  # the compute copy, made once for every chunk

    def body(dw, xs):
        hc, tc, cc = xs
        z, y, zt, m = _chunk_stats(hc, w, tc, vocab_major, softcap)
        lse, p = forms.softmax(z, m, hc.dtype)
        vocab = jax.lax.broadcasted_iota(jnp.int32, z.shape, z.ndim - 1)
        p = jnp.exp(z - lse[..., None]) if p is None else p
        g = (p - (vocab == tc[..., None]).astype(jnp.float32)) * cc[..., None]
        if y is not None:
            g = g * (1.0 - y * y)
        g = g.astype(hc.dtype)
        # dL/dh = g W^T; dL/dW = h^T g (or g^T h for a [V, D] head), summed over batch and chunk positions.
        dh = jax.lax.dot_general(g, w, (((g.ndim - 1,), (0,) if vocab_major else (1,)), ((), ())),
                                 preferred_element_type=jnp.float32).astype(hc.dtype)
        return dw + forms.gradient_chunk(hc, g, vocab_major), (lse - zt, (zt >= m).astype(jnp.float32), dh)

    dw0 = jnp.zeros(forms.gradient_shape(w.shape, vocab_major, h.dtype), jnp.float32)
    dw, (nll, hit, dh) = jax.lax.scan(body, dw0, (split_chunks(h, chunk), split_chunks(targets, chunk), split_chunks(coef, chunk)))
    nll, hit, dh = unsplit_chunks(nll), unsplit_chunks(hit), unsplit_chunks(dh)
    dw = forms.head_gradient(dw, vocab_major, h.dtype)
    return (jnp.sum(coef * nll), nll, hit), (dh, dw.astype(w_master.dtype), nll, targets)


def _weighted_nll_bwd(chunk, vocab_major, softcap, forms, residuals, cotangents):
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


def fused_causal_lm_loss(forms: HeadForms, hidden_btd: jax.Array, head: jax.Array, targets_bt: jax.Array,
                         loss_mask_bt: jax.Array, vocab_major: bool, normalize: str, chunk_len: int | None,
                         softcap: float | None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`tempax.ops.fused_causal_lm_loss` (whose docstring gives the arguments) with the softmax and dL/dW formed
    by `forms`: `PLAIN_FORMS`, or the CPU variant's."""
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
    loss, nll, hit = _weighted_nll(hidden_btd, head, targets_bt, coef, chunk, vocab_major, softcap, forms)
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

