"""RMSNorm, the norm of every decoder family here: the decoder's layers and a mixture of experts' block
(`tempax.models.moe.SparseMoeBlock`, Gemma 4's norms around its experts) build it."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx


class RMSNorm(nnx.Module):
    """y = x / sqrt(mean(x^2) + eps) * w, or * (1 + w) for Gemma (`offset`); computed in float32."""

    def __init__(self, dim: int, *, eps: float, offset: bool, param_dtype: Any, rngs: nnx.Rngs):
        init = nnx.initializers.zeros if offset else nnx.initializers.ones
        self.weight = nnx.Param(nnx.with_partitioning(init, ("norm",))(rngs.params(), (dim,), param_dtype))
        self.eps = eps
        self.offset = offset

    def __call__(self, x: jax.Array) -> jax.Array:
        w = self.weight[...].astype(jnp.float32)
        if self.offset:
            w = 1.0 + w
        return (rms_normalized(x, self.eps) * w).astype(x.dtype)


def rms_normalized(x: jax.Array, eps: float) -> jax.Array:
    """x / sqrt(mean(x^2) + eps) over the last axis, in float32 (an RMSNorm without a weight)."""
    x32 = x.astype(jnp.float32)
    return x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)


__all__ = ["RMSNorm", "rms_normalized"]
