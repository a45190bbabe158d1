"""`tempax.ops.experts`: the routed experts as sorted, grouped products, against hand-worked numbers and a dense
reference written here (every expert applied to every token, the routing weights as a dense [tokens, experts]
matrix), values and gradients, and the products in its program. megablox's kernel (the TPU's grouped product) is
compared with this op in tests/ops/tpu/test_experts.py.

Inputs are built from `np.linspace` and `sin`, not drawn at random. Float32 results agree to float rounding (the
grouped and dense forms sum in different orders).
"""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose

from tempax.ops.experts import (ExpertAdapter, clamped_swiglu, expert_activation, expert_products, group_by_expert,
                                grouped_matmul, low_rank_update, unsort)


def _array(shape: tuple[int, ...], scale: float = 1.0, phase: float = 0.0, dtype=jnp.float32) -> jax.Array:
    """A deterministic, non-uniform array: scale * sin(linspace + phase)."""
    n = int(np.prod(shape))
    return jnp.asarray(scale * np.sin(np.linspace(0.0, 7.0, n) + phase).reshape(shape), dtype)


def test_group_by_expert_sorts_pairs_stably():
    """ids [[2, 0], [0, 1], [1, 2]] flatten to [2, 0, 0, 1, 1, 2] (pair f = token * 2 + slot); sorted stably by
    expert the pairs are 1, 2 (expert 0), 3, 4 (expert 1), 0, 5 (expert 2): tokens 0, 1, 1, 2, 0, 2; four experts
    received 2, 2, 2, 0 rows."""
    groups = group_by_expert(jnp.array([[2, 0], [0, 1], [1, 2]]), 4)
    assert groups.order.tolist() == [1, 2, 3, 4, 0, 5]
    assert groups.token.tolist() == [0, 1, 1, 2, 0, 2]
    assert groups.expert.tolist() == [0, 0, 1, 1, 2, 2]
    assert groups.group_sizes.tolist() == [2, 2, 2, 0]
    assert unsort(jnp.arange(6) * 10, groups.order).tolist() == [40, 0, 10, 20, 30, 50]


def test_grouped_matmul_by_hand():
    """Rows 0-1 go through group 0 ([[1, 2], [3, 4]]), group 1 gets none, rows 2-4 through group 2 (swaps the
    columns): [1, 0] -> [1, 2]; [0, 1] -> [3, 4]; [1, 1] -> [1, 1]; [2, 0] -> [0, 2]; [0, 3] -> [3, 0]."""
    lhs = jnp.array([[1, 0], [0, 1], [1, 1], [2, 0], [0, 3]], jnp.float32)
    rhs = jnp.array([[[1, 2], [3, 4]], [[9, 9], [9, 9]], [[0, 1], [1, 0]]], jnp.float32)
    out = grouped_matmul(lhs, rhs, jnp.array([2, 0, 3], jnp.int32))
    assert out.tolist() == [[1, 2], [3, 4], [1, 1], [0, 2], [3, 0]]


def test_clamped_swiglu_by_hand():
    """alpha 1.702, limit 7. gate 10, up 8: both clamp to 7, (7 + 1) * 7 * sigmoid(11.914) = 55.99963.
    gate -2, up 0.5: no clamp, (0.5 + 1) * -2 * sigmoid(-3.404) = 1.5 * -0.0643414 = -0.0965121.
    gate -20, up -9: the gate is clamped from above only (-20 * sigmoid(-34.04) ~ -3.6e-14), up to -7: ~ 2e-13."""
    out = clamped_swiglu(jnp.array([10.0, -2.0, -20.0]), jnp.array([8.0, 0.5, -9.0]), alpha=1.702, limit=7.0)
    assert_allclose(np.asarray(out), [55.99962502642654, -0.09651206528368779, 0.0], rtol=1e-6, atol=1e-12)


def test_expert_activation_rejects_an_unknown_name():
    with pytest.raises(ValueError, match="relu"):
        expert_activation(jnp.ones(2), jnp.ones(2), "relu")


