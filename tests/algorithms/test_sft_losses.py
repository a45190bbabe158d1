"""Hand-computed checks for the SFT cross-entropy and the distillation divergences."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose

from tempax.algorithms.sft import causal_lm_loss, distillation_loss
from tempax.errors import ConfigError

LN2, LN3, LN4 = math.log(2), math.log(3), math.log(4)

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


# Teacher logits [0, 0] -> p_T = [0.5, 0.5]; student logits [ln 3, 0] -> p_S = [0.75, 0.25].
TEACHER = jnp.array([[[0.0, 0.0]]])
STUDENT = jnp.array([[[LN3, 0.0]]])
ONE = jnp.array([[1]])


def test_forward_kl():
    """KL(p_T || p_S) = 0.5 ln(0.5 / 0.75) + 0.5 ln(0.5 / 0.25) = 0.5 ln(4/3) = 0.143841."""
    loss, _ = distillation_loss(STUDENT, TEACHER, ONE, kind="forward_kl")
    assert_allclose(loss, 0.5 * math.log(4 / 3), rtol=1e-5)


def test_reverse_kl():
    """KL(p_S || p_T) = 0.75 ln(0.75 / 0.5) + 0.25 ln(0.25 / 0.5) = 0.75 ln 1.5 - 0.25 ln 2 = 0.130812."""
    loss, _ = distillation_loss(STUDENT, TEACHER, ONE, kind="reverse_kl")
    assert_allclose(loss, 0.75 * math.log(1.5) - 0.25 * LN2, rtol=1e-5)


def test_generalized_jsd():
    """beta = 0.5: M = [0.625, 0.375].
    KL(p_T || M) = 0.5 ln(0.5/0.625) + 0.5 ln(0.5/0.375) = 0.5 ln(16/15) = 0.032269.
    KL(p_S || M) = 0.75 ln(0.75/0.625) + 0.25 ln(0.25/0.375) = 0.75 ln 1.2 + 0.25 ln(2/3) = 0.035375.
    JSD = 0.5 * 0.032269 + 0.5 * 0.035375 = 0.033822.
    beta = 0.25: M = 0.25 p_T + 0.75 p_S = [0.6875, 0.3125];
    0.25 (0.5 ln(0.5/0.6875) + 0.5 ln(0.5/0.3125)) + 0.75 (0.75 ln(0.75/0.6875) + 0.25 ln(0.25/0.3125))."""
    loss, _ = distillation_loss(STUDENT, TEACHER, ONE, kind="jsd")
    expected = 0.5 * (0.5 * math.log(16 / 15)) + 0.5 * (0.75 * math.log(1.2) + 0.25 * math.log(2 / 3))
    assert_allclose(loss, expected, rtol=1e-5)
    loss, _ = distillation_loss(STUDENT, TEACHER, ONE, kind="jsd", jsd_beta=0.25)
    kl_t = 0.5 * math.log(0.5 / 0.6875) + 0.5 * math.log(0.5 / 0.3125)
    kl_s = 0.75 * math.log(0.75 / 0.6875) + 0.25 * math.log(0.25 / 0.3125)
    assert_allclose(loss, 0.25 * kl_t + 0.75 * kl_s, rtol=1e-5)


def test_distillation_temperature_and_identical_distributions():
    """Student [2 ln 3, 0] at tau = 2 is [ln 3, 0]: the same forward KL 0.5 ln(4/3). Identical logits give 0."""
    loss, _ = distillation_loss(jnp.array([[[2 * LN3, 0.0]]]), TEACHER, ONE, temperature=2.0)
    assert_allclose(loss, 0.5 * math.log(4 / 3), rtol=1e-5)
    for kind in ("forward_kl", "reverse_kl", "jsd"):
        loss, _ = distillation_loss(STUDENT, STUDENT, ONE, kind=kind)
        assert_allclose(loss, 0.0, atol=1e-7)


def test_distillation_masks_positions_and_handles_masked_vocab():
    """Two positions, the second masked with a very different student: loss is position 1's 0.5 ln(4/3) and the
    student gradient there is 0. A -inf teacher logit (p_T = 0) keeps value and gradient finite: teacher
    [0, 0, -inf] vs student [ln 3, 0, -inf] is the same 0.5 ln(4/3)."""
    student = jnp.array([[[LN3, 0.0], [9.0, -9.0]]])
    teacher = jnp.array([[[0.0, 0.0], [0.0, 0.0]]])
    mask = jnp.array([[1, 0]])
    loss, metrics = distillation_loss(student, teacher, mask)
    assert_allclose(loss, 0.5 * math.log(4 / 3), rtol=1e-5)
    assert_allclose(metrics["num_tokens"], 1.0)
    grad = jax.grad(lambda s: distillation_loss(s, teacher, mask)[0])(student)
    assert_allclose(grad[0, 1], [0.0, 0.0])

    student3 = jnp.array([[[LN3, 0.0, -jnp.inf]]])
    teacher3 = jnp.array([[[0.0, 0.0, -jnp.inf]]])
    for kind in ("forward_kl", "reverse_kl"):
        loss, _ = distillation_loss(student3, teacher3, ONE, kind=kind)
        assert np.isfinite(float(loss))
        grad = jax.grad(lambda s, k=kind: distillation_loss(s, teacher3, ONE, kind=k)[0])(student3)
        assert np.all(np.isfinite(np.asarray(grad)))
    assert_allclose(distillation_loss(student3, teacher3, ONE)[0], 0.5 * math.log(4 / 3), rtol=1e-5)


def test_distillation_unknown_kind_and_bad_beta():
    with pytest.raises(ConfigError, match="distillation"):
        distillation_loss(STUDENT, TEACHER, ONE, kind="mse")
    with pytest.raises(ConfigError, match="jsd_beta"):
        distillation_loss(STUDENT, TEACHER, ONE, kind="jsd", jsd_beta=1.0)
