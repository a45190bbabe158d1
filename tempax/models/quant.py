"""Blockwise weight quantization (4-bit NormalFloat and int8) for QLoRA's frozen base weights.

`quantize_blockwise` stores each block of a kernel as small codes plus one float32 scale (it holds the formulas,
the paper, the storage cost and why not qwix); `QuantizedLinear` is the frozen layer that holds them, and
`quantized_matmul` recomputes the dequantized kernel in the backward pass, so no float copy of the base model
stays alive from the forward to the backward pass.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tempax.errors import ConfigError

QuantKind = Literal["nf4", "int8"]
QUANT_KINDS: tuple[str, ...] = ("nf4", "int8")

# QLoRA Appendix E (Dettmers et al. 2023, arXiv:2305.14314): the 4-bit NormalFloat levels, ascending.
NF4_LEVELS = np.array(
    [
        -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
        -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
        0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
        0.7229568362236023, 1.0,
    ],
    dtype=np.float32,
)
# A value is coded as the nearest level: the number of midpoints below it.
_NF4_MIDPOINTS = (NF4_LEVELS[1:] + NF4_LEVELS[:-1]) / 2


class QuantizedWeight(nnx.Variable):
    """Frozen quantized storage (codes or scales). Not an `nnx.Param`, so `nnx.Param` filters and optimizers skip it."""


def _padded_rows(in_features: int, block_size: int) -> int:
    return -(-in_features // block_size) * block_size


def _check_block_size(kind: str, block_size: int) -> None:
    if kind not in QUANT_KINDS:
        raise ConfigError(f"quantization kind {kind!r} is not supported; use one of {', '.join(QUANT_KINDS)}")
    if block_size <= 0 or (kind == "nf4" and block_size % 2):
        raise ConfigError(f"quantization block_size must be a positive even number, got {block_size}")


@functools.partial(jax.jit, static_argnames=("kind", "block_size"))
def quantize_blockwise(w_io: jax.Array, *, kind: QuantKind, block_size: int = 64) -> tuple[jax.Array, jax.Array]:
    """Quantizes a kernel [in, out] blockwise along `in`.

    A linear kernel W [in, out] is cut into blocks of `block_size` consecutive input rows per output column, and each
    block is stored as codes plus one float32 scale s = max|w| over the block (absmax scaling):

        nf4:  w ~= s * NF4[code],      code in 0..15, two codes packed per uint8   (Dettmers et al. 2023, QLoRA)
        int8: w ~= s / 127 * code,     code in -127..127

    NF4 levels are the 16 values of QLoRA Appendix E: quantiles of N(0, 1) rescaled to [-1, 1], with an exact 0, so a
    normally distributed block loses as little as possible. A code is the nearest level to w / s.

    Storage per weight: nf4 4 bits + 32 / block_size bits of scale (4.5 bits at block 64, 4.5 / 16 of bfloat16's bytes);
    int8 8.5 bits. The input dimension is zero-padded to a multiple of `block_size` (padding never raises a block's
    absmax) and cut off again when dequantizing.

    What we do differently from QLoRA: no second ("double") quantization of the scales (it saves 0.37 bits per
    weight at the price of another lookup per block).

    Why not qwix (`weight_qtype="nf4"`), measured with qwix 0.1.8 on jax 0.10.2 / XLA:CPU: qwix stores NF4 codes as
    `jnp.uint4`, which occupies one byte per element (`on_device_size_in_bytes` of a 1024 x 1024 uint4 array is
    1,048,576), so its NF4 kernels take (8 + 0.5) / 16 of bfloat16's bytes instead of 4.5 / 16.

    Returns:
      codes: nf4: uint8 [in_padded / 2, out], row 2i in the low nibble and row 2i + 1 in the high nibble;
        int8: int8 [in_padded, out].
      scale: float32 [in_padded / block_size, out], the absmax of each block.
    """
    _check_block_size(kind, block_size)
    n_in, n_out = w_io.shape
    rows = _padded_rows(n_in, block_size)
    w = jnp.pad(w_io.astype(jnp.float32), ((0, rows - n_in), (0, 0)))
    blocks = w.reshape(rows // block_size, block_size, n_out)
    absmax = jnp.max(jnp.abs(blocks), axis=1)  # [blocks, out]
    # An all-zero block keeps scale 0 (it dequantizes to 0); divide by 1 instead of 0 to keep codes finite.
    unit = blocks / jnp.where(absmax == 0, 1.0, absmax)[:, None, :]
    if kind == "nf4":
        codes = jnp.searchsorted(jnp.asarray(_NF4_MIDPOINTS), unit.reshape(rows, n_out)).astype(jnp.uint8)
        codes = codes[0::2] | (codes[1::2] << 4)
    else:
        codes = jnp.clip(jnp.round(unit * 127.0), -127, 127).astype(jnp.int8).reshape(rows, n_out)
    return codes, absmax


def dequantize_blockwise(
    codes: jax.Array, scale: jax.Array, *, kind: QuantKind, in_features: int, dtype: Any = jnp.float32
) -> jax.Array:
    """Inverse of `quantize_blockwise`: the kernel [in_features, out] in `dtype` (scaled in float32)."""
    n_blocks, n_out = scale.shape
    if kind == "nf4":
        low, high = codes & 0x0F, codes >> 4
        index = jnp.stack([low, high], axis=1).reshape(-1, n_out)  # rows back in order 2i, 2i + 1
        unit = jnp.asarray(NF4_LEVELS)[index]
    else:
        unit = codes.astype(jnp.float32) / 127.0
    rows = unit.shape[0]
    w = unit.reshape(n_blocks, rows // n_blocks, n_out) * scale[:, None, :]
    return w.reshape(rows, n_out)[:in_features].astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def quantized_matmul(
    x: jax.Array, codes: jax.Array, scale: jax.Array, kind: QuantKind, in_features: int, dtype: Any
) -> jax.Array:
    """x [..., in] @ dequantize(codes, scale), with x already in `dtype`; the backward pass recomputes the kernel.

    Only the input gradient is defined (quantized weights are frozen). A plain `x @ dequantize(...)` would make
    autodiff keep every dequantized kernel alive from the forward to the backward pass, i.e. a float copy of
    the base model, which is the memory QLoRA exists to avoid.

    It has its own backward pass that recomputes the dequantized kernel from the codes, with optimization barriers tying
    each dequantization to its layer's input (forward) or output gradient (backward), so that a compiler need not keep a
    float copy of every kernel from the forward to the backward pass. XLA:CPU removes those barriers before scheduling
    and dequantizes all kernels up front either way (a 16-layer 1024 x 1024 stack compiles to the same temp memory with
    or without them: `docs/measurements/memory.md`, "QLoRA against qwix"); whether GPU/TPU keep them is not yet
    measured.
    """
    # Tying the codes to x keeps XLA from dequantizing every layer's kernel up front (they depend only on
    # parameters, so a scheduler may hoist them all), which would hold a float copy of the whole base at once.
    x, codes, scale = jax.lax.optimization_barrier((x, codes, scale))
    w = dequantize_blockwise(codes, scale, kind=kind, in_features=in_features, dtype=dtype)
    return jnp.matmul(x, w)


def _quantized_matmul_fwd(x, codes, scale, kind, in_features, dtype):
    return quantized_matmul(x, codes, scale, kind, in_features, dtype), (codes, scale)


def _quantized_matmul_bwd(kind, in_features, dtype, residuals, g):
    # Likewise tied to g, which also stops XLA from merging this dequantization with the forward one.
    g, codes, scale = jax.lax.optimization_barrier((g, *residuals))
    w = dequantize_blockwise(codes, scale, kind=kind, in_features=in_features, dtype=dtype)
    return jnp.matmul(g, w.T), None, None


quantized_matmul.defvjp(_quantized_matmul_fwd, _quantized_matmul_bwd)


class QuantizedLinear(nnx.Module):
    """A frozen `nnx.Linear` whose kernel is stored blockwise-quantized; same call, same bias. A decoder's
    stacked projection ([L, in, out]) is quantized layer by layer into stacked codes and scales.

    Attributes:
      codes, scale: `QuantizedWeight`s from `quantize_blockwise` (logical sharding axes of the original kernel).
      bias: the original float bias (an `nnx.Param`) or None.
      kind, block_size, in_features, out_features: static shape and format.
      dtype: compute dtype of the matmul (the original layer's `dtype`).
    """

    def __init__(self, linear: nnx.Linear, *, kind: QuantKind = "nf4", block_size: int = 64):
        _check_block_size(kind, block_size)
        kernel = linear.kernel
        names = kernel.get_metadata().get("out_sharding")
        weights = kernel[...]
        if weights.ndim == 3:  # a decoder's stacked projection [L, in, out]: each layer's kernel on its own
            codes, scale = jax.lax.map(lambda w: quantize_blockwise(w, kind=kind, block_size=block_size), weights)
        else:
            codes, scale = quantize_blockwise(weights, kind=kind, block_size=block_size)
        with nnx.use_eager_sharding(False):
            self.codes = QuantizedWeight(codes, out_sharding=names)
            self.scale = QuantizedWeight(scale, out_sharding=names)
        self.bias = linear.bias
        self.kind = kind
        self.block_size = block_size
        self.in_features, self.out_features = kernel.shape[-2:]
        self.dtype = linear.dtype or kernel.dtype
        self.param_dtype = kernel.dtype

    def dequantized_kernel(self, dtype: Any = jnp.float32) -> jax.Array:
        """The kernel [in, out] the codes stand for ([L, in, out] for a decoder's stacked projection)."""
        one = functools.partial(dequantize_blockwise, kind=self.kind, in_features=self.in_features, dtype=dtype)
        codes, scale = self.codes[...], self.scale[...]
        return jax.vmap(one)(codes, scale) if codes.ndim == 3 else one(codes, scale)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(self.dtype)
        y = quantized_matmul(x, self.codes[...], self.scale[...], self.kind, self.in_features, self.dtype)
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


def quantized_bytes(model: nnx.Module) -> int:
    """Bytes held in `QuantizedWeight`s (codes and scales) of a model."""
    return sum(int(v[...].nbytes) for _, v in nnx.iter_graph(model) if isinstance(v, QuantizedWeight))
