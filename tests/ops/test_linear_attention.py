"""The gated delta rule and the causal depthwise convolution, by hand and against transformers' reference code."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tempax.ops.linear_attention import (causal_depthwise_conv, conv_taps, gated_delta_rule_chunked,
                                         gated_delta_rule_recurrent, unit_lower_inverse)


def _one_head(values, betas, decays, reset):
    """q = k = [1] (unit vectors: l2-normalising changes nothing, and dk^-1/2 = 1), dv = 1, one row."""
    t = len(values)
    ones = np.ones((1, t, 1, 1), np.float32)
    v = np.asarray(values, np.float32).reshape(1, t, 1, 1)
    g = np.log(np.asarray(decays, np.float32)).reshape(1, t, 1)
    b = np.asarray(betas, np.float32).reshape(1, t, 1)
    return ones, ones, v, g, b, np.asarray(reset, bool).reshape(1, t)


@pytest.mark.parametrize("rule", [gated_delta_rule_recurrent,
                                  lambda *a: gated_delta_rule_chunked(*a, chunk_size=2)])
def test_delta_rule_by_hand(rule):
    """S_1 = 0.5 * 0 + 0.5 * (2 - 0) = 1, o_1 = 1; S_2 = 0.5 * 1 + 0.5 * (4 - 0.5) = 2.25, o_2 = 2.25;
    with a reset at token 2 (a new document): S_2 = 0 + 0.5 * (4 - 0) = 2. Token 3 (decay 1, b = 1, v = 1):
    S_3 = S_2 + (1 - S_2) = 1 either way."""
    out, state = rule(*_one_head([2.0, 4.0, 1.0], [0.5, 0.5, 1.0], [0.5, 0.5, 1.0], [False, False, False]))
    # rtol 1e-5: l2-normalising k = [1] divides by sqrt(1 + 1e-6)
    np.testing.assert_allclose(np.asarray(out).ravel(), [1.0, 2.25, 1.0], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(state).ravel(), [1.0], rtol=1e-5)
    out, _ = rule(*_one_head([2.0, 4.0, 1.0], [0.5, 0.5, 1.0], [0.5, 0.5, 1.0], [False, True, False]))
    np.testing.assert_allclose(np.asarray(out).ravel(), [1.0, 2.0, 1.0], rtol=1e-5)


def _random(b=2, t=37, hk=2, hv=4, dk=8, dv=6, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(b, t, hk, dk)).astype(np.float32)
    k = rng.normal(size=(b, t, hk, dk)).astype(np.float32)
    v = rng.normal(size=(b, t, hv, dv)).astype(np.float32)
    g = (-np.abs(rng.normal(size=(b, t, hv))) * 0.3).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.normal(size=(b, t, hv))))).astype(np.float32)
    state = rng.normal(size=(b, hv, dk, dv)).astype(np.float32)
    return q, k, v, g, beta, state


def test_chunked_equals_token_by_token_across_chunks_and_resets():
    """37 tokens in chunks of 8 (the last one padded), with resets inside chunks, on a chunk's first token and two
    in a row: outputs and final state equal the recurrent form's."""
    q, k, v, g, beta, state = _random()
    reset = np.zeros((2, 37), bool)
    reset[0, 10] = reset[1, 16] = reset[1, 20] = reset[1, 21] = True
    want = gated_delta_rule_recurrent(q, k, v, g, beta, reset, state)
    got = gated_delta_rule_chunked(q, k, v, g, beta, reset, state, chunk_size=8)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6)


@pytest.mark.needs_torch
def test_both_forms_equal_transformers_reference_and_a_reset_equals_starting_anew():
    torch = pytest.importorskip("torch")
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    q, k, v, g, beta, state = _random(seed=1)
    t = lambda a: torch.tensor(a)  # noqa: E731
    ref_out, ref_state = torch_chunk_gated_delta_rule(t(q), t(k), t(v), t(g), t(beta), initial_state=t(state),
                                                      output_final_state=True, use_qk_l2norm_in_kernel=True)
    none = np.zeros((2, 37), bool)
    for rule in (gated_delta_rule_recurrent, gated_delta_rule_chunked):
        out, final = rule(q, k, v, g, beta, none, state)
        np.testing.assert_allclose(np.asarray(out), ref_out.numpy(), atol=1e-5)
        np.testing.assert_allclose(np.asarray(final), ref_state.numpy(), atol=1e-5)
    reset = none.copy()
    reset[0, 10] = True  # row 0 from token 10 on is a new document: as if run alone from an empty state
    out, final = gated_delta_rule_chunked(q, k, v, g, beta, reset, state)
    alone, alone_state = torch_chunk_gated_delta_rule(*(t(a[:1, 10:]) for a in (q, k, v, g, beta)),
                                                      output_final_state=True, use_qk_l2norm_in_kernel=True)
    np.testing.assert_allclose(np.asarray(out)[0, 10:], alone.numpy()[0], atol=1e-5)
    np.testing.assert_allclose(np.asarray(final)[0], alone_state.numpy()[0], atol=1e-5)


