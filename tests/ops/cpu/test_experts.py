"""The CPU's grouped products (`tempax.ops.cpu.experts`) against the plain op (`tempax.ops.experts`,
`jax.lax.ragged_dot`): the pairs it visits by hand, the product and both gradients with empty groups, groups
crossing tile boundaries and row padding, float32 and bfloat16, and the whole experts op in the op table's CPU
column."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose

from tempax import ops
from tempax.ops import experts
from tempax.ops.cpu.experts import grouped_matmul, row_tile, tile_visits
from tests.kit.grouped import (check_bf16_rows_against_a_float32_kernel, check_equal_to_ragged_dot,
                              gpt_oss_experts_case, sinusoid)


def test_row_tile_by_hand():
    """Up to 128 rows a tile; fewer rows round up to a multiple of 8."""
    assert (row_tile(1), row_tile(10), row_tile(128), row_tile(1000)) == (8, 16, 128, 128)


def test_tile_visits_by_hand():
    """Groups of 5, 0, 9 and 2 rows in tiles of 4 (rows 0-4, 5-13, 14-15; 4 tiles): group 0 meets tiles 0 and 1,
    group 1 none, group 2 tiles 1, 2 and 3, group 3 tile 3: 6 pairs, padded to tiles + groups - 1 = 7."""
    visits = tile_visits(jnp.array([5, 0, 9, 2], jnp.int32), tiles=4, tm=4)
    live = visits.live.tolist()
    assert live == [True] * 6 + [False]
    assert visits.tile.tolist()[:6] == [0, 1, 1, 2, 3, 3]
    assert visits.group.tolist()[:6] == [0, 0, 2, 2, 2, 3]
    assert visits.start.tolist() == [0, 5, 5, 14] and visits.end.tolist() == [5, 5, 14, 16]


# (rows, in, out, group sizes): one tile with empty first and third groups (rows padded to the tile); 300 rows
# in three 128-row tiles with groups crossing both boundaries and an empty last group; every row in one group.
SHAPES = [(37, 24, 40, (0, 20, 0, 17)), (300, 32, 24, (100, 150, 50, 0)), (130, 16, 8, (0, 130, 0))]


@pytest.mark.parametrize("m,k,n,sizes", SHAPES)
def test_product_and_gradients_equal_ragged_dot(m, k, n, sizes):
    check_equal_to_ragged_dot(grouped_matmul, m, k, n, sizes)


def test_a_group_without_rows_is_never_read():
    """NaN in the kernel of an expert that received no row: ragged_dot's masked products on XLA:CPU would carry
    it into the output (0 x NaN); the tiled product never visits that kernel, so the output and both gradients
    stay finite (the empty group's kernel gradient is 0)."""
    lhs, rhs = sinusoid((20, 8), 1.0, 0.1), sinusoid((3, 8, 6), 0.5, 0.3).at[1].set(jnp.nan)
    group_sizes = jnp.array([12, 0, 8], jnp.int32)
    out, vjp = jax.vjp(lambda a, b: grouped_matmul(a, b, group_sizes), lhs, rhs)
    d_lhs, d_rhs = vjp(sinusoid((20, 6), 1.0, 0.5))
    assert bool(jnp.all(jnp.isfinite(out))) and bool(jnp.all(jnp.isfinite(d_lhs)))
    assert bool(jnp.all(d_rhs[1] == 0)) and bool(jnp.all(jnp.isfinite(d_rhs)))


def test_bf16_rows_against_a_float32_kernel():
    """bf16 rows, float32 master kernel: the product in bf16 and d rhs in float32, both within bf16 rounding of
    ragged_dot's (the two sum the same bf16 products in different orders)."""
    check_bf16_rows_against_a_float32_kernel(grouped_matmul, experts.grouped_matmul, rows=140,
                                             group_sizes=(10, 125, 5))


def test_the_op_tables_cpu_column_equals_the_plain_op():
    """gpt-oss's experts (biases, clamped SwiGLU), 7 tokens, top-2 of 4 with one expert receiving no token, through
    `tempax.ops.expert_products` on the CPU column and the plain one: y and the gradients of sum(sin(y)) for x, the
    routing weights, kernels and biases."""
    ids, x, weights, kernels, biases = gpt_oss_experts_case()

    def run(backend):
        def objective(x, weights, kernels, biases):
            with ops.use_backend(backend):
                y = ops.expert_products(x, ids, weights, *kernels, activation="clamped_swiglu",
                                        gate_bias_ei=biases[0], up_bias_ei=biases[1], down_bias_ed=biases[2])
            return jnp.sum(jnp.sin(y)), y

        return jax.value_and_grad(objective, argnums=(0, 1, 2, 3), has_aux=True)(x, weights, kernels, biases)

    (_, y_cpu), grads_cpu = run("cpu")
    (_, y_plain), grads_plain = run("plain")
    assert_allclose(np.asarray(y_cpu), np.asarray(y_plain), rtol=0, atol=1e-5)
    for got, want in zip(jax.tree.leaves(grads_cpu), jax.tree.leaves(grads_plain)):
        assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-4 * max(float(jnp.max(jnp.abs(want))), 1))


def test_the_work_does_not_grow_with_the_number_of_experts():
    """Traced for 4 and for 64 groups, the product and its gradient hold the same dense products (one tile
    product forward; d lhs's and d rhs's in the backward pass), each inside a loop over the (tile, group) pairs:
    the pairs past the real ones (at most tiles - 1 + groups of them) are skipped, so no expert's kernel is
    multiplied unless it received rows."""
    from tests.kit.models import product_counts

    counts = []
    for groups in (4, 64):
        lhs, rhs = sinusoid((40, 8), 1.0), sinusoid((groups, 8, 6), 0.5)
        sizes = jnp.zeros((groups,), jnp.int32).at[0].set(30).at[groups - 1].set(10)
        loss = lambda a, b, sizes=sizes: jnp.sum(jnp.sin(grouped_matmul(a, b, sizes)))  # noqa: E731
        counts.append((product_counts(jax.make_jaxpr(loss)(lhs, rhs)),
                       product_counts(jax.make_jaxpr(jax.grad(loss, (0, 1)))(lhs, rhs))))
    assert counts[0] == counts[1]
    assert counts[0] == ({"dot_general": 1, "ragged_dot_general": 0}, {"dot_general": 3, "ragged_dot_general": 0})
