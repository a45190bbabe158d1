"""The decoder's hand-written backwards (`gated`, `projection_dot`) against plain autodiff."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tempax.models.decoder import gated, matmul, projection_dot


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_gated_value_and_gradients_match_autodiff(activation):
    """Same value and same d/d gate, d/d up as jax.grad of the plain expression, for a non-uniform cotangent."""
    gate = jnp.array([[-3.0, -0.5, 0.0, 0.25], [1.0, 2.0, -1.5, 4.0]])
    up = jnp.array([[0.5, -2.0, 1.0, 3.0], [-1.0, 0.75, 2.0, -0.25]])
    cot = jnp.array([[1.0, 2.0, -1.0, 0.5], [0.25, -3.0, 1.5, 2.0]])
    act = jax.nn.silu if activation == "silu" else (lambda x: jax.nn.gelu(x, approximate=True))

    def plain(g, u):
        return jnp.sum(act(g) * u * cot)

    def fused(g, u):
        return jnp.sum(gated(g, u, activation) * cot)

    np.testing.assert_allclose(gated(gate, up, activation), act(gate) * up, rtol=1e-6)
    want = jax.grad(plain, argnums=(0, 1))(gate, up)
    got = jax.jit(jax.grad(fused, argnums=(0, 1)))(gate, up)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def test_gated_silu_gradient_by_hand():
    """silu(g) = g s(g), s = sigmoid. At g = 0: silu = 0, silu'(0) = s(0) + 0 = 0.5. With up = 3, cotangent 1:
    d/d gate = 1 * 3 * 0.5 = 1.5 and d/d up = silu(0) = 0."""
    d_gate, d_up = jax.grad(lambda g, u: gated(g, u, "silu").sum(), argnums=(0, 1))(jnp.zeros(1), jnp.full(1, 3.0))
    np.testing.assert_allclose(d_gate, [1.5])
    np.testing.assert_allclose(d_up, [0.0])


def test_projection_dot_gradients_match_autodiff():
    """`projection_dot`'s hand-written gradients (d x = g W^T, d W = x^T g over all tokens) equal plain autodiff
    of x @ W for a [2, 3, 4] x [4, 5] product; the adapter form `matmul` too."""
    x = jnp.arange(24.0).reshape(2, 3, 4) / 10 - 1
    w = jnp.arange(20.0).reshape(4, 5) / 7 - 1.5
    cot = jnp.cos(jnp.arange(30.0)).reshape(2, 3, 5)
    dims = (((2,), (0,)), ((), ()))

    def plain(x, w):
        return jnp.sum(jax.lax.dot_general(x, w, dims) * cot)

    for product in (lambda x, w: projection_dot(x, w, dims), matmul):
        got = jax.jit(jax.grad(lambda x, w: jnp.sum(product(x, w) * cot), argnums=(0, 1)))(x, w)
        for want, have in zip(jax.grad(plain, argnums=(0, 1))(x, w), got):
            np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5)
    # anything but the plain projection is lax.dot_general itself
    np.testing.assert_allclose(projection_dot(w, w, (((0,), (0,)), ((), ()))), w.T @ w, rtol=1e-6)
