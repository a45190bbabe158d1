"""Hand-computed checks for per-token log-probs, entropies and masked reductions."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from numpy.testing import assert_allclose

from tempax.models.logprobs import masked_mean, masked_sum, shift_for_next_token, token_entropy, token_logprobs

LN2, LN3, LN4 = math.log(2), math.log(3), math.log(4)


def test_token_logprobs_hand_values():
    """Row [0, 0, ln 2]: exp-sum 1 + 1 + 2 = 4, so log p(2) = ln 2 - ln 4 = -ln 2 and log p(0) = -ln 4.
    Row [1, 1, 1]: uniform over 3, log p(0) = -ln 3."""
    logits = jnp.array([[[0.0, 0.0, LN2], [1.0, 1.0, 1.0], [0.0, 0.0, LN2]]])
    targets = jnp.array([[2, 0, 0]])
    out = token_logprobs(logits, targets)
    assert out.shape == (1, 3) and out.dtype == jnp.float32
    assert_allclose(out, [[-LN2, -LN3, -LN4]], rtol=1e-6)


def test_token_logprobs_temperature():
    """[0, 0, 2 ln 2] / tau=2 = [0, 0, ln 2], so log p(2) = -ln 2 (at tau=1 it is 2 ln 2 - ln 6 = ln(4/6))."""
    logits = jnp.array([[[0.0, 0.0, 2 * LN2]]])
    targets = jnp.array([[2]])
    assert_allclose(token_logprobs(logits, targets, temperature=2.0), [[-LN2]], rtol=1e-6)
    assert_allclose(token_logprobs(logits, targets), [[math.log(4 / 6)]], rtol=1e-6)


def test_token_logprobs_bfloat16_input_computes_in_float32():
    """bf16 logits [0, 0, ln 2] (ln 2 rounds to 0.69140625 in bf16) give a float32 result equal to the float32
    computation on the rounded logits: log p(2) = 0.69140625 - log(2 + e^0.69140625)."""
    logits = jnp.array([[[0.0, 0.0, LN2]]], dtype=jnp.bfloat16)
    out = token_logprobs(logits, jnp.array([[2]]))
    assert out.dtype == jnp.float32
    z = 0.69140625
    assert_allclose(out, [[z - math.log(2 + math.exp(z))]], rtol=1e-6)


def test_token_logprobs_gradient_is_onehot_minus_softmax():
    """d log p(2) / d logits = onehot(2) - softmax = [0, 0, 1] - [0.25, 0.25, 0.5] = [-0.25, -0.25, 0.5]."""
    logits = jnp.array([[[0.0, 0.0, LN2]]])
    grad = jax.grad(lambda z: token_logprobs(z, jnp.array([[2]])).sum())(logits)
    assert_allclose(grad, [[[-0.25, -0.25, 0.5]]], atol=1e-6)


def test_token_logprobs_out_of_range_target_is_finite():
    """An ignore index (-100) or an id >= vocab gives a finite value (the caller masks it), not NaN."""
    logits = jnp.zeros((1, 2, 3))
    out = token_logprobs(logits, jnp.array([[-100, 7]]))
    assert np.all(np.isfinite(np.asarray(out)))


def test_token_entropy_hand_values():
    """Uniform over 4: H = ln 4. p = [0.25, 0.25, 0.5]: H = -(2 * 0.25 ln 0.25 + 0.5 ln 0.5) = 1.5 ln 2.
    At tau = 2, logits [0, 0, 2 ln 2] become [0, 0, ln 2]: also 1.5 ln 2."""
    logits = jnp.array([[[0.0, 0.0, 0.0, 0.0]], [[0.0, 0.0, LN2, -jnp.inf]]])
    assert_allclose(token_entropy(logits), [[LN4], [1.5 * LN2]], rtol=1e-6)
    assert_allclose(token_entropy(jnp.array([[[0.0, 0.0, 2 * LN2]]]), temperature=2.0), [[1.5 * LN2]], rtol=1e-6)


def test_masked_mean_and_sum_on_2x3_batch():
    """x = [[1, 2, 3], [4, 5, 6]], mask = [[1, 1, 0], [0, 1, 1]].
    all: sum 1 + 2 + 5 + 6 = 14 over 4 tokens = 3.5.  axis=1: [(1 + 2) / 2, (5 + 6) / 2] = [1.5, 5.5].
    axis=0: [1 / 1, (2 + 5) / 2, 6 / 1] = [1, 3.5, 6]."""
    x = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = jnp.array([[1, 1, 0], [0, 1, 1]])
    assert_allclose(masked_sum(x, mask), 14.0)
    assert_allclose(masked_sum(x, mask, axis=1), [3.0, 11.0])
    assert_allclose(masked_mean(x, mask), 3.5)
    assert_allclose(masked_mean(x, mask, axis=1), [1.5, 5.5])
    assert_allclose(masked_mean(x, mask, axis=0), [1.0, 3.5, 6.0])


def test_masked_mean_empty_mask_is_zero_not_nan():
    """An all-zero mask gives 0; a row with no tokens gives 0 in the per-row mean: [[0, 0, 0], [0, 1, 0]] on x
    -> [0, 5 / 1] = [0, 5]."""
    x = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert_allclose(masked_mean(x, jnp.zeros((2, 3))), 0.0)
    assert_allclose(masked_mean(x, jnp.array([[0, 0, 0], [0, 1, 0]]), axis=1), [0.0, 5.0])


def test_masked_reductions_ignore_nan_at_masked_positions():
    """NaN and inf under a 0 mask do not leak: (1 + 2) / 2 = 1.5."""
    x = jnp.array([1.0, 2.0, jnp.nan, jnp.inf])
    mask = jnp.array([True, True, False, False])
    assert_allclose(masked_mean(x, mask), 1.5)
    assert_allclose(masked_sum(x, mask), 3.0)


def test_shift_for_next_token():
    """tokens [5, 6, 7, 8] with the prompt token 5 unsupervised (mask [0, 1, 1, 1]): position t predicts t + 1,
    so targets [6, 7, 8, pad 0] and loss mask [1, 1, 1, 0]."""
    targets, loss_mask = shift_for_next_token(jnp.array([[5, 6, 7, 8]]), jnp.array([[0, 1, 1, 1]]))
    np.testing.assert_array_equal(targets, [[6, 7, 8, 0]])
    np.testing.assert_array_equal(loss_mask, [[1, 1, 1, 0]])


def test_token_entropy_gradient_finite_with_masked_vocab():
    """A -inf logit (masked vocabulary entry) must not make the entropy gradient NaN."""
    logits = jnp.array([[[0.0, 0.0, LN2, -jnp.inf]]])
    grad = jax.grad(lambda z: token_entropy(z).sum())(logits)
    assert np.all(np.isfinite(np.asarray(grad)))
