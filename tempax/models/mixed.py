"""Mixed-precision linear layers: bfloat16 operands, float32 accumulation, float32 weight gradients.

A `Linear` y = x W under `train.precision=bf16` runs three matmuls per step, each as bf16 x bf16 with float32
accumulation (`preferred_element_type=float32`):

    y  = x W                 forward                  [M, K] x [K, N]
    dx = dy W^T              input gradient           [M, N] x [K, N]^T
    dW = x^T dy              weight gradient          [K, M] x [M, N]   (float32 result, the master's dtype)

This is PyTorch autocast's arithmetic (bf16 operands, f32 accumulation), except that dW comes out in float32
directly instead of being rounded to bf16 and cast back. The float32 master kernel is cast to bf16 once per
step: the backward pass reuses the forward's bf16 copy (a residual), so the cast is never repeated per use.

Why a custom VJP rather than `nnx.Linear(dtype=bfloat16)` and autodiff: XLA:CPU (jaxlib 0.10) runs a bf16 dot
at bf16 speed only when the dot asks for a float32 result and its left operand's contracting dimension is the
minor (last) one in memory; any other bf16 dot is upcast to float32 operands first. Measured on the bench-small
shapes (AMD EPYC Zen 5, avx512_bf16, 2 cores; /work/notes/issue-18-bf16.md): [2048, 576] x [576, 1536] runs
~1000 GFLOP/s as bf16 -> f32 against ~490 in float32, ~450 as bf16 -> bf16 (upcast), and the autodiff form of
the weight gradient (contracting the token axis, dimension 0 of both operands) ~430. Flax's Linear asks for a
bf16 result, and autodiff's weight gradient contracts dimension 0, so both lose. Here every dot asks for float32
and the weight gradient's left operand is x^T laid out contiguously (`_contiguous_transpose`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

COMPUTE_DTYPE = jnp.bfloat16


def _contiguous_transpose(x_mk: jax.Array) -> jax.Array:
    """x^T [K, M] materialised in row-major order.

    A plain `x.T` feeding a dot is folded into the dot's dimension numbers (or given a column-major layout),
    which puts the contracting axis back in the major position and sends the dot to the upcast float32 path.
    Reversing an axis twice is the identity, but XLA:CPU's bf16 dot check runs before the simplifier removes
    the pair, so the check sees a row-major [K, M] operand; what remains after simplification is one
    transposing copy (M * K bf16 elements, small next to the matmul). `tests/models/test_mixed.py` checks the
    compiled gradient for float32 upcasts, so a jaxlib that changes this is caught.
    """
    return jnp.flip(jnp.flip(x_mk.T, 1), 1)


def _dot(lhs: jax.Array, rhs: jax.Array, lhs_dim: int, rhs_dim: int, out_sharding: Any = None) -> jax.Array:
    dims = (((lhs_dim,), (rhs_dim,)), ((), ()))
    kw = {} if out_sharding is None else {"out_sharding": out_sharding}
    return lax.dot_general(lhs, rhs, dims, preferred_element_type=jnp.float32, **kw)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def mixed_linear(x: jax.Array, w: jax.Array, out_dtype: Any) -> jax.Array:
    """x [..., K] @ w [K, N] with bf16 operands and float32 accumulation, returned as `out_dtype`.

    Gradients (module docstring): dx in x's dtype, dw in w's dtype (float32 for a float32 master kernel).
    """
    return _dot(x.astype(COMPUTE_DTYPE), w.astype(COMPUTE_DTYPE), x.ndim - 1, 0).astype(out_dtype)


def _mixed_linear_fwd(x, w, out_dtype):
    xc, wc = x.astype(COMPUTE_DTYPE), w.astype(COMPUTE_DTYPE)
    y = _dot(xc, wc, x.ndim - 1, 0).astype(out_dtype)
    # Zero-size arrays carry the primal dtypes into the backward pass (residuals must be arrays).
    return y, (xc, wc, jnp.zeros((0,), x.dtype), jnp.zeros((0,), w.dtype))


def _mixed_linear_bwd(out_dtype, residuals, g):
    xc, wc, x_like, w_like = residuals
    gc = g.astype(COMPUTE_DTYPE)
    dx = _dot(gc, wc, gc.ndim - 1, 1).astype(x_like.dtype)
    k, n = wc.shape
    dw = _dot(_contiguous_transpose(xc.reshape(-1, k)), gc.reshape(-1, n), 1, 0).astype(w_like.dtype)
    return dx, dw


mixed_linear.defvjp(_mixed_linear_fwd, _mixed_linear_bwd)


def mixed_dot_general(
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers: Any,
    precision: Any = None,
    preferred_element_type: Any = None,
    out_sharding: Any = None,
) -> jax.Array:
    """A `dot_general` for `nnx.Linear(dot_general=...)`: the layer's x [..., K] @ kernel [K, N] as
    `mixed_linear`. The result takes `preferred_element_type`, else the input's dtype (the layer's compute
    dtype after Flax's promotion). `precision` is ignored: the operands are bf16 by construction."""
    del precision
    (lhs_c, rhs_c), (lhs_b, rhs_b) = dimension_numbers
    if lhs_b or rhs_b or tuple(lhs_c) != (lhs.ndim - 1,) or tuple(rhs_c) != (0,) or rhs.ndim != 2:
        raise ValueError(f"mixed_dot_general computes x[..., K] @ w[K, N] only, got {dimension_numbers}")
    y = mixed_linear(lhs, rhs, jnp.dtype(preferred_element_type or lhs.dtype))
    return y if out_sharding is None else jax.sharding.reshard(y, out_sharding)


def promote_inputs(arrays: tuple[Any, ...], *, dtype: Any = None, inexact: bool = True) -> tuple[Any, ...]:
    """`nnx.Linear(promote_dtype=...)` that casts the input (and bias) to the compute dtype but leaves the
    kernel in its float32 master dtype, so `mixed_dot_general` returns a float32 weight gradient."""
    del inexact
    inputs, kernel, *rest = arrays
    cast = lambda a: a if a is None or dtype is None else jnp.asarray(a, dtype)  # noqa: E731
    return (cast(inputs), kernel, *(cast(a) for a in rest))
