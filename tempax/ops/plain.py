"""The default implementations of tempax's ops: plain JAX, as a textbook writes them, for any backend.

Each function here is the definition of its op; the CPU variants (`tempax.ops.cpu`) compute the same function in
the forms XLA:CPU runs fast, and `tempax.ops` chooses between them. Autodiff makes every gradient here except one:
a bfloat16 projection over a float32 master kernel (`train.precision=bf16`) has its backward written out, because
autodiff would round the kernel's gradient, a sum over every token of the batch, to bfloat16 before handing it to
the float32 master (`mixed_precision_project`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

BF16 = jnp.dtype(jnp.bfloat16)


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
    """cap * tanh(x / cap) (Gemma 2's soft-capping of attention scores and final logits); x when cap is None."""
    return x if cap is None else cap * jnp.tanh(x / cap)


# --------------------------------------------------------------------------------------------------------------
# Projections: x [..., in] @ kernel [in, out]


def f32_dot(lhs: jax.Array, rhs: jax.Array, lhs_dim: int, rhs_dim: int) -> jax.Array:
    """lhs x rhs contracting one axis of each, accumulated and returned in float32 (for bf16 operands)."""
    return jax.lax.dot_general(lhs, rhs, (((lhs_dim,), (rhs_dim,)), ((), ())), preferred_element_type=jnp.float32)


def rows(a: jax.Array) -> jax.Array:
    """a [..., n] as [tokens, n]: every leading axis is a token axis of a projection."""
    return a.reshape(-1, a.shape[-1])


def bf16_operands(lhs: jax.Array, rhs: jax.Array) -> bool:
    """A bfloat16 input against a floating kernel (float32 master or bf16): computed as bf16 x bf16 -> float32."""
    return lhs.dtype == BF16 and jnp.issubdtype(rhs.dtype, jnp.floating)


def is_projection(lhs: jax.Array, rhs: jax.Array, dimension_numbers: Any, precision: Any,
                  preferred_element_type: Any, out_sharding: Any) -> bool:
    """Whether a `dot_general` call is a layer's x [..., in] @ kernel [in, out] with nothing else asked of it (no
    precision, output type or sharding): the product whose gradient the projection ops write themselves."""
    plain = (((lhs.ndim - 1,), (0,)), ((), ()))
    return (dimension_numbers == plain and rhs.ndim == 2 and (lhs.dtype == rhs.dtype or bf16_operands(lhs, rhs))
            and precision is None and preferred_element_type in (None, lhs.dtype) and out_sharding is None)


def contract_tokens(x_rows: jax.Array, g_rows: jax.Array) -> jax.Array:
    """d kernel = x^T g [in, out], summed over the tokens in float32: [tokens, in] x [tokens, out]."""
    return f32_dot(x_rows, g_rows, 0, 0)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def mixed_precision_project(x: jax.Array, kernel: jax.Array,
                            weight_gradient: Callable[[jax.Array, jax.Array], jax.Array]) -> jax.Array:
    """y = x @ kernel for bfloat16 x and a floating kernel (the float32 master under `train.precision=bf16`):
    bf16 operands, float32 accumulation, y in x's dtype.

    Backward: d x = g kernel^T in x's dtype; d kernel = `weight_gradient(x rows, g rows)`, a float32 sum over
    the tokens returned in the kernel's dtype, never rounded to bf16 on the way (`contract_tokens`; the CPU
    variant passes the layout XLA:CPU multiplies fastest). The kernel's bf16 copy is made once and kept for the
    backward.
    """
    return _mixed_fwd(x, kernel, weight_gradient)[0]


def _mixed_fwd(x, kernel, weight_gradient):
    xc, wc = x.astype(BF16), kernel.astype(BF16)
    # Zero-size arrays carry the primal dtypes into the backward pass (residuals must be arrays).
    return f32_dot(xc, wc, x.ndim - 1, 0).astype(x.dtype), (xc, wc, jnp.zeros((0,), x.dtype),
                                                             jnp.zeros((0,), kernel.dtype))


def _mixed_bwd(weight_gradient, residuals, g):
    xc, wc, x_like, kernel_like = residuals
    gc = g.astype(BF16)
    d_x = f32_dot(gc, wc, gc.ndim - 1, 1).astype(x_like.dtype)
    d_kernel = weight_gradient(rows(xc), rows(gc)).astype(kernel_like.dtype)
    return d_x, d_kernel


mixed_precision_project.defvjp(_mixed_fwd, _mixed_bwd)


def projection_dot(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, out_sharding=None):
    """`lax.dot_general` with a layer's calling convention (`nnx.Linear(dot_general=...)`): autodiff of the plain
    product, except that a bfloat16 x over a float32 master kernel goes through `mixed_precision_project`.
    Any other bf16 product casts the kernel to bf16 first."""
    bf16 = bf16_operands(lhs, rhs)
    if bf16 and is_projection(lhs, rhs, dimension_numbers, precision, preferred_element_type, out_sharding):
        return mixed_precision_project(lhs, rhs, contract_tokens)
    return jax.lax.dot_general(lhs, rhs.astype(lhs.dtype) if bf16 else rhs, dimension_numbers,
                               precision=precision, preferred_element_type=preferred_element_type,
                               out_sharding=out_sharding)


def keep_kernel_dtype(arrays: tuple[Any, ...], *, dtype: Any = None, inexact: bool = True) -> tuple[Any, ...]:
    """`nnx.Linear(promote_dtype=...)` for bf16 compute: casts the input (and bias) to `dtype` and leaves the
    kernel in its float32 master dtype, so the projection returns the kernel's gradient in float32."""
    del inexact
    inputs, kernel, *rest = arrays
    cast = lambda a: a if a is None or dtype is None else jnp.asarray(a, dtype)  # noqa: E731
    return (cast(inputs), kernel, *(cast(a) for a in rest))


# --------------------------------------------------------------------------------------------------------------
# The gated MLP's hidden state


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
    """silu (SwiGLU) or tanh-approximated gelu (GeGLU, Gemma)."""
    return jax.nn.silu if name == "silu" else (lambda x: jax.nn.gelu(x, approximate=True))


def gated(gate: jax.Array, up: jax.Array, activation_name: str) -> jax.Array:
    """act(gate) * up, the gated MLP's hidden state."""
    return activation(activation_name)(gate) * up


# --------------------------------------------------------------------------------------------------------------
# Attention


def attention_mask(q_index: jax.Array, k_index: jax.Array, q_segments: jax.Array, k_segments: jax.Array,
                   window: int | None, window_on: jax.Array | None = None) -> jax.Array:
    """[B, T, S] bool: query i in segment s sees key j when j <= i, segment(j) == s != 0 and (window) i - j <
    window. `window_on` (a traced bool scalar, or None for always): whether the window applies, for a layer
    stack that mixes full and sliding layers under one scan."""
    visible = k_index[None, :] <= q_index[:, None]  # [T, S]
    if window is not None:
        inside = (q_index[:, None] - k_index[None, :]) < window
        visible &= inside if window_on is None else (inside | ~window_on)
    same = (q_segments[:, :, None] == k_segments[:, None, :]) & (k_segments[:, None, :] != 0)  # [B, T, S]
    return visible[None] & same


def attention_probs(q_btnh: jax.Array, k: jax.Array, mask: jax.Array, *, scale: float, logit_cap: float | None,
                    kv_layout: str, dtype: Any, sinks: jax.Array | None = None) -> jax.Array:
    """p = softmax(mask(softcap(q k^T * scale))) [B, K, G, T, S] in `dtype`, the query heads grouped by the kv
    head they share (G = N / K). k is [B, S, K, H] (`kv_layout` "bskh") or [B, K, S, H] ("bksh", the KV cache's
    layout). Scores and softmax are in float32; a fully masked row (padding) gets a uniform, finite
    distribution.

    `sinks` [N] (gpt-oss's attention sinks, one learned logit per query head): the softmax's denominator also
    holds exp(sink_n), p_j = exp(s_j) / (exp(sink_n) + sum_i exp(s_i)), so a head's weights may sum to less than
    one (Xiao et al. 2023, arXiv:2309.17453, with the sink a parameter instead of a token); a fully masked row
    then gives all its weight to the sink and attends to nothing."""
    b, t, n, h = q_btnh.shape
    kh = k.shape[kv_layout.index("k")]
    q = q_btnh.reshape(b, t, kh, n // kh, h)
    scores = jnp.einsum(f"btkgh,{kv_layout}->bkgts", q, k, preferred_element_type=jnp.float32) * scale
    scores = softcap(scores, logit_cap)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    if sinks is None:
        return jax.nn.softmax(scores, axis=-1).astype(dtype)
    sink = sinks.astype(jnp.float32).reshape(1, kh, n // kh, 1, 1)
    with_sink = jnp.concatenate([scores, jnp.broadcast_to(sink, (*scores.shape[:-1], 1))], axis=-1)
    return jax.nn.softmax(with_sink, axis=-1)[..., :-1].astype(dtype)


def attention(q_btnh: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, scale: float,
              logit_cap: float | None, kv_layout: str, sinks: jax.Array | None = None) -> jax.Array:
    """Grouped-query attention p v with p from `attention_probs` (with `sinks`, if given): q [B, T, N, H], k and v
    in `kv_layout`, the result [B, T, N, H]."""
    b, t, n, h = q_btnh.shape
    probs = attention_probs(q_btnh, k, mask, scale=scale, logit_cap=logit_cap, kv_layout=kv_layout, dtype=v.dtype,
                            sinks=sinks)
    return jnp.einsum(f"bkgts,{kv_layout}->btkgh", probs, v).reshape(b, t, n, h)


def library_attention(q_btnh: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, scale: float,
                      implementation: str) -> jax.Array:
    """`attention`'s result (no soft-capping) from `jax.nn.dot_product_attention`: XLA's version ("xla") or
    cuDNN's fused flash attention ("cudnn", NVIDIA GPUs), chosen by `ModelConfig.attention_impl`.

    q [B, T, N, H], k and v [B, S, K, H] (grouped heads: K divides N), `mask` [B, T, S] from `attention_mask`;
    rows it masks entirely (padding) come out finite, as in `attention`.
    """
    return jax.nn.dot_product_attention(q_btnh, k, v, mask=mask[:, None], scale=scale,
                                        implementation=implementation)


# --------------------------------------------------------------------------------------------------------------
# The tied LM head


def tied_lm_head(hidden: jax.Array, table: jax.Array) -> jax.Array:
    """Logits h @ E^T of a head tied to the embedding table E [vocab, hidden] (what `nnx.Embed.attend` computes)."""
    return jnp.dot(hidden, table.T)
