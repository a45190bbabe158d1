"""The routed experts' grouped products on a CPU: row tiles visited group by group, in plain JAX.

XLA:CPU lowers `jax.lax.ragged_dot` as a product of every row with every group's kernel, masked: E times the
work of the grouped product (`bench/compare_moe.py` measures the step). `grouped_matmul` computes the same
product as `tempax.ops.experts.grouped_matmul` the way megablox's kernel does on a TPU (Gale et al. 2022,
MegaBlocks, arXiv:2211.15841): the rows, sorted by group, are cut into tiles, and a loop visits each (tile, group)
pair whose rows meet, one dense product of a tile with that group's kernel each, the tile's rows of other groups
masked out. At most tiles + groups - 1 pairs exist, so the work is at most that many tile products whatever the
number of experts, and a group that received no row is never visited (its kernel is not read). It is passed to
`tempax.ops.experts.expert_products(grouped_product=...)`; the mixed-precision rule is
`tempax.ops.experts.with_mixed_precision_vjp`'s.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from tempax.ops.experts import GroupedProduct, with_mixed_precision_vjp

# Rows per tile: large enough for a matrix product to run near the CPU's peak, small enough that the tiles a
# group boundary splits (computed whole, masked) stay a small part of the work.
MAX_TILE = 128
ROW_MULTIPLE = 8


class TileVisits(NamedTuple):
    """The (tile, group) pairs a grouped product visits, padded to the static bound tiles + groups - 1.

    Attributes:
      tile: [pairs] int32; the row tile of each pair.
      group: [pairs] int32; the group whose kernel multiplies it.
      live: [pairs] bool; False for the padding pairs past the real ones (skipped).
      start, end: [groups] int32; each group's first row and one past its last.
    """

    tile: jax.Array
    group: jax.Array
    live: jax.Array
    start: jax.Array
    end: jax.Array


def row_tile(m: int) -> int:
    """Rows per tile for m rows: MAX_TILE, or m rounded up to ROW_MULTIPLE when fewer."""
    return min(MAX_TILE, ROW_MULTIPLE * -(-max(m, 1) // ROW_MULTIPLE))


def tile_visits(group_sizes: jax.Array, tiles: int, tm: int) -> TileVisits:
    """The pairs (tile t, group g) with a row of g in tile t, in order of g then t (so of t too): group g spans
    tiles start_g // tm to (end_g - 1) // tm, none when it is empty."""
    groups = group_sizes.shape[0]
    end = jnp.cumsum(group_sizes).astype(jnp.int32)
    start = end - group_sizes.astype(jnp.int32)
    spans = jnp.where(group_sizes > 0, (end - 1) // tm - start // tm + 1, 0)
    spans_end = jnp.cumsum(spans)
    pair = jnp.arange(tiles + groups - 1, dtype=jnp.int32)
    group = jnp.minimum(jnp.searchsorted(spans_end, pair, side="right"), groups - 1).astype(jnp.int32)
    tile = start[group] // tm + pair - (spans_end[group] - spans[group])
    live = pair < spans_end[-1]
    return TileVisits(tile=jnp.where(live, tile, 0).astype(jnp.int32), group=group, live=live, start=start, end=end)


def _tiles(rows: jax.Array, tm: int) -> jax.Array:
    """[m, d] -> [tiles, tm, d], zero rows appended."""
    m = rows.shape[0]
    pad = -m % tm
    return jnp.pad(rows, ((0, pad), (0, 0))).reshape((m + pad) // tm, tm, rows.shape[1])


def _in_group(visits: TileVisits, tile: jax.Array, group: jax.Array, tm: int) -> jax.Array:
    """[tm, 1] float32: which rows of `tile` belong to `group`."""
    row = tile * tm + jnp.arange(tm, dtype=jnp.int32)
    return ((row >= visits.start[group]) & (row < visits.end[group])).astype(jnp.float32)[:, None]


def _tiled_product(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, transpose_rhs: bool) -> jax.Array:
    """out[r] = lhs[r] @ rhs[g(r)] (rhs[g(r)]^T with `transpose_rhs`), float32, visiting `tile_visits`."""
    m = lhs.shape[0]
    tm = row_tile(m)
    x = _tiles(lhs, tm)
    visits = tile_visits(group_sizes, x.shape[0], tm)
    contract = 2 if transpose_rhs else 1
    out_dim = rhs.shape[1 if transpose_rhs else 2]

    def visit(out, pair):
        tile, group, live = pair

        def product(out):
            kernel = jax.lax.dynamic_index_in_dim(rhs, group, keepdims=False)
            y = jax.lax.dot_general(x[tile], kernel, (((1,), (contract - 1,)), ((), ())),
                                    preferred_element_type=jnp.float32)
            return out.at[tile].add(y * _in_group(visits, tile, group, tm))

        return jax.lax.cond(live, product, lambda out: out, out), None

    out = jnp.zeros((x.shape[0], tm, out_dim), jnp.float32)
    out, _ = jax.lax.scan(visit, out, (visits.tile, visits.group, visits.live))
    return out.reshape(-1, out_dim)[:m]


def _forward(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """out[r] = lhs[r] @ rhs[g(r)],    g(r) = the group whose contiguous block of rows holds row r."""
    return _tiled_product(lhs, rhs, group_sizes, transpose_rhs=False)


def _backward(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, g: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(d lhs, d rhs) of `_forward` for its cotangent g: d lhs[r] = g[r] rhs[g(r)]^T, visiting the same pairs;
    d rhs[e] = sum over the pairs of group e of (the tile's rows of e)^T g[those rows], accumulated in float32
    (zero for a group without rows)."""
    d_lhs = _tiled_product(g, rhs, group_sizes, transpose_rhs=True)
    tm = row_tile(lhs.shape[0])
    x, dy = _tiles(lhs, tm), _tiles(g, tm)
    visits = tile_visits(group_sizes, x.shape[0], tm)

    def visit(d_rhs, pair):
        tile, group, live = pair

        def accumulate(d_rhs):
            rows = x[tile] * _in_group(visits, tile, group, tm).astype(x.dtype)
            part = jax.lax.dot_general(rows, dy[tile], (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
            return d_rhs.at[group].add(part)

        return jax.lax.cond(live, accumulate, lambda d: d, d_rhs), None

    d_rhs = jnp.zeros(rhs.shape, jnp.float32)
    d_rhs, _ = jax.lax.scan(visit, d_rhs, (visits.tile, visits.group, visits.live))
    return d_lhs, d_rhs


grouped_matmul: GroupedProduct = with_mixed_precision_vjp(_forward, _backward)

__all__ = ["MAX_TILE", "TileVisits", "grouped_matmul", "row_tile", "tile_visits"]
