"""Hand-computed checks for dynamic sampling, GSPO ratios, aggregation and the GRPO loss (the shared terms it builds
on, clipped surrogate and k3 KL: tests/rl/test_losses.py)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from tempax.algorithms.grpo.losses import aggregate_token_loss, dynamic_sampling_keep, grpo_loss, gspo_sequence_ratio
from tempax.errors import ConfigError

LN2 = math.log(2)


# ------------------------------------------------------------------------------------------- dynamic sampling


def test_dynamic_sampling_keep():
    """Groups [1, 0] (spread), [0.5, 0.5] (none), [1, 1] (none) -> keep [True, False, False]."""
    keep = dynamic_sampling_keep(jnp.array([1.0, 0.0, 0.5, 0.5, 1.0, 1.0]), 2)
    assert_array_equal(keep, [True, False, False])


# ------------------------------------------------------------------------------------------- GSPO


def test_gspo_sequence_ratio_values():
    """Row 0: log-ratios [ln 2, 0, (masked) ln 8] -> mean (ln 2 + 0) / 2 -> s = sqrt(2) = 1.414214.
    Row 1: [0, -ln 4, ln 4] all in -> mean 0 -> s = 1. Row 2: empty -> s = 1.
    The token form equals s at every position."""
    logp = jnp.array([[LN2, 0.0, 3 * LN2], [0.0, -2 * LN2, 2 * LN2], [5.0, 5.0, 5.0]])
    mask = jnp.array([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    seq, tok = gspo_sequence_ratio(logp, jnp.zeros((3, 3)), mask)
    assert_allclose(seq, [math.sqrt(2), 1.0, 1.0], rtol=1e-6)
    assert_allclose(tok, jnp.broadcast_to(seq[:, None], (3, 3)), rtol=1e-6)


def test_gspo_token_form_gradient_matches_sequence_ratio():
    """d s / d logp_t = s / |y| on masked-in tokens: row 0 [sqrt(2)/2, sqrt(2)/2, 0]. The token form averaged over
    each sequence's tokens, sum_t m_t s_t / |y|, has the same gradient."""
    logp = jnp.array([[LN2, 0.0, 3 * LN2]])
    old = jnp.zeros((1, 3))
    mask = jnp.array([[1, 1, 0]])
    g_seq = jax.grad(lambda lp: gspo_sequence_ratio(lp, old, mask)[0].sum())(logp)
    g_tok = jax.grad(lambda lp: (gspo_sequence_ratio(lp, old, mask)[1] * mask).sum() / 2.0)(logp)
    r = math.sqrt(2) / 2
    assert_allclose(g_seq, [[r, r, 0.0]], rtol=1e-6, atol=1e-7)
    assert_allclose(g_tok, [[r, r, 0.0]], rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------------------- aggregation

PER_TOKEN = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
AGG_MASK = jnp.array([[1, 1, 0], [1, 1, 1]])


def test_aggregate_modes():
    """x = [[1, 2, 3], [4, 5, 6]], mask [[1, 1, 0], [1, 1, 1]].
    token_mean: (1 + 2 + 4 + 5 + 6) / 5 = 3.6.
    seq_mean_token_mean: ((1 + 2) / 2 + (4 + 5 + 6) / 3) / 2 = (1.5 + 5) / 2 = 3.25.
    seq_mean_token_sum_norm, max_len 4: (3 / 4 + 15 / 4) / 2 = 2.25."""
    assert_allclose(aggregate_token_loss(PER_TOKEN, AGG_MASK, "token_mean"), 3.6, rtol=1e-6)
    assert_allclose(aggregate_token_loss(PER_TOKEN, AGG_MASK, "seq_mean_token_mean"), 3.25, rtol=1e-6)
    assert_allclose(aggregate_token_loss(PER_TOKEN, AGG_MASK, "seq_mean_token_sum_norm", max_len=4), 2.25, rtol=1e-6)


@pytest.mark.parametrize(
    "mode, expected", [("token_mean", 3.6), ("seq_mean_token_mean", 3.25), ("seq_mean_token_sum_norm", 2.25)]
)
def test_aggregate_ignores_padding_rows_and_masked_values(mode, expected):
    """Adding an all-masked row [7, 8, 9] and NaN at a masked position changes nothing; an empty batch gives 0."""
    x = jnp.concatenate([PER_TOKEN.at[0, 2].set(jnp.nan), jnp.array([[7.0, 8.0, 9.0]])])
    mask = jnp.concatenate([AGG_MASK, jnp.zeros((1, 3), AGG_MASK.dtype)])
    assert_allclose(aggregate_token_loss(x, mask, mode, max_len=4), expected, rtol=1e-6)
    assert_allclose(aggregate_token_loss(PER_TOKEN, jnp.zeros_like(AGG_MASK), mode, max_len=4), 0.0)


def test_aggregate_errors():
    with pytest.raises(ConfigError, match="unknown loss aggregation 'sum'"):
        aggregate_token_loss(PER_TOKEN, AGG_MASK, "sum")
    with pytest.raises(ConfigError, match="max_len"):
        aggregate_token_loss(PER_TOKEN, AGG_MASK, "seq_mean_token_sum_norm")


# ------------------------------------------------------------------------------------------- GRPO loss

GRPO_MASK = jnp.array([[1, 1, 0], [1, 0, 0]])
GRPO_ADV = jnp.array([2.0, -1.0])


def test_grpo_loss_on_policy_values_and_gradient():
    """On-policy (old = None, ratio 1), beta 0: per-token loss -A.
    seq_mean_token_mean: (-2 + 1) / 2 = -0.5; token_mean: (-2 - 2 + 1) / 3 = -1;
    sum_norm max_len 3: (-4/3 + 1/3) / 2 = -0.5.
    Gradient for seq_mean_token_mean: row 0 tokens -A/(2 seqs * 2 tokens) = -0.5, row 1 +1/(2 * 1) = 0.5."""
    logp = jnp.full((2, 3), -1.0)
    loss, metrics = grpo_loss(logp, None, None, GRPO_ADV, GRPO_MASK, beta=0.0)
    assert_allclose(loss, -0.5, rtol=1e-6)
    assert "kl" not in metrics
    assert_allclose(metrics["ratio_mean"], 1.0)
    assert_allclose(metrics["num_tokens"], 3.0)
    loss, _ = grpo_loss(logp, None, None, GRPO_ADV, GRPO_MASK, beta=0.0, aggregation="token_mean")
    assert_allclose(loss, -1.0, rtol=1e-6)
    loss, _ = grpo_loss(
        logp, None, None, GRPO_ADV, GRPO_MASK, beta=0.0, aggregation="seq_mean_token_sum_norm", max_len=3
    )
    assert_allclose(loss, -0.5, rtol=1e-6)
    grad = jax.grad(lambda lp: grpo_loss(lp, None, None, GRPO_ADV, GRPO_MASK, beta=0.0)[0])(logp)
    assert_allclose(grad, [[-0.5, -0.5, 0.0], [0.5, 0.0, 0.0]], rtol=1e-6)


def test_grpo_loss_with_importance_weights():
    """Stale tokens weighted by w = [[1.5, 0.5, -], [2, -, -]] (on-policy ratio 1, beta 0): per-token loss -A w,
    row 0: (-2 * 1.5 - 2 * 0.5) / 2 = -2, row 1: (1 * 2) / 1 = 2, seq_mean_token_mean (-2 + 2) / 2 = 0.
    Gradient: row 0 -A w / (2 seqs * 2 tokens) = -0.75, -0.25; row 1 +1 * 2 / (2 * 1) = 1.
    is_weight_mean over the 3 masked tokens: (1.5 + 0.5 + 2) / 3 = 4/3."""
    logp = jnp.full((2, 3), -1.0)
    w = jnp.array([[1.5, 0.5, 7.0], [2.0, 7.0, 7.0]])  # 7 on masked positions: must not count
    loss, metrics = grpo_loss(logp, None, None, GRPO_ADV, GRPO_MASK, beta=0.0, token_weights=w)
    assert_allclose(loss, 0.0, atol=1e-6)
    assert_allclose(metrics["is_weight_mean"], 4 / 3, rtol=1e-6)
    grad = jax.grad(lambda lp: grpo_loss(lp, None, None, GRPO_ADV, GRPO_MASK, beta=0.0, token_weights=w)[0])(logp)
    assert_allclose(grad, [[-0.75, -0.25, 0.0], [1.0, 0.0, 0.0]], rtol=1e-6)


def test_grpo_loss_with_kl():
    """logp 0, ref ln 2 everywhere: k3 = 2 - ln 2 - 1 = 0.306853 per token.
    beta 0.1, seq_mean_token_mean: -0.5 + 0.1 * 0.306853 = -0.469315; pg_loss -0.5; kl metric 0.306853."""
    logp = jnp.zeros((2, 3))
    ref = jnp.full((2, 3), LN2)
    loss, metrics = grpo_loss(logp, logp, ref, GRPO_ADV, GRPO_MASK, beta=0.1)
    assert_allclose(loss, -0.5 + 0.1 * (1 - LN2), rtol=1e-5)
    assert_allclose(metrics["pg_loss"], -0.5, rtol=1e-6)
    assert_allclose(metrics["kl"], 1 - LN2, rtol=1e-5)
    # beta = 0 with a reference: KL is reported but not added.
    loss, metrics = grpo_loss(logp, logp, ref, GRPO_ADV, GRPO_MASK, beta=0.0)
    assert_allclose(loss, -0.5, rtol=1e-6)
    assert_allclose(metrics["kl"], 1 - LN2, rtol=1e-5)


def test_grpo_loss_sequence_vs_token_importance():
    """Row 0 log-ratios [ln 2, 0], A = +2, eps 0.2, mask [1, 1, 0]; row 1 on-policy, A = -1 (loss 1).
    token: ratios 2 (clipped at 1.2 -> -2.4) and 1 (-2) -> row mean -2.2; loss (-2.2 + 1) / 2 = -0.6.
    sequence: s = sqrt(2) > 1.2 so both tokens clip -> -2.4; loss (-2.4 + 1) / 2 = -0.7."""
    logp = jnp.array([[LN2, 0.0, 0.0], [0.0, 0.0, 0.0]])
    old = jnp.zeros((2, 3))
    loss_tok, m_tok = grpo_loss(logp, old, None, GRPO_ADV, GRPO_MASK, beta=0.0)
    loss_seq, m_seq = grpo_loss(logp, old, None, GRPO_ADV, GRPO_MASK, beta=0.0, importance="sequence")
    assert_allclose(loss_tok, -0.6, rtol=1e-5)
    assert_allclose(loss_seq, -0.7, rtol=1e-5)
    assert_allclose(m_tok["clip_frac_high"], 1 / 3, rtol=1e-6)
    assert_allclose(m_seq["clip_frac_high"], 2 / 3, rtol=1e-6)


def test_grpo_loss_masked_tokens_contribute_nothing():
    """Garbage at masked positions (logp 50, old -50, ref 100: log-ratio 100, k3 argument 50) changes neither
    the loss nor the finite gradient, and the masked gradient entries are 0."""
    logp = jnp.zeros((2, 3))
    old = jnp.zeros((2, 3))
    ref = jnp.full((2, 3), LN2)
    garbage = GRPO_MASK == 0
    logp_g = jnp.where(garbage, 50.0, logp)
    old_g = jnp.where(garbage, -50.0, old)
    ref_g = jnp.where(garbage, 100.0, ref)
    for importance in ("token", "sequence"):
        for aggregation in ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"):
            kwargs = dict(beta=0.1, importance=importance, aggregation=aggregation, max_len=3)
            clean = grpo_loss(logp, old, ref, GRPO_ADV, GRPO_MASK, **kwargs)[0]
            dirty, metrics = grpo_loss(logp_g, old_g, ref_g, GRPO_ADV, GRPO_MASK, **kwargs)
            assert_allclose(dirty, clean, rtol=1e-6)
            assert_allclose(metrics["ratio_max"], 1.0, rtol=1e-6)
            grad = jax.grad(lambda lp, kw=kwargs: grpo_loss(lp, old_g, ref_g, GRPO_ADV, GRPO_MASK, **kw)[0])(logp_g)
            assert np.all(np.isfinite(np.asarray(grad)))
            assert_allclose(np.asarray(grad)[np.asarray(garbage)], 0.0)


def test_grpo_loss_errors():
    logp = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="needs ref_logp"):
        grpo_loss(logp, logp, None, GRPO_ADV, GRPO_MASK, beta=0.04)
    with pytest.raises(ConfigError, match="importance"):
        grpo_loss(logp, logp, None, GRPO_ADV, GRPO_MASK, beta=0.0, importance="segment")
    with pytest.raises(ConfigError, match="aggregation"):
        grpo_loss(logp, logp, None, GRPO_ADV, GRPO_MASK, beta=0.0, aggregation="sum")


def test_grpo_loss_jits():
    """The hyper-parameters are static; arrays go through jit (same -0.5 as the on-policy case)."""
    fn = jax.jit(lambda lp, old, adv, m: grpo_loss(lp, old, None, adv, m, beta=0.0)[0])
    logp = jnp.full((2, 3), -1.0)
    assert_allclose(fn(logp, logp, GRPO_ADV, GRPO_MASK), -0.5, rtol=1e-6)