def test_the_chunked_rule_and_its_gradient_call_no_lapack_kernel():
    """A training step of Qwen3.5 on a 2-core host hung for ever in its first step: jaxlib's LAPACK triangular solve
    splits its batch over XLA:CPU's intra-op pool and blocks a pool thread until the parts are done, so two solves
    running at once (the forward pass has two, the backward pass more) left no thread to do the parts. The chunked
    rule, forward and backward, must hold no LAPACK call."""
    q, k, v, g, beta, state = _random()
    reset = np.zeros((2, 37), bool)

    def loss(q, k, v, g, beta, state):
        out, final = gated_delta_rule_chunked(q, k, v, g, beta, reset, state, chunk_size=16)
        return jnp.sum(out * out) + jnp.sum(final)

    text = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(6)))).lower(q, k, v, g, beta, state).as_text()
    assert "custom_call" not in text and "lapack" not in text


@pytest.mark.parametrize("size", [1, 5, 16, 64])
def test_unit_lower_inverse_is_the_inverse_and_differentiates_as_one(size):
    """(I + L)^-1 of the strict lower triangle of a random matrix (what is on or above the diagonal ignored; 5 is
    not a power of two) equals numpy's float64 inverse, and so does that of a strictly lower all-ones L (repeated
    keys, b = 1, no decay: the inverse is I minus the first subdiagonal, while the powers of L reach C(63, 31) ~ 1e18,
    so a power series would lose it in float32). Its gradient, along a random direction, equals a float64 central
    difference, and is zero on and above the diagonal."""
    rng = np.random.default_rng(size)
    m = rng.normal(size=(3, size, size)).astype(np.float32)
    want = np.linalg.inv(np.eye(size) + np.tril(m.astype(np.float64), -1))
    np.testing.assert_allclose(np.asarray(unit_lower_inverse(m)), want, atol=2e-6 * np.abs(want).max())
    ones = np.tril(np.ones((size, size), np.float32), -1)
    np.testing.assert_allclose(np.asarray(unit_lower_inverse(ones)), np.eye(size) - np.eye(size, k=-1), atol=1e-6)

    m, rhs = m * 0.3, rng.normal(size=(3, size, 4)).astype(np.float32)
    grad = np.asarray(jax.grad(lambda m: jnp.sum(jnp.sin(unit_lower_inverse(m) @ rhs)))(m))
    assert not np.triu(grad).any()
    direction, eps = rng.normal(size=m.shape), 1e-6
    f64 = lambda m: np.sum(np.sin(np.linalg.inv(np.eye(size) + np.tril(m, -1)) @ rhs))  # noqa: E731
    difference = (f64(m + eps * direction) - f64(m - eps * direction)) / (2 * eps)
    np.testing.assert_allclose(np.sum(grad * direction), difference, rtol=1e-5, atol=1e-6)


def test_causal_conv_by_hand_across_documents_padding_and_a_history():
    """Kernel [w0, w1, w2] = [1, 10, 100] over x = 1, 2, 3, 4 (one channel): y_t = 100 x_t + 10 x_{t-1} + x_{t-2}
    = 100, 210, 321, 432; with a new document at t = 2 its first tokens see nothing before it: 300, 430; padding at
    t = 1 is skipped: y_2 = 300 + 10 x_0 = 310, y_3 = 400 + 10 x_2 + x_0 = 431; with a history [5, 6] of the same
    document (a cache) the first outputs read it: 100 + 60 + 5 = 165, 200 + 10 + 6 = 216."""
    x = np.asarray([1.0, 2.0, 3.0, 4.0], np.float32).reshape(1, 4, 1)
    w = np.asarray([[1.0, 10.0, 100.0]], np.float32)

    def conv(segments, history_segment=-1, history=None):
        taps, _ = conv_taps(np.asarray([[history_segment] * 2 + segments], np.int32), 2)
        return np.asarray(causal_depthwise_conv(x, w, taps, history)).ravel()

    np.testing.assert_allclose(conv([1, 1, 1, 1]), [100, 210, 321, 432])
    np.testing.assert_allclose(conv([1, 1, 2, 2]), [100, 210, 300, 430])
    np.testing.assert_allclose(conv([1, 0, 1, 1])[[0, 2, 3]], [100, 310, 431])
    history = np.asarray([5.0, 6.0], np.float32).reshape(1, 2, 1)
    np.testing.assert_allclose(conv([1, 1, 1, 1], 1, history), [165, 216, 321, 432])


def test_conv_taps_keep_the_last_real_inputs_for_the_cache():
    """History of 2, then tokens of segment 1 with padding between and after: the kept inputs are the last real
    token's and the one real input before it (padding skipped), oldest first; with no real token in the call the
    history is kept as it is."""
    segments = np.asarray([[1, 1, 1, 0, 1, 0, 0]], np.int32)  # history (indices 0, 1), then the call's 5
    taps, kept = conv_taps(segments, 2)
    assert kept.tolist() == [[2, 4]]
    assert taps[0, 2].tolist() == [4, 2, 1]  # the token at index 4: itself, then 2 (index 3 is padding), then 1
    assert taps[0, 1].tolist() == [-1, -1, -1]  # padding reads nothing
    _, kept = conv_taps(np.asarray([[1, 1, 0, 0]], np.int32), 2)
    assert kept.tolist() == [[0, 1]]