# --------------------------------------------------------------------------------------------------------------
# The whole op against a dense reference

T, D, I, E, K = 7, 6, 5, 4, 2
# Token t goes to experts IDS[t]; expert 3 receives no token (an empty group) and expert 1 three.
IDS = jnp.array([[0, 1], [2, 0], [1, 2], [2, 0], [0, 1], [2, 0], [0, 2]], jnp.int32)


def _dense(x, weights, gate, up, down, gate_b, up_b, down_b, activation):
    """Every expert on every token, then the routing weights as a dense [T, E] matrix: y = sum_e W[t, e] *
    expert_e(x_t). Written without the op's sorting or grouped products."""
    dense_w = jnp.zeros((T, E)).at[jnp.arange(T)[:, None], IDS].add(weights)
    g = jnp.einsum("td,edi->tei", x, gate) + (0 if gate_b is None else gate_b[None])
    u = jnp.einsum("td,edi->tei", x, up) + (0 if up_b is None else up_b[None])
    h = expert_activation(g, u, activation, swiglu_alpha=1.702, swiglu_limit=7.0)
    out = jnp.einsum("tei,eid->ted", h, down) + (0 if down_b is None else down_b[None])
    return jnp.einsum("te,ted->td", dense_w, out)


def inputs(biases: bool, scale: float = 1.0):
    """(x [T, D], routing weights [T, K], (gate, up, down) kernels, (gate, up, down) biases or Nones)."""
    x = _array((T, D), 1.5)
    weights = jax.nn.softmax(_array((T, K), 2.0, 0.3), axis=-1)
    kernels = (_array((E, D, I), scale, 0.5), _array((E, D, I), scale, 1.0), _array((E, I, D), 0.8, 1.5))
    bias = (_array((E, I), 0.5, 2.0), _array((E, I), 0.5, 2.5), _array((E, D), 0.5, 3.0)) if biases else (None,) * 3
    return x, weights, kernels, bias


# (activation, biases, kernel scale)
CASES = [("silu", False, 1.0), ("gelu_tanh", False, 1.0), ("clamped_swiglu", True, 4.0)]


@pytest.mark.parametrize("activation,biases,scale", CASES)
def test_matches_the_dense_reference_values_and_gradients(activation, biases, scale):
    """y and the gradients of sum(sin(y)) with respect to x, the routing weights, the three kernels and the
    biases. gpt-oss's case scales its kernels so that some gates pass the clamp at 7."""
    x, weights, kernels, bias = inputs(biases, scale)

    def ours(x, weights, kernels, bias):
        gb, ub, db = bias
        return expert_products(x, IDS, weights, *kernels, activation=activation, gate_bias_ei=gb, up_bias_ei=ub,
                               down_bias_ed=db)

    def reference(x, weights, kernels, bias):
        return _dense(x, weights, *kernels, *bias, activation)

    if activation == "clamped_swiglu":
        g = jnp.einsum("td,edi->tei", x, kernels[0]) + bias[0][None]
        assert float(jnp.max(g)) > 7.0  # the clamp is exercised
    y, y_ref = jax.jit(ours)(x, weights, kernels, bias), jax.jit(reference)(x, weights, kernels, bias)
    assert_allclose(np.asarray(y), np.asarray(y_ref), rtol=1e-5, atol=1e-5)
    loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a)))  # noqa: E731
    grads = jax.jit(jax.grad(loss(ours), argnums=(0, 1, 2, 3)))(x, weights, kernels, bias)
    grads_ref = jax.jit(jax.grad(loss(reference), argnums=(0, 1, 2, 3)))(x, weights, kernels, bias)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
        scale_ = float(jnp.max(jnp.abs(want)))
        assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-5 * max(scale_, 1.0))
    # Expert 3 received no token: its kernels' gradients are exactly zero.
    assert float(jnp.max(jnp.abs(grads[2][0][3]))) == 0.0


