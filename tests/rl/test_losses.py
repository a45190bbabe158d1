"""Hand-computed checks for the shared policy-gradient terms: DAPO's overlong penalty, the k3 KL estimator, the
clipped surrogate (clip-higher, per-token advantages, masks), GAE and the clipped value loss."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose

from tempax.errors import ConfigError
from tempax.rl.losses import clipped_surrogate, clipped_value_loss, gae, kl_k3, overlong_penalty

LN2 = math.log(2)

# Ratios 1, 1.5, 0.5 against advantages +1 (row 0) and -1 (row 1).
RATIOS = jnp.array([[1.0, 1.5, 0.5], [1.0, 1.5, 0.5]])
LOGP = jnp.log(RATIOS)
OLD = jnp.zeros((2, 3))
ADV = jnp.array([1.0, -1.0])


def test_overlong_penalty():
    """max_len 10, cache 4 -> soft zone starts after 6 tokens: L = 5, 6 -> 0; 7 -> (6 - 7)/4 = -0.25;
    9 -> -0.75; 10 -> -1; 11 (over budget) -> -1."""
    pen = overlong_penalty(jnp.array([5, 6, 7, 9, 10, 11]), max_len=10, cache_len=4)
    assert_allclose(pen, [0.0, 0.0, -0.25, -0.75, -1.0, -1.0], rtol=1e-6)
    with pytest.raises(ConfigError, match="cache_len"):
        overlong_penalty(jnp.array([1]), max_len=10, cache_len=0)


def test_kl_k3_values():
    """d = ref - logp. d = 0 -> 0; d = ln 2 -> 2 - ln 2 - 1 = 0.306853; d = -ln 2 -> 0.5 + ln 2 - 1 = 0.193147.
    A d of 100 (garbage at padding) is clamped to 20: finite, and its gradient is finite."""
    logp = jnp.array([[-1.0, -1.0, -1.0, -100.0]])
    ref = jnp.array([[-1.0, -1.0 + LN2, -1.0 - LN2, 0.0]])
    kl = kl_k3(logp, ref)
    assert_allclose(kl[0, :3], [0.0, 1 - LN2, LN2 - 0.5], rtol=1e-5, atol=1e-7)
    assert np.isfinite(float(kl[0, 3]))
    assert np.all(np.asarray(kl) >= 0)
    grad = jax.grad(lambda lp: jnp.sum(kl_k3(lp, ref) * jnp.array([[1.0, 1.0, 1.0, 0.0]])))(logp)
    assert np.all(np.isfinite(np.asarray(grad)))


def test_clipped_surrogate_both_sides():
    """eps 0.2. A = +1: r = 1 -> -1; r = 1.5 -> -min(1.5, 1.2) = -1.2 (clipped high); r = 0.5 -> -min(0.5, 0.8)
    = -0.5 (not clipped). A = -1: r = 1 -> 1; r = 1.5 -> -min(-1.5, -1.2) = 1.5 (not clipped); r = 0.5 ->
    -min(-0.5, -0.8) = 0.8 (clipped low). Clip fractions: high 1/6, low 1/6, total 2/6; ratio mean
    (1 + 1.5 + 0.5) * 2 / 6 = 1."""
    loss, metrics = clipped_surrogate(LOGP, OLD, ADV, eps_low=0.2, eps_high=0.2)
    assert_allclose(loss, [[-1.0, -1.2, -0.5], [1.0, 1.5, 0.8]], rtol=1e-5)
    assert_allclose(metrics["clip_frac_high"], 1 / 6, rtol=1e-6)
    assert_allclose(metrics["clip_frac_low"], 1 / 6, rtol=1e-6)
    assert_allclose(metrics["clip_frac"], 2 / 6, rtol=1e-6)
    assert_allclose(metrics["ratio_mean"], 1.0, rtol=1e-5)
    assert_allclose(metrics["ratio_max"], 1.5, rtol=1e-5)
    assert_allclose(metrics["ratio_min"], 0.5, rtol=1e-5)


def test_clipped_surrogate_gradient_is_zero_where_clipped():
    """d l / d logp = -r A where unclipped, 0 where clipped: row 0 [-1, 0, -0.5], row 1 [1, 1.5, 0]."""
    grad = jax.grad(lambda lp: clipped_surrogate(lp, OLD, ADV, eps_low=0.2, eps_high=0.2)[0].sum())(LOGP)
    assert_allclose(grad, [[-1.0, 0.0, -0.5], [1.0, 1.5, 0.0]], rtol=1e-5, atol=1e-7)


def test_clip_higher():
    """A = +1, r = 1.25: symmetric eps 0.2 clips (loss -1.2, gradient 0); DAPO clip-higher eps_high 0.28 does not
    (loss -1.25, gradient -1.25). The low side still clips at 1 - 0.2: A = -1, r = 0.7 -> loss 0.8, clipped."""
    logp = jnp.log(jnp.array([[1.25], [0.7]]))
    old = jnp.zeros((2, 1))
    adv = jnp.array([1.0, -1.0])
    sym, sym_m = clipped_surrogate(logp, old, adv, eps_low=0.2, eps_high=0.2)
    high, high_m = clipped_surrogate(logp, old, adv, eps_low=0.2, eps_high=0.28)
    assert_allclose(sym, [[-1.2], [0.8]], rtol=1e-5)
    assert_allclose(high, [[-1.25], [0.8]], rtol=1e-5)
    assert_allclose(sym_m["clip_frac_high"], 0.5)
    assert_allclose(high_m["clip_frac_high"], 0.0)
    assert_allclose(high_m["clip_frac_low"], 0.5)
    g = jax.grad(lambda lp: clipped_surrogate(lp, old, adv, eps_low=0.2, eps_high=0.28)[0].sum())(logp)
    assert_allclose(g[0, 0], -1.25, rtol=1e-5)


def test_clipped_surrogate_per_token_advantages_and_mask():
    """[B, T] advantages work (PPO); a mask leaves masked tokens out of the metrics: only the r = 1.5, A = +1
    token is in, and it is clipped high -> clip_frac_high 1."""
    mask = jnp.array([[0, 1, 0], [0, 0, 0]])
    adv_bt = jnp.array([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    loss, metrics = clipped_surrogate(LOGP, OLD, adv_bt, eps_low=0.2, eps_high=0.2, mask=mask)
    assert_allclose(loss[0, 1], -1.2, rtol=1e-5)
    assert_allclose(metrics["clip_frac_high"], 1.0)
    assert_allclose(metrics["ratio_mean"], 1.5, rtol=1e-5)


def test_gae_monte_carlo_and_discounted():
    """Rewards [0, 0, 1], V = 0.5 everywhere.
    gamma = lam = 1: A_t = (sum of future rewards) - V_t = 0.5 at every step; returns 1.
    gamma 0.9, lam 0.5: delta_2 = 1 - 0.5 = 0.5; delta_1 = 0 + 0.9 * 0.5 - 0.5 = -0.05; delta_0 = -0.05.
    A_2 = 0.5; A_1 = -0.05 + 0.45 * 0.5 = 0.175; A_0 = -0.05 + 0.45 * 0.175 = 0.02875.
    returns = A + V = [0.52875, 0.675, 1.0]."""
    rewards = jnp.array([[0.0, 0.0, 1.0]])
    values = jnp.full((1, 3), 0.5)
    mask = jnp.ones((1, 3))
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert_allclose(adv, [[0.5, 0.5, 0.5]], rtol=1e-6)
    assert_allclose(ret, [[1.0, 1.0, 1.0]], rtol=1e-6)
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    assert_allclose(adv, [[0.02875, 0.175, 0.5]], rtol=1e-5)
    assert_allclose(ret, [[0.52875, 0.675, 1.0]], rtol=1e-5)


def test_gae_masks_prompt_and_padding():
    """Same completion [0, 0, 1] / V 0.5 placed after one prompt token and before one padding token holding
    reward 5 and value 9: the completion's advantages are unchanged [0.02875, 0.175, 0.5] and masked positions
    get 0."""
    rewards = jnp.array([[3.0, 0.0, 0.0, 1.0, 5.0]])
    values = jnp.array([[7.0, 0.5, 0.5, 0.5, 9.0]])
    mask = jnp.array([[0, 1, 1, 1, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    assert_allclose(adv, [[0.0, 0.02875, 0.175, 0.5, 0.0]], rtol=1e-5, atol=1e-7)
    assert_allclose(ret, [[0.0, 0.52875, 0.675, 1.0, 0.0]], rtol=1e-5, atol=1e-7)


def test_clipped_value_loss():
    """c = 0.2, V_old = 1.0.
    Token 0: V = 1.5, R = 2.0: V_clip = 1.2; (1.5 - 2)^2 = 0.25 < (1.2 - 2)^2 = 0.64 -> 0.5 * 0.64 = 0.32, clipped.
    Token 1: V = 1.5, R = 1.0: V_clip = 1.2; 0.25 > 0.04 -> 0.5 * 0.25 = 0.125, not clipped.
    Token 2 masked. Loss (0.32 + 0.125) / 2 = 0.2225; clip fraction 1/2."""
    values = jnp.array([[1.5, 1.5, 100.0]])
    old = jnp.ones((1, 3))
    returns = jnp.array([[2.0, 1.0, -100.0]])
    loss, metrics = clipped_value_loss(values, old, returns, jnp.array([[1, 1, 0]]), clip_range=0.2)
    assert_allclose(loss, 0.2225, rtol=1e-5)
    assert_allclose(metrics["value_clip_frac"], 0.5)
