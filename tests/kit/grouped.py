"""What the tests of the grouped products (`tempax.ops.experts` and each backend's column) share: deterministic
operands, and the check of bfloat16 rows against a float32 master kernel that every grouped product passes."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from numpy.testing import assert_allclose


def sinusoid(shape: tuple[int, ...], scale: float = 1.0, phase: float = 0.0, dtype=jnp.float32) -> jax.Array:
    """A deterministic, non-uniform array: scale * sin(linspace + phase)."""
    n = int(np.prod(shape))
    return jnp.asarray(scale * np.sin(np.linspace(0.0, 7.0, n) + phase).reshape(shape), dtype)


def product_and_gradients(product: Callable, lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array,
                          cotangent: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(out, d lhs, d rhs) of a grouped product for `cotangent`."""
    out, vjp = jax.vjp(lambda a, b: product(a, b, group_sizes), lhs, rhs)
    return (out, *vjp(cotangent))


def check_bf16_rows_against_a_float32_kernel(product: Callable, reference: Callable, rows: int,
                                             group_sizes: tuple[int, ...]) -> None:
    """bf16 rows, a float32 master kernel: `product` gives the product and d lhs in bf16 and d rhs in float32, each
    within bf16 rounding of `reference`'s (the two sum the same bf16 products in different orders)."""
    lhs, rhs = sinusoid((rows, 32), 1.0, 0.4, jnp.bfloat16), sinusoid((len(group_sizes), 32, 16), 0.5, 1.1)
    sizes, cotangent = jnp.array(group_sizes, jnp.int32), sinusoid((rows, 16), 1.0, 2.0, jnp.bfloat16)
    got = product_and_gradients(product, lhs, rhs, sizes, cotangent)
    want = product_and_gradients(reference, lhs, rhs, sizes, cotangent)
    assert tuple(x.dtype for x in got) == (jnp.bfloat16, jnp.bfloat16, jnp.float32)
    for g, w in zip(got, want):
        w = np.asarray(w, np.float32)
        assert_allclose(np.asarray(g, np.float32), w, rtol=0, atol=2**-7 * float(np.max(np.abs(w))))


def check_equal_to_ragged_dot(product: Callable, m: int, k: int, n: int, group_sizes: tuple[int, ...]) -> None:
    """`product`'s output and both gradients, for m rows of k into n over groups of `group_sizes` rows, equal those
    of `tempax.ops.experts.grouped_matmul` (`jax.lax.ragged_dot`) to float32 rounding."""
    from tempax.ops import experts

    lhs, rhs = sinusoid((m, k), 1.0, 0.2), sinusoid((len(group_sizes), k, n), 0.5, 0.9)
    sizes, cotangent = jnp.array(group_sizes, jnp.int32), sinusoid((m, n), 1.0, 1.7)
    want_all = product_and_gradients(experts.grouped_matmul, lhs, rhs, sizes, cotangent)
    for got, want in zip(product_and_gradients(product, lhs, rhs, sizes, cotangent), want_all):
        scale = float(jnp.max(jnp.abs(want)))
        assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-5 * max(scale, 1.0))


def gpt_oss_experts_case() -> tuple[jax.Array, jax.Array, jax.Array, tuple, tuple]:
    """(ids, x, weights, kernels, biases): gpt-oss's experts (biases, clamped SwiGLU with some gates past the clamp),
    7 tokens routed top-2 of 4 experts with one expert receiving no token."""
    ids = jnp.array([[0, 1], [2, 0], [1, 2], [2, 0], [0, 1], [2, 0], [0, 2]], jnp.int32)
    x, weights = sinusoid((7, 6), 1.5), jax.nn.softmax(sinusoid((7, 2), 2.0, 0.3), axis=-1)
    kernels = (sinusoid((4, 6, 5), 4.0, 0.5), sinusoid((4, 6, 5), 4.0, 1.0), sinusoid((4, 5, 6), 0.8, 1.5))
    biases = (sinusoid((4, 5), 0.5, 2.0), sinusoid((4, 5), 0.5, 2.5), sinusoid((4, 6), 0.5, 3.0))
    return ids, x, weights, kernels, biases