def test_low_rank_update_values_and_gradients_by_hand():
    """Rows [1, 2], [0, 1] go to expert 0 (A_0 = [1, 1]^T, B_0 = [1, -1]), row [3, -1] to expert 1 (A_1 = [2, 0]^T,
    B_1 = [0.5, 2]); rank 1, scale 2. h = x A: 3, 1, 6; out = 2 h B: [6, -6], [2, -2], [6, 24].
    L = sum(out * c), c = [[1, 0], [0, 1], [1, 1]]:
      dL/dB_e = 2 sum_r h_r c_r: B_0 2 (3 [1, 0] + 1 [0, 1]) = [6, 2]; B_1 2 (6 [1, 1]) = [12, 12]
      dL/dh_r = 2 c_r . B_e: 2 (1 - 0) = 2, 2 (0 - 1) = -2, 2 (0.5 + 2) = 5
      dL/dA_e = sum_r x_r^T dh_r: A_0 2 [1, 2] - 2 [0, 1] = [2, 2]; A_1 5 [3, -1] = [15, -5]
      dL/dx_r = dh_r A_e^T: [2, 2], [-2, -2], 5 [2, 0] = [10, 0]."""
    rows = jnp.array([[1.0, 2.0], [0.0, 1.0], [3.0, -1.0]])
    a = jnp.array([[[1.0], [1.0]], [[2.0], [0.0]]])  # [E, in, r]
    b = jnp.array([[[1.0, -1.0]], [[0.5, 2.0]]])  # [E, r, out]
    sizes = jnp.array([2, 1], jnp.int32)
    out = low_rank_update(rows, ExpertAdapter(a, b, 2.0), sizes)
    assert out.tolist() == [[6.0, -6.0], [2.0, -2.0], [6.0, 24.0]]
    c = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    loss = lambda rows, a, b: jnp.sum(low_rank_update(rows, ExpertAdapter(a, b, 2.0), sizes) * c)  # noqa: E731
    d_rows, d_a, d_b = jax.grad(loss, argnums=(0, 1, 2))(rows, a, b)
    assert d_b.tolist() == [[[6.0, 2.0]], [[12.0, 12.0]]]
    assert d_a.tolist() == [[[2.0], [2.0]], [[15.0], [-5.0]]]
    assert d_rows.tolist() == [[2.0, 2.0], [-2.0, -2.0], [10.0, 0.0]]


R = 3  # the adapters' rank


S = 0.75  # the adapters' scale, alpha / r


def _factors() -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
    """(A, B) of LoRA on the fused gate and up kernels (A [E, D, R], B [E, R, 2I], the gate's columns first) and on
    the down kernels (A [E, I, R], B [E, R, D]), B non-zero so that the updates show."""
    return ((_array((E, D, R), 0.3, 4.0), _array((E, R, 2 * I), 0.3, 4.5)),
            (_array((E, I, R), 0.3, 5.0), _array((E, R, D), 0.3, 5.5)))


