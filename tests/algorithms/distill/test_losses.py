"""Hand-computed checks of the distillation divergences (temperature, T^2, alpha, masks, top-k), their gradient
direction, and the chunked-from-hidden-states loss against the whole-logits one."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose

from tempax.algorithms.distill.losses import LMHead, chunked_distillation_loss, distillation_loss
from tempax.errors import ConfigError

LN2, LN3 = math.log(2), math.log(3)

# Teacher logits [0, 0] -> p_T = [0.5, 0.5]; student logits [ln 3, 0] -> p_S = [0.75, 0.25].
TEACHER = jnp.array([[[0.0, 0.0]]])
STUDENT = jnp.array([[[LN3, 0.0]]])
TARGET = jnp.array([[0]])
ONE = jnp.array([[1]])


def kd(student, teacher, targets=TARGET, mask=ONE, **kw):
    return distillation_loss(student, teacher, targets, mask, **{"alpha": 1.0, **kw})


def test_forward_kl():
    """KL(p_T || p_S) = 0.5 ln(0.5 / 0.75) + 0.5 ln(0.5 / 0.25) = 0.5 ln(4/3) = 0.143841."""
    loss, metrics = kd(STUDENT, TEACHER, kind="forward_kl")
    assert_allclose(loss, 0.5 * math.log(4 / 3), rtol=1e-5)
    assert_allclose(metrics["kd_loss"], 0.5 * math.log(4 / 3), rtol=1e-5)


def test_reverse_kl():
    """KL(p_S || p_T) = 0.75 ln(0.75 / 0.5) + 0.25 ln(0.25 / 0.5) = 0.75 ln 1.5 - 0.25 ln 2 = 0.130812."""
    loss, _ = kd(STUDENT, TEACHER, kind="reverse_kl")
    assert_allclose(loss, 0.75 * math.log(1.5) - 0.25 * LN2, rtol=1e-5)


def test_generalized_jsd():
    """beta = 0.5: M = [0.625, 0.375].
    KL(p_T || M) = 0.5 ln(0.5/0.625) + 0.5 ln(0.5/0.375) = 0.5 ln(16/15) = 0.032269.
    KL(p_S || M) = 0.75 ln(0.75/0.625) + 0.25 ln(0.25/0.375) = 0.75 ln 1.2 + 0.25 ln(2/3) = 0.035375.
    JSD = 0.5 * 0.032269 + 0.5 * 0.035375 = 0.033822.
    beta = 0.25: M = 0.25 p_T + 0.75 p_S = [0.6875, 0.3125];
    0.25 (0.5 ln(0.5/0.6875) + 0.5 ln(0.5/0.3125)) + 0.75 (0.75 ln(0.75/0.6875) + 0.25 ln(0.25/0.3125))."""
    loss, _ = kd(STUDENT, TEACHER, kind="jsd")
    expected = 0.5 * (0.5 * math.log(16 / 15)) + 0.5 * (0.75 * math.log(1.2) + 0.25 * math.log(2 / 3))
    assert_allclose(loss, expected, rtol=1e-5)
    loss, _ = kd(STUDENT, TEACHER, kind="jsd", jsd_beta=0.25)
    kl_t = 0.5 * math.log(0.5 / 0.6875) + 0.5 * math.log(0.5 / 0.3125)
    kl_s = 0.75 * math.log(0.75 / 0.6875) + 0.25 * math.log(0.25 / 0.3125)
    assert_allclose(loss, 0.25 * kl_t + 0.75 * kl_s, rtol=1e-5)


def test_temperature_scales_logits_and_the_loss_by_t_squared():
    """Student [2 ln 3, 0] at T = 2 is [ln 3, 0]: D = 0.5 ln(4/3) as at T = 1, and the loss is T^2 D = 4 * 0.143841
    = 0.575364 (kd_loss reports D itself). Identical logits give 0 for every kind."""
    loss, metrics = kd(jnp.array([[[2 * LN3, 0.0]]]), TEACHER, temperature=2.0)
    assert_allclose(metrics["kd_loss"], 0.5 * math.log(4 / 3), rtol=1e-5)
    assert_allclose(loss, 4 * 0.5 * math.log(4 / 3), rtol=1e-5)
    for kind in ("forward_kl", "reverse_kl", "jsd"):
        loss, _ = kd(STUDENT, STUDENT, kind=kind)
        assert_allclose(loss, 0.0, atol=1e-7)


def test_alpha_mixes_the_label_cross_entropy():
    """alpha = 0.25, T = 1, target 0: CE = -ln 0.75 = 0.287682; loss = 0.25 * 0.143841 + 0.75 * 0.287682 = 0.251722.
    alpha = 0 is the cross-entropy alone."""
    ce = -math.log(0.75)
    loss, metrics = kd(STUDENT, TEACHER, alpha=0.25)
    assert_allclose(metrics["ce_loss"], ce, rtol=1e-5)
    assert_allclose(loss, 0.25 * 0.5 * math.log(4 / 3) + 0.75 * ce, rtol=1e-5)
    loss, _ = kd(STUDENT, TEACHER, alpha=0.0)
    assert_allclose(loss, ce, rtol=1e-5)


def test_top_k_teacher_is_renormalised_over_its_top_k():
    """Teacher [ln 6, ln 3, 0] -> p_T ~ [6, 3, 1]; its top 2 renormalised: [2/3, 1/3, 0]. Student uniform [1/3]*3.
    forward KL = 2/3 ln((2/3)/(1/3)) + 1/3 ln 1 + 0 = 2/3 ln 2 = 0.462098.
    jsd (beta 0.5): M = [1/2, 1/3, 1/6]; KL(p_T^2 || M) = 2/3 ln(4/3); KL(p_S || M) = 1/3 ln(2/3) + 1/3 ln 2 =
    1/3 ln(4/3); JSD = 0.5 (2/3 + 1/3) ln(4/3) = 0.5 ln(4/3) = 0.143841.
    Without top-k: forward KL = 0.6 ln 1.8 + 0.3 ln 0.9 + 0.1 ln 0.3 = 0.200038."""
    teacher = jnp.array([[[math.log(6), LN3, 0.0]]])
    student = jnp.zeros((1, 1, 3))
    assert_allclose(kd(student, teacher, top_k=2)[0], 2 / 3 * LN2, rtol=1e-5)
    assert_allclose(kd(student, teacher, top_k=2, kind="jsd")[0], 0.5 * math.log(4 / 3), rtol=1e-5)
    full = 0.6 * math.log(1.8) + 0.3 * math.log(0.9) + 0.1 * math.log(0.3)
    assert_allclose(kd(student, teacher, top_k=0)[0], full, rtol=1e-5)
    assert_allclose(kd(student, teacher, top_k=3)[0], full, rtol=1e-5)
    with pytest.raises(ConfigError, match="reverse_kl with a top-k"):
        kd(student, teacher, top_k=2, kind="reverse_kl")


def test_gradient_direction():
    """d KL(p_T || p_S) / d z_S = p_S - p_T = [0.25, -0.25]: descent lowers the over-weighted logit. With T = 2 and
    the T^2 factor, d (T^2 KL) / d z_S = T (p_S^T - p_T^T) = 2 [0.25, -0.25] = [0.5, -0.5] for student [2 ln 3, 0].
    Top-k (teacher [ln 6, ln 3, 0], k = 2, uniform student): p_S - p_T^2 = [-1/3, 0, 1/3], the cut token pushed
    down. Reverse KL and JSD point the same way as forward KL for the two-token case."""
    grad = jax.grad(lambda s: kd(s, TEACHER)[0])(STUDENT)
    assert_allclose(grad[0, 0], [0.25, -0.25], atol=1e-6)
    grad = jax.grad(lambda s: kd(s, TEACHER, temperature=2.0)[0])(jnp.array([[[2 * LN3, 0.0]]]))
    assert_allclose(grad[0, 0], [0.5, -0.5], atol=1e-6)
    teacher3 = jnp.array([[[math.log(6), LN3, 0.0]]])
    grad = jax.grad(lambda s: kd(s, teacher3, top_k=2)[0])(jnp.zeros((1, 1, 3)))
    assert_allclose(grad[0, 0], [-1 / 3, 0.0, 1 / 3], atol=1e-6)
    for kind in ("reverse_kl", "jsd"):
        grad = jax.grad(lambda s, k=kind: kd(s, TEACHER, kind=k)[0])(STUDENT)
        assert grad[0, 0, 0] > 0 > grad[0, 0, 1], kind
    # The teacher never gets a gradient.
    assert_allclose(jax.grad(lambda t: kd(STUDENT, t)[0])(TEACHER), 0.0)


def test_masks_positions_and_handles_masked_vocab():
    """Two positions, the second masked with a very different student: loss is position 1's 0.5 ln(4/3), the
    student's gradient there is 0, num_tokens = 1. A -inf teacher logit (p_T = 0) keeps value and gradient finite:
    teacher [0, 0, -inf] vs student [ln 3, 0, -inf] is the same 0.5 ln(4/3)."""
    student = jnp.array([[[LN3, 0.0], [9.0, -9.0]]])
    teacher = jnp.array([[[0.0, 0.0], [0.0, 0.0]]])
    mask = jnp.array([[1, 0]])
    targets = jnp.array([[0, 1]])
    loss, metrics = kd(student, teacher, targets, mask)
    assert_allclose(loss, 0.5 * math.log(4 / 3), rtol=1e-5)
    assert_allclose(metrics["num_tokens"], 1.0)
    grad = jax.grad(lambda s: kd(s, teacher, targets, mask)[0])(student)
    assert_allclose(grad[0, 1], [0.0, 0.0])

    student3 = jnp.array([[[LN3, 0.0, -jnp.inf]]])
    teacher3 = jnp.array([[[0.0, 0.0, -jnp.inf]]])
    for kind in ("forward_kl", "reverse_kl"):
        loss, _ = kd(student3, teacher3, kind=kind)
        assert np.isfinite(float(loss))
        grad = jax.grad(lambda s, k=kind: kd(s, teacher3, kind=k)[0])(student3)
        assert np.all(np.isfinite(np.asarray(grad)))
    assert_allclose(kd(student3, teacher3)[0], 0.5 * math.log(4 / 3), rtol=1e-5)


def test_agreement_and_accuracy():
    """Position 1: student argmax 0, teacher argmax 0, target 0 -> agree, hit. Position 2: student argmax 1,
    teacher argmax 0, target 1 -> disagree, hit. agreement = 1/2, token_accuracy = 2/2."""
    student = jnp.array([[[2.0, 0.0], [0.0, 2.0]]])
    teacher = jnp.array([[[1.0, 0.0], [1.0, 0.0]]])
    _, metrics = kd(student, teacher, jnp.array([[0, 1]]), jnp.array([[1, 1]]))
    assert_allclose(metrics["agreement"], 0.5)
    assert_allclose(metrics["token_accuracy"], 1.0)


def test_bad_arguments():
    with pytest.raises(ConfigError, match="distillation loss"):
        kd(STUDENT, TEACHER, kind="mse")
    with pytest.raises(ConfigError, match="jsd_beta"):
        kd(STUDENT, TEACHER, kind="jsd", jsd_beta=1.0)
    with pytest.raises(ConfigError, match="alpha"):
        kd(STUDENT, TEACHER, alpha=1.5)
    with pytest.raises(ConfigError, match="temperature"):
        kd(STUDENT, TEACHER, temperature=0.0)


# ------------------------------------------------------------------------------------------------------------
# Chunked from hidden states == whole logits


def _case(seed=0, b=2, t=12, d_s=6, d_t=10, v=17):
    rng = np.random.RandomState(seed)
    h_s = jnp.asarray(rng.randn(b, t, d_s), jnp.float32)
    h_t = jnp.asarray(rng.randn(b, t, d_t), jnp.float32)
    w_s = jnp.asarray(rng.randn(v, d_s) * 0.7, jnp.float32)  # tied: [V, D]
    w_t = jnp.asarray(rng.randn(d_t, v) * 0.7, jnp.float32)  # untied: [D, V]
    targets = jnp.asarray(rng.randint(0, v, (b, t)), jnp.int32)
    mask = jnp.asarray(rng.rand(b, t) > 0.3, jnp.int32)
    return h_s, w_s, h_t, w_t, targets, mask


@pytest.mark.parametrize("kw", [
    dict(kind="forward_kl", temperature=2.0, alpha=0.5, chunk_len=4),
    dict(kind="reverse_kl", temperature=1.0, alpha=1.0, chunk_len=3),
    dict(kind="jsd", jsd_beta=0.3, temperature=1.5, alpha=0.7, top_k=5, chunk_len=6),
    dict(kind="forward_kl", top_k=4, alpha=0.0, chunk_len=None),
])
def test_chunked_equals_whole_logits_value_and_gradients(kw):
    """Same loss, metrics and gradients (student hidden states and head) as distillation_loss on the full logits,
    for every divergence, temperatures, top-k and chunk sizes (12 positions in chunks of 4, 3, 6 or whole), with a
    tied student head and an untied teacher head of another hidden size."""
    h_s, w_s, h_t, w_t, targets, mask = _case()
    chunk_len = kw.pop("chunk_len")

    def chunked(h, w):
        return chunked_distillation_loss(h, LMHead(w, True), h_t, LMHead(w_t, False), targets, mask,
                                         chunk_len=chunk_len, **kw)

    def whole(h, w):
        return distillation_loss(h @ w.T, h_t @ w_t, targets, mask, **kw)

    (lc, mc), gc = jax.value_and_grad(chunked, argnums=(0, 1), has_aux=True)(h_s, w_s)
    (lw, mw), gw = jax.value_and_grad(whole, argnums=(0, 1), has_aux=True)(h_s, w_s)
    assert_allclose(lc, lw, rtol=1e-5)
    for key in ("kd_loss", "ce_loss", "agreement", "token_accuracy", "num_tokens", "per_example_kd"):
        assert_allclose(mc[key], mw[key], rtol=1e-5, atol=1e-6, err_msg=key)
    assert_allclose(gc[0], gw[0], rtol=1e-4, atol=1e-6)
    assert_allclose(gc[1], gw[1], rtol=1e-4, atol=1e-6)


def test_chunked_softcap_and_jit():
    """Final-logit soft-capping (Gemma 2) inside the chunks matches capping the whole logits, under jit."""
    h_s, w_s, h_t, w_t, targets, mask = _case(seed=1)
    cap = 3.0

    @jax.jit
    def both(h, w):
        c = chunked_distillation_loss(h, LMHead(w, True, cap), h_t, LMHead(w_t, False, cap), targets, mask,
                                      chunk_len=4, alpha=0.5)[0]
        z = lambda x: cap * jnp.tanh(x / cap)  # noqa: E731
        u = distillation_loss(z(h @ w.T), z(h_t @ w_t), targets, mask, alpha=0.5)[0]
        return c, u

    c, u = both(h_s, w_s)
    assert_allclose(c, u, rtol=1e-5)
    gc = jax.grad(lambda h: both(h, w_s)[0])(h_s)
    gu = jax.grad(lambda h: both(h, w_s)[1])(h_s)
    assert_allclose(gc, gu, rtol=1e-4, atol=1e-6)


def test_vocabulary_mismatch_names_both_sizes():
    h_s, w_s, h_t, w_t, targets, mask = _case()
    with pytest.raises(ConfigError, match=r"student vocabulary \(16 tokens\).*teacher vocabulary \(17 tokens\)"):
        chunked_distillation_loss(h_s, LMHead(w_s[:16], True), h_t, LMHead(w_t, False), targets, mask)
