"""The projections and the gated MLP on a CPU (`tempax.ops.cpu.matmul`, reached through `tempax.ops`).

The hand-written backwards (`gated`, `projection_dot`) against plain autodiff; and `projection_dot` with a bfloat16
input (`train.precision=bf16`): values, gradients and dtypes worked by hand, float32 accumulation, and compiled
matmuls that XLA:CPU runs at bf16 speed (no float32 upcast of the operands)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from numpy.testing import assert_allclose

from tempax.ops import gated, keep_kernel_dtype, matmul, projection_dot
from tempax.train.state import set_compute_dtype

BF16 = jnp.bfloat16


def test_values_and_gradients_by_hand():
    """x = [[1, 2], [3, 4]] (bf16), w = [[0.5, -1], [0.25, 2]] (float32 master; all exact in bf16):
    y = x w = [[1*0.5 + 2*0.25, -1 + 4], [3*0.5 + 4*0.25, -3 + 8]] = [[1, 3], [2.5, 5]].
    L = sum(y * c) with c = [[1, 0], [0, 2]], so dL/dy = c and
    dx = c w^T = [[0.5, 0.25], [2 * -1, 2 * 2]] = [[0.5, 0.25], [-2, 4]]            (bf16, x's dtype),
    dw = x^T c = [[1*1 + 3*0, 1*0 + 3*2], [2*1 + 4*0, 2*0 + 4*2]] = [[1, 6], [2, 8]]  (float32, w's dtype)."""
    x = jnp.array([[1.0, 2.0], [3.0, 4.0]], BF16)
    w = jnp.array([[0.5, -1.0], [0.25, 2.0]], jnp.float32)
    c = jnp.array([[1.0, 0.0], [0.0, 2.0]], jnp.float32)
    y = matmul(x, w)
    assert y.dtype == BF16
    assert_allclose(np.asarray(y, np.float32), [[1.0, 3.0], [2.5, 5.0]], rtol=0, atol=0)
    dx, dw = jax.grad(lambda x, w: jnp.sum(matmul(x, w).astype(jnp.float32) * c), (0, 1))(x, w)
    assert dx.dtype == BF16 and dw.dtype == jnp.float32
    assert_allclose(np.asarray(dx, np.float32), [[0.5, 0.25], [-2.0, 4.0]], rtol=0, atol=0)
    assert_allclose(np.asarray(dw), [[1.0, 6.0], [2.0, 8.0]], rtol=0, atol=0)


def test_weight_gradient_accumulates_in_float32():
    """Three tokens with x = 1, 2^-9, 2^-9 through a [1, 1] kernel, dL/dy = 1: dw = sum of x over tokens =
    1 + 2^-8 = 1.00390625, a float32 number; summed in bf16 (8 significant bits: spacing 2^-7 at 1) each
    1 + 2^-9 would round back to 1."""
    x = jnp.array([[1.0], [2.0**-9], [2.0**-9]], BF16)
    dw = jax.grad(lambda w: jnp.sum(matmul(x, w).astype(jnp.float32)))(jnp.ones((1, 1), jnp.float32))
    assert dw.dtype == jnp.float32 and float(dw[0, 0]) == 1.00390625


def test_batched_input_matches_float32_within_bf16_rounding():
    """x [2, 3, 8] through an [8, 5] kernel: operands rounded to bf16 (relative error <= 2^-9 each), products
    summed in float32, so both gradients are within 1% of the float32 computation at these sizes."""
    x = jnp.asarray(np.linspace(-1.0, 1.0, 48).reshape(2, 3, 8), jnp.float32)
    w = jnp.asarray(np.linspace(-0.5, 0.7, 40).reshape(8, 5), jnp.float32)
    loss32 = lambda x, w: jnp.sum(jnp.sin(x @ w))  # noqa: E731
    loss16 = lambda x, w: jnp.sum(jnp.sin(matmul(x.astype(BF16), w).astype(jnp.float32)))  # noqa: E731
    for ref, got in zip(jax.grad(loss32, (0, 1))(x, w), jax.grad(loss16, (0, 1))(x, w)):
        assert got.shape == ref.shape and got.dtype == jnp.float32
        assert float(jnp.max(jnp.abs(got - ref))) <= 1e-2 * float(jnp.max(jnp.abs(ref)))


def _dot_operand_types(fn, *args) -> list[tuple[str, ...]]:
    """(lhs, rhs) element types of every dot in the optimised HLO of `fn`: fused dots read their operands from
    the fusion's parameters, whose types the computation's header gives."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    defined = dict(re.findall(r"%([\w.]+) = (\w+)\[", text))
    found, header = [], ""
    for line in text.splitlines():
        if line.startswith(("%", "ENTRY")) and line.rstrip().endswith("{"):
            header = line
        if " dot(" in line:
            types = {**defined, **dict(re.findall(r"([\w.]+): (\w+)\[", header))}
            names = [o.strip().lstrip("%") for o in re.search(r" dot\(([^)]*)\)", line).group(1).split(",")]
            found.append(tuple(types.get(n, "?") for n in names))
    return found


def test_all_three_matmuls_compile_to_bf16_dots():
    """The forward, input-gradient and weight-gradient products all keep bf16 operands in XLA:CPU's optimised
    HLO. A plain bf16 dot under autodiff does not (it asks for a bf16 result, and its weight gradient contracts
    the token axis), which is what the bf16 path of projection_dot exists to change."""
    x = jnp.ones((4, 16, 32), BF16)
    w = jnp.ones((32, 48), jnp.float32)
    loss = lambda x, w: jnp.sum(matmul(x, w).astype(jnp.float32) ** 2)  # noqa: E731
    dots = _dot_operand_types(jax.grad(loss, (0, 1)), x, w)
    assert len(dots) == 3 and all(d == ("bf16", "bf16") for d in dots), dots

    def plain_loss(x, w):
        y = jax.lax.dot_general(x, w.astype(BF16), (((2,), (0,)), ((), ())))
        return jnp.sum(y.astype(jnp.float32) ** 2)

    assert any(d != ("bf16", "bf16") for d in _dot_operand_types(jax.grad(plain_loss, (0, 1)), x, w))


def test_set_compute_dtype_keeps_a_float32_kernel_and_its_float32_gradient():
    """Under bfloat16 a Linear's output is bf16, its kernel stays float32 and so does the kernel's gradient."""
    layer = nnx.Linear(4, 3, dtype=jnp.float32, rngs=nnx.Rngs(0))
    set_compute_dtype(layer, "bfloat16")
    assert layer.dot_general is projection_dot and layer.promote_dtype is keep_kernel_dtype
    x = jnp.ones((2, 4), jnp.float32)
    assert layer(x).dtype == BF16
    grads = nnx.grad(lambda m: jnp.sum(m(x).astype(jnp.float32)))(layer)
    assert grads["kernel"][...].dtype == jnp.float32 and layer.kernel[...].dtype == jnp.float32
    # d sum(x W + b) / dW = x^T 1 = 2 for every entry (two rows of ones).
    assert_allclose(np.asarray(grads["kernel"][...]), np.full((4, 3), 2.0), rtol=0, atol=0)


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
