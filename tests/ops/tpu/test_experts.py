"""megablox's grouped products (`tempax.ops.tpu.experts`) in Pallas interpret mode against the plain op
(`tempax.ops.experts`, `jax.lax.ragged_dot`): the product and both gradients, float32 and bfloat16, with empty
groups, row padding and several row tiles, and the whole experts op built on each."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose

from tempax.ops import experts
from tempax.ops.tpu.experts import grouped_matmul_interpret, tiling, unsupported_reason
from tests.kit.grouped import (check_bf16_rows_against_a_float32_kernel, check_equal_to_ragged_dot,
                              gpt_oss_experts_case)


def test_tiling_by_hand():
    """10 rows pad to one 16-row tile; 1000 rows take 512-row tiles; k and n whole up to 512, else 512."""
    assert tiling(10, 64, 96) == (16, 64, 96)
    assert tiling(1000, 2048, 768) == (512, 512, 512)


def test_unsupported_reason_names_the_problem():
    assert unsupported_reason(jnp.zeros((4, 8)), jnp.zeros((2, 8, 3))) is None
    assert unsupported_reason(jnp.zeros((4, 8), jnp.bfloat16), jnp.zeros((2, 8, 3))) is None
    assert "int8" in unsupported_reason(jnp.zeros((4, 8), jnp.int8), jnp.zeros((2, 8, 3)))
    assert "[groups, in, out]" in unsupported_reason(jnp.zeros((4, 8)), jnp.zeros((2, 7, 3)))


# (rows, in, out, group sizes): padding to the row tile with empty first and third groups; 600 rows over two
# 512-row tiles with a group crossing the tile boundary.
SHAPES = [(37, 24, 40, (0, 20, 0, 17)), (600, 32, 24, (100, 450, 50))]


@pytest.mark.parametrize("m,k,n,sizes", SHAPES)
def test_product_and_gradients_equal_ragged_dot(m, k, n, sizes):
    check_equal_to_ragged_dot(grouped_matmul_interpret, m, k, n, sizes)


def test_bf16_rows_against_a_float32_kernel():
    """bf16 rows, float32 master kernel: the product in bf16 and d rhs in float32, both within bf16 rounding of
    ragged_dot's (the two sum the same bf16 products in different orders)."""
    check_bf16_rows_against_a_float32_kernel(grouped_matmul_interpret, experts.grouped_matmul, rows=40,
                                             group_sizes=(10, 25, 5))


def test_expert_products_on_megablox_equal_the_plain_op():
    """gpt-oss's experts (biases, clamped SwiGLU with some gates past the clamp), 7 tokens, top-2 of 4 with one
    expert receiving no token: y and the gradients of sum(sin(y)) for x, the routing weights, kernels and biases."""
    ids, x, weights, kernels, biases = gpt_oss_experts_case()

    def run(product):
        def f(x, weights, kernels, biases):
            y = experts.expert_products(x, ids, weights, *kernels, activation="clamped_swiglu",
                                        gate_bias_ei=biases[0], up_bias_ei=biases[1], down_bias_ed=biases[2],
                                        grouped_product=product)
            return jnp.sum(jnp.sin(y)), y
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3), has_aux=True))(x, weights, kernels, biases)

    ((_, y_ref), grads_ref), ((_, y), grads) = run(experts.grouped_matmul), run(grouped_matmul_interpret)
    assert_allclose(np.asarray(y), np.asarray(y_ref), rtol=0, atol=1e-5 * float(jnp.max(jnp.abs(y_ref))))
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
        scale = float(jnp.max(jnp.abs(want)))
        assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-5 * max(scale, 1.0))
