"""Hand-computed checks for the SFT cross-entropy."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest
from numpy.testing import assert_allclose

from tempax.algorithms.sft.losses import causal_lm_loss
from tempax.errors import ConfigError

LN2, LN4 = math.log(2), math.log(4)

# Row 0: t0 logits [0, 0, ln 2] target 2 -> nll = ln 4 - ln 2 = ln 2; t1 logits [0, 0, 0] target 0 -> nll = ln 3.
# Row 1: t0 logits [0, 0, ln 2] target 0 -> nll = ln 4; t1 is masked (its logits/target are arbitrary).
LOGITS = jnp.array(
    [
        [[0.0, 0.0, LN2], [0.0, 0.0, 0.0]],
        [[0.0, 0.0, LN2], [5.0, -3.0, 1.0]],
    ]
)
TARGETS = jnp.array([[2, 0], [0, 1]])
MASK = jnp.array([[1, 1], [1, 0]])


def test_causal_lm_loss_token_normalization():
    """Mean over the 3 supervised tokens: (ln 2 + ln 3 + ln 4) / 3 = ln 24 / 3 = 1.059351.
    per-example: row 0 (ln 2 + ln 3) / 2 = ln 6 / 2 = 0.895880, row 1 ln 4 = 1.386294.
    token accuracy: argmax row0 t0 = 2 (hit), row0 t1 = 0 (first of ties, hit), row1 t0 = 2 vs 0 (miss) -> 2/3.
    nll_sum = ln 24."""
    loss, metrics = causal_lm_loss(LOGITS, TARGETS, MASK)
    assert_allclose(loss, math.log(24) / 3, rtol=1e-6)
    assert_allclose(metrics["per_example_loss"], [math.log(6) / 2, LN4], rtol=1e-6)
    assert_allclose(metrics["num_tokens"], 3.0)
    assert_allclose(metrics["num_sequences"], 2.0)
    assert_allclose(metrics["nll_sum"], math.log(24), rtol=1e-6)
    assert_allclose(metrics["token_accuracy"], 2 / 3, rtol=1e-6)


def test_causal_lm_loss_sequence_normalization():
    """Mean of per-example means: (ln 6 / 2 + ln 4) / 2 = (0.895880 + 1.386294) / 2 = 1.141087."""
    loss, _ = causal_lm_loss(LOGITS, TARGETS, MASK, normalize="sequences")
    assert_allclose(loss, (math.log(6) / 2 + LN4) / 2, rtol=1e-6)


def test_causal_lm_loss_ignores_empty_rows_and_empty_batch():
    """A padding row with an all-zero mask changes neither normalization; an all-empty batch gives 0."""
    logits = jnp.concatenate([LOGITS, jnp.ones((1, 2, 3))], axis=0)
    targets = jnp.concatenate([TARGETS, jnp.array([[1, 1]])], axis=0)
    mask = jnp.concatenate([MASK, jnp.zeros((1, 2), MASK.dtype)], axis=0)
    for normalize, expected in (("tokens", math.log(24) / 3), ("sequences", (math.log(6) / 2 + LN4) / 2)):
        loss, metrics = causal_lm_loss(logits, targets, mask, normalize=normalize)
        assert_allclose(loss, expected, rtol=1e-6)
        assert_allclose(metrics["num_sequences"], 2.0)
    loss, _ = causal_lm_loss(LOGITS, TARGETS, jnp.zeros_like(MASK))
    assert_allclose(loss, 0.0)


def test_causal_lm_loss_masked_tokens_contribute_nothing():
    """Changing logits and target at the masked position (row 1, t1) leaves loss unchanged; its gradient is 0."""
    other_logits = LOGITS.at[1, 1].set(jnp.array([-9.0, 9.0, 0.0]))
    other_targets = TARGETS.at[1, 1].set(-100)
    assert_allclose(causal_lm_loss(other_logits, other_targets, MASK)[0], causal_lm_loss(LOGITS, TARGETS, MASK)[0])
    grad = jax.grad(lambda z: causal_lm_loss(z, TARGETS, MASK)[0])(LOGITS)
    assert_allclose(grad[1, 1], [0.0, 0.0, 0.0])


def test_causal_lm_loss_gradient():
    """Token normalization: d loss / d logits at row 0 t0 = (softmax - onehot(2)) / 3
    = ([0.25, 0.25, 0.5] - [0, 0, 1]) / 3 = [1/12, 1/12, -1/6]."""
    grad = jax.grad(lambda z: causal_lm_loss(z, TARGETS, MASK)[0])(LOGITS)
    assert_allclose(grad[0, 0], [1 / 12, 1 / 12, -1 / 6], rtol=1e-5)


def test_causal_lm_loss_unknown_normalization():
    with pytest.raises(ConfigError, match="normalization"):
        causal_lm_loss(LOGITS, TARGETS, MASK, normalize="words")