@pytest.mark.parametrize("activation,biases,scale", CASES)
def test_adapted_experts_match_the_dense_reference_with_the_updates_folded_in(activation, biases, scale):
    """expert_products with LoRA on the gate_up and down kernels equals the dense reference run on the folded kernels
    [G_e | U_e] + s A_e B_e and D_e + s A_e B_e (s = alpha / r = 0.75), values and the gradients of sum(sin(y)) with
    respect to x, the routing weights, the kernels and both adapters' A and B; expert 3 received no token, so its
    adapters' gradients are exactly zero. A scale of 0 (a layer without the adapter) gives the base op's y."""
    x, weights, kernels, bias = inputs(biases, scale)
    gate_up, down = _factors()

    def ours(x, weights, kernels, gate_up, down, s=S):
        gb, ub, db = bias
        return expert_products(x, IDS, weights, *kernels, activation=activation, gate_bias_ei=gb, up_bias_ei=ub,
                               down_bias_ed=db, gate_up_adapter=ExpertAdapter(*gate_up, s),
                               down_adapter=ExpertAdapter(*down, s))

    def reference(x, weights, kernels, gate_up, down):
        gate, up, down_kernel = kernels
        fused = S * jnp.einsum("edr,ero->edo", *gate_up)
        folded = (gate + fused[..., :I], up + fused[..., I:], down_kernel + S * jnp.einsum("eir,erd->eid", *down))
        return _dense(x, weights, *folded, *bias, activation)

    args = (x, weights, kernels, gate_up, down)
    y, y_ref = jax.jit(ours)(*args), jax.jit(reference)(*args)
    base = _dense(x, weights, *kernels, *bias, activation)
    assert float(jnp.max(jnp.abs(y_ref - base))) > 0.1  # the adapters change the output
    assert_allclose(np.asarray(y), np.asarray(y_ref), rtol=1e-5, atol=1e-5)
    loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a)))  # noqa: E731
    grads = jax.jit(jax.grad(loss(ours), argnums=(0, 1, 2, 3, 4)))(*args)
    grads_ref = jax.jit(jax.grad(loss(reference), argnums=(0, 1, 2, 3, 4)))(*args)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
        size = float(jnp.max(jnp.abs(want)))
        assert size > 0.0
        assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-5 * max(size, 1.0))
    for a_grad, b_grad in (grads[3], grads[4]):
        assert float(jnp.max(jnp.abs(a_grad[3]))) == 0.0 and float(jnp.max(jnp.abs(b_grad[3]))) == 0.0
    off = jax.jit(ours)(x, weights, kernels, gate_up, down, jnp.float32(0.0))
    assert_allclose(np.asarray(off), np.asarray(base), rtol=1e-5, atol=1e-5)


def test_bf16_rows_against_float32_kernels_keep_a_float32_kernel_gradient():
    """bf16 tokens against float32 master kernels: y in bf16, each kernel's gradient float32 and within bf16
    rounding (8 significant bits, relative 2^-8 per operand) of the float32 computation's."""
    x, weights, kernels, _ = inputs(False)

    def loss(x, kernels):
        return jnp.sum(expert_products(x, IDS, weights, *kernels).astype(jnp.float32) ** 2)

    y = expert_products(x.astype(jnp.bfloat16), IDS, weights, *kernels)
    assert y.dtype == jnp.bfloat16
    g16 = jax.grad(loss, argnums=1)(x.astype(jnp.bfloat16), kernels)
    g32 = jax.grad(loss, argnums=1)(x, kernels)
    for got, want in zip(g16, g32):
        assert got.dtype == jnp.float32
        assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=0.05 * float(jnp.max(jnp.abs(want))))


def _primitive_counts(jaxpr) -> dict[str, int]:
    counts: dict[str, int] = {}

    def walk(j):
        for eqn in j.eqns:
            counts[eqn.primitive.name] = counts.get(eqn.primitive.name, 0) + 1
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jaxpr.jaxpr)
    return counts


@pytest.mark.parametrize("num_experts", [4, 32])
def test_the_op_is_three_grouped_products_whatever_the_expert_count(num_experts):
    """Forward: three ragged products (gate, up, down) and no dense product; with the gradient, three more for
    the inputs and three for the kernels. The same program shape for 4 and for 32 experts."""
    x, weights = _array((T, D)), jax.nn.softmax(_array((T, K), 2.0), axis=-1)
    kernels = (_array((num_experts, D, I)), _array((num_experts, D, I), 1.0, 1.0), _array((num_experts, I, D)))
    f = lambda x, kernels: jnp.sum(expert_products(x, IDS, weights, *kernels))  # noqa: E731
    forward = _primitive_counts(jax.make_jaxpr(f)(x, kernels))
    both = _primitive_counts(jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(x, kernels))
    assert forward.get("ragged_dot_general", 0) == 3 and forward.get("dot_general", 0) == 0
    assert both.get("ragged_dot_general", 0) == 9 and both.get("dot_general", 0) == 0
