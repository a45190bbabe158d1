"""Attention in the forms XLA:CPU runs fast: training attention at bfloat16 (`bf16_attention`) and one decode
step over the cache (`decode_step_attention`). Both compute `tempax.ops.plain.attention` (tests/ops/test_ops.py,
tests/ops/cpu/test_attention.py); why each form is faster on XLA:CPU is said at each function, and the figures
are in `docs/measurements/performance-history.md` (`python bench/attention.py`).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from tempax.ops.plain import BF16, attention_probs


def _bdot(lhs: jax.Array, rhs: jax.Array, lhs_dim: int, rhs_dim: int) -> jax.Array:
    """Batched (over the leading B, K axes) bf16 x bf16 -> float32 product contracting lhs_dim with rhs_dim."""
    return jax.lax.dot_general(lhs, rhs, (((lhs_dim,), (rhs_dim,)), ((0, 1), (0, 1))),
                               preferred_element_type=jnp.float32)


def _row_major(x: jax.Array) -> jax.Array:
    """x materialised in row-major layout. XLA gives a transpose's result the layout that makes it a bitcast of
    its input, and XLA:CPU's bf16 dot check (which runs before layout assignment) refuses an operand in such a
    layout and upcasts the dot to float32. Reversing an axis twice is the identity, but the check runs before the
    simplifier removes it, so it sees a row-major operand; one copy remains (of a [.., H]-sized array here)."""
    return jnp.flip(jnp.flip(x, -1), -1)


def _minor_transpose(x: jax.Array) -> jax.Array:
    """x [B, K, M, H] as [B, K, H, M], row-major (a plain swapaxes would also be folded into the dot's dimension
    numbers, putting the contracting axis major again)."""
    return _row_major(x.swapaxes(2, 3))


def _scores(q, k, scale, cap):
    """float32 scores [B, K, GT, S] before masking, and tanh(raw / cap) when soft-capped (for the gradient)."""
    raw = _bdot(q, k, 3, 3) * scale
    if cap is None:
        return raw, None
    t = jnp.tanh(raw / cap)
    return cap * t, t


def _probs(q, k, mask, scale, cap, g):
    b, kh, gt, s = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    scores, t = _scores(q, k, scale, cap)
    scores = jnp.where(mask[:, None, None], scores.reshape(b, kh, g, gt // g, s), jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(scores, axis=-1).reshape(b, kh, gt, s), t


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _attend(q, k, v, mask, scale, cap, g):
    """q [B, K, GT, H], k and v [B, K, S, H] (bf16), mask [B, T, S] -> out [B, K, GT, H] (bf16)."""
    return _attend_fwd(q, k, v, mask, scale, cap, g)[0]


def _attend_fwd(q, k, v, mask, scale, cap, g):
    probs, _ = _probs(q, k, mask, scale, cap, g)
    p = probs.astype(BF16)
    return _bdot(p, v, 3, 2).astype(BF16), (q, k, v, mask, p)


def _attend_bwd(scale, cap, g, residuals, d_out):
    q, k, v, mask, p = residuals
    b, kh, gt, s = p.shape
    do = d_out.astype(BF16)
    dp = _bdot(do, v, 3, 3)  # [B, K, GT, S]
    p32 = p.astype(jnp.float32)
    ds = p32 * (dp - jnp.sum(p32 * dp, axis=-1, keepdims=True))  # d scores, after masking
    ds = jnp.where(mask[:, None, None], ds.reshape(b, kh, g, gt // g, s), 0.0).reshape(b, kh, gt, s)
    if cap is not None:
        _, t = _scores(q, k, scale, cap)  # recomputed: cheaper than keeping [GT, S] float32 per layer
        ds = ds * (1.0 - t * t)
    ds = (ds * scale).astype(BF16)
    dq = _bdot(ds, k, 3, 2)  # [B, K, GT, H]
    dk_t, dv_t = jax.lax.optimization_barrier((_bdot(_minor_transpose(q), ds, 3, 2),
                                               _bdot(_minor_transpose(do), p, 3, 2)))  # [B, K, H, S]
    dk, dv = dk_t.swapaxes(2, 3), dv_t.swapaxes(2, 3)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_attend.defvjp(_attend_fwd, _attend_bwd)


def bf16_attention(q_btnh: jax.Array, k_bskh: jax.Array, v_bskh: jax.Array, mask_bts: jax.Array, *, scale: float,
                   logit_cap: float | None) -> jax.Array:
    """softmax(mask(softcap(q k^T * scale))) v for bf16 q [B, T, N, H], k and v [B, S, K, H] and a boolean
    mask [B, T, S] (True = visible; a fully masked row gets a uniform distribution), with every product, forward
    and backward, a bf16 x bf16 -> float32 dot in the form XLA:CPU runs on its bf16 kernels. Returns
    [B, T, N, H] bf16 (`train.precision=bf16`).

    XLA:CPU (jaxlib 0.10) runs a bf16 dot at bf16 speed only when the dot asks for a float32 result and its left
    operand's contracting axis is the minor one (`tempax.ops.cpu.matmul`); otherwise it upcasts both operands to
    float32 first, which is slower than float32 throughout. Plain autodiff of the einsum attention at bf16 misses
    this on every product: p @ v asks for a bf16 result, and the backward mixes float32 cotangents with bf16
    operands and contracts the query or key axis of the [T, S] arrays. So this is a custom VJP with heads first
    ([B, K, G*T, H] for the queries of a kv group, [B, K, S, H] for keys and values), each of the six products
    contracting the left operand's minor axis with no copy of a [T, S] array:

        scores  = q k^T        [GT, H] x [S, H]  -> [GT, S]   (contract H)
        out     = p v          [GT, S] x [S, H]  -> [GT, H]   (contract S)
        dp      = do v^T       [GT, H] x [S, H]  -> [GT, S]   (contract H)
        dq      = ds k         [GT, S] x [S, H]  -> [GT, H]   (contract S)
        dk^T    = q^T ds       [H, GT] x [GT, S] -> [H, S]    (contract GT)
        dv^T    = do^T p       [H, GT] x [GT, S] -> [H, S]    (contract GT)

    Only the small [GT, H] / [S, H] arrays are transposed (q and do to [H, GT], dk and dv back), each materialised
    row-major (`_row_major`): XLA:CPU refuses a bf16 dot whose operand has a transpose's bitcast layout and
    upcasts it instead. dk and dv sit behind an optimization barrier, or XLA folds their transposes back into the
    dots by swapping the operands (ds then contracts its major axis, and the dot fails at run time as a bf16
    `DotThunk`). Softmax and its gradient are in float32: ds = p * (dp - sum_s(p * dp)), then the soft-cap's
    factor 1 - tanh^2 and the scale; p and ds are rounded to bf16 for the products, whose sums accumulate in
    float32. Residuals: q, k, v (bf16) and p (bf16, [GT, S]); soft-capped scores are recomputed."""
    b, t, n, h = q_btnh.shape
    kh = k_bskh.shape[2]
    g = n // kh
    q = q_btnh.reshape(b, t, kh, g, h).transpose(0, 2, 3, 1, 4).reshape(b, kh, g * t, h)
    k, v = _row_major(k_bskh.swapaxes(1, 2)), _row_major(v_bskh.swapaxes(1, 2))
    out = _attend(q, k, v, mask_bts, scale, logit_cap, g)  # [B, K, G*T, H]
    return out.reshape(b, kh, g, t, h).transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


def decode_step_attention(q_btnh: jax.Array, k_bksh: jax.Array, v_bksh: jax.Array, mask_bts: jax.Array, *,
                          scale: float, logit_cap: float | None) -> jax.Array:
    """`tempax.ops.plain.attention` of one query position (T = 1) over the KV cache's [B, K, S, H] keys and
    values, p v made as a multiply-and-sum over S. Returns [B, 1, N, H]. XLA:CPU runs the [G, S] x [S, H]
    product p v of one query per (batch, kv head) as a plain dot thunk that streams the cache slowly; a
    multiply-and-sum over S reads the cache once as one fused loop."""
    b, t, n, h = q_btnh.shape
    probs = attention_probs(q_btnh, k_bksh, mask_bts, scale=scale, logit_cap=logit_cap, kv_layout="bksh",
                            dtype=v_bksh.dtype)  # [B, K, G, 1, S]
    out = jnp.sum(probs[:, :, :, 0, :, None] * v_bksh[:, :, None], axis=3)[:, None]  # [B, 1, K, G, H]
    return out.reshape(b, t, n, h)
