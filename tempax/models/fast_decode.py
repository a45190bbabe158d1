"""Decode-time weight layout for CPUs: every projection as one [out, in] matrix, fused where inputs are shared.

A decode step multiplies a handful of rows (the batch) by every weight matrix once, so its speed is how fast
the weights stream from memory. XLA:CPU's matrix kernels stream a weight far faster when it is the *left*
operand of an [out, in] x [in, rows] product than as the right operand of the usual [rows, in] x [in, out] one
(they pack the right operand before multiplying). Measured on the 2-core development machine, float32, 8 rows,
distinct matrices (`bench/decode_matmul.py`): [576, 1536] 0.81 -> 0.40 ms a product, [1536, 576] 0.73 -> 0.31 ms,
the tied [49152, 576] LM head 32 -> 10.5 ms.

`DecodeWeights` holds those matrices, made from the model's frozen base weights and read by every step of the
decode loop; LoRA adapters stay separate (`adapted`: two thin products a projection), so a LoRA policy whose
adapters change every RL step reuses the same base matrices (the engine keeps the last ones made, see
`tempax.generate.engine`). The q/k/v projections share their input and become one matrix, as do gate/up; a
tied LM head is the embedding table itself and costs no copy. The price is a second copy of the projection
weights, which is why the engine uses it only on CPU and never for a quantized base (its point is to stay
small).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class LayerDecodeWeights:
    """One decoder layer's projections, each [out, in] (biases [out] or None).

    qkv: rows [0, Nq) are q_proj, then k_proj, then v_proj. gate_up: gate_proj rows, then up_proj rows.
    """

    qkv: jax.Array
    qkv_bias: jax.Array | None
    o: jax.Array
    o_bias: jax.Array | None
    gate_up: jax.Array
    gate_up_bias: jax.Array | None
    down: jax.Array
    down_bias: jax.Array | None


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class DecodeWeights:
    """Every layer's `LayerDecodeWeights` and the LM head as [vocab, hidden]."""

    layers: tuple[LayerDecodeWeights, ...]
    head: jax.Array


def project(x: jax.Array, weight_out_in: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """x [..., in] @ weight_out_in.T + bias, computed as weight [out, in] @ x.T with the weight on the left.

    The optimization barrier keeps XLA from folding the final transpose back into the product, which would
    turn it into the slow [rows, in] x [in, out] form again.
    """
    lead, d_in = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, d_in).astype(weight_out_in.dtype)
    out_rows = jax.lax.optimization_barrier(weight_out_in @ rows.T)  # [out, rows]
    y = out_rows.T.reshape(*lead, weight_out_in.shape[0])
    return y if bias is None else y + bias.astype(y.dtype)


def adapted(layer: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    """y plus the layer's adapter output on x, when it has one (a `LoraLinear`)."""
    adapter = getattr(layer, "adapter", None)
    return y if adapter is None else y + adapter(x).astype(y.dtype)


def project_each(
    x: jax.Array, layers: list[Any], weight: jax.Array, bias: jax.Array | None, sizes: list[int]
) -> list[jax.Array]:
    """The outputs of `layers` (which share the input x, and whose out sizes are `sizes`) from their stacked
    decode-layout `weight` and `bias` (see `stacked`), each plus its own adapter."""
    outs = jnp.split(project(x, weight, bias), list(np.cumsum(sizes)[:-1]), axis=-1)
    return [adapted(layer, x, out) for layer, out in zip(layers, outs)]


def out_in_kernel(layer: Any) -> jax.Array | None:
    """The [out, in] float kernel a linear-like layer applies, or None when it has none to give.

    A layer may define `decode_kernel()` ([in, out] base kernel, adapters excluded; None for a quantized base); a
    plain `nnx.Linear` gives its own kernel.
    """
    own = getattr(layer, "decode_kernel", None)
    kernel = own() if own is not None else layer.kernel[...]
    return None if kernel is None else kernel.T


def layer_bias(layer: Any) -> jax.Array | None:
    base = getattr(layer, "base_layer", layer)
    bias = getattr(base, "bias", None)
    return None if bias is None else bias[...]


def stacked(layers: list[Any], dtype: Any) -> tuple[jax.Array | None, jax.Array | None]:
    """The [out, in] kernels of layers that share an input, stacked along out and cast to the compute `dtype`
    (None if any has none)."""
    kernels = [out_in_kernel(layer) for layer in layers]
    if any(k is None for k in kernels):
        return None, None
    kernels = [k.astype(dtype) for k in kernels]
    biases = [layer_bias(layer) for layer in layers]
    if all(b is None for b in biases):
        bias = None
    else:
        bias = jnp.concatenate(
            [b if b is not None else jnp.zeros((k.shape[0],), k.dtype) for b, k in zip(biases, kernels)]
        )
    return jnp.concatenate(kernels, axis=0), bias
