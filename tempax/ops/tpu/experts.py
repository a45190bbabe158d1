"""The routed experts' grouped products on a TPU: JAX's megablox grouped matrix multiplication (Pallas).

`grouped_matmul` computes what `tempax.ops.experts.grouped_matmul` computes with megablox's kernels, which visit
only the row tiles a group occupies, so experts that received no row cost nothing. It is passed to
`tempax.ops.experts.expert_products(grouped_product=...)`; the mixed-precision rule (bf16 operands, float32
accumulation, a float32 kernel gradient for a float32 master) is `tempax.ops.experts.with_mixed_precision_vjp`'s.
`_forward` and `_backward` hold the formulas, the paper and where they differ from megablox's own custom VJP. On a
CPU the kernels run in Pallas's interpret mode (`grouped_matmul_interpret`), which is how the tests compare them
with the plain op. `unsupported_reason` names what the kernel cannot take.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.megablox.gmm import gmm, tgmm

from tempax.ops.experts import GroupedProduct, with_mixed_precision_vjp

DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
MAX_TILE = 512
ROW_MULTIPLE = 16


def unsupported_reason(lhs: jax.Array, rhs: jax.Array) -> str | None:
    """Why megablox cannot compute this grouped product, or None when it can. Reads only shapes and dtypes:
    lhs [m, in], rhs [groups, in, out]."""
    if lhs.ndim != 2 or rhs.ndim != 3 or lhs.shape[1] != rhs.shape[1]:
        return f"lhs must be [m, in] and rhs [groups, in, out]; got {lhs.shape} and {rhs.shape}"
    if jnp.dtype(lhs.dtype) not in DTYPES:
        return f"megablox multiplies float32 or bfloat16 rows, not {jnp.dtype(lhs.dtype).name}"
    return None


def tiling(m: int, k: int, n: int) -> tuple[int, int, int]:
    """(row tile, contracted tile, output tile) for m rows, a contracted dimension k and an output dimension n.

    Rows in tiles of up to 512 (a multiple of 16, bf16's sublane packing); the contracted and output dimensions
    whole up to 512, else 512 (a multiple of the 128 lanes; megablox masks a partial last tile)."""
    tm = min(MAX_TILE, ROW_MULTIPLE * math.ceil(max(m, 1) / ROW_MULTIPLE))
    return tm, min(k, MAX_TILE), min(n, MAX_TILE)


def _pad_rows(rows: jax.Array, group_sizes: jax.Array, tm: int) -> tuple[jax.Array, jax.Array]:
    """The rows padded with zeros to a multiple of the row tile, the padding joining the last group (zero rows add
    nothing to its kernel's gradient; their outputs are cut off), so any number of rows works."""
    pad = (-rows.shape[0]) % tm
    if not pad:
        return rows, group_sizes
    return jnp.pad(rows, ((0, pad), (0, 0))), group_sizes.at[-1].add(pad)


def _forward(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, interpret: bool) -> jax.Array:
    """out[r] = lhs[r] @ rhs[g(r)],    g(r) = the group whose contiguous block of rows holds row r,

    with `jax.experimental.pallas.ops.tpu.megablox`'s `gmm` kernel (Gale et al. 2022, MegaBlocks, arXiv:2211.15841)."""
    m, k = lhs.shape
    tiles = tiling(m, k, rhs.shape[2])
    rows, sizes = _pad_rows(lhs, group_sizes, tiles[0])
    return gmm(rows, rhs, sizes, jnp.float32, tiles, interpret=interpret)[:m]


def _backward(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, g: jax.Array, *, interpret: bool):
    """(d lhs, d rhs) of `_forward` for its cotangent g: megablox's `gmm` for d lhs = g rhs[g(r)]^T (the kernel
    transposing rhs as it reads it), `tgmm` for d rhs[e] = lhs[rows of e]^T g[rows of e].

    What we do differently from megablox's own custom VJP (`megablox.ops.gmm`): the rows are padded with zeros to a
    multiple of the row tile and the padding joins the last group (`_pad_rows`), so any number of rows works; and
    the kernel gradient accumulates in float32 whatever the kernel's dtype."""
    (m, k), n = lhs.shape, rhs.shape[2]
    tiles = tiling(m, n, k)  # d lhs contracts the output dimension n and produces k
    g_rows, sizes = _pad_rows(g, group_sizes, tiles[0])
    d_lhs = gmm(g_rows, rhs, sizes, jnp.float32, tiles, transpose_rhs=True, interpret=interpret)[:m]
    lhs_rows, _ = _pad_rows(lhs, group_sizes, tiles[0])
    d_rhs = tgmm(lhs_rows.swapaxes(0, 1), g_rows, sizes, jnp.float32, tiling(m, k, n),
                 num_actual_groups=rhs.shape[0], interpret=interpret)
    return d_lhs, d_rhs


grouped_matmul: GroupedProduct = with_mixed_precision_vjp(partial(_forward, interpret=False),
                                                          partial(_backward, interpret=False))
grouped_matmul_interpret: GroupedProduct = with_mixed_precision_vjp(partial(_forward, interpret=True),
                                                                    partial(_backward, interpret=True))

__all__ = ["DTYPES", "grouped_matmul", "grouped_matmul_interpret", "tiling", "unsupported_reason"]
