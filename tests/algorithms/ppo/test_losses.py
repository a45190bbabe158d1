"""PPO's math against numbers worked out by hand (each test's docstring has the arithmetic)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tempax.algorithms.ppo.losses import (
    adaptive_kl_coef,
    approx_kl,
    explained_variance,
    kl_penalized_rewards,
    last_token_mask,
    missing_eos_penalty,
    ppo_loss,
    ppo_policy_loss,
    whiten,
)
from tempax.errors import ConfigError
from tempax.rl.losses import clipped_value_loss, gae

PAD = 99.0  # garbage at padding positions: it must never reach a valid token


def test_last_token_mask_marks_each_rows_final_valid_token():
    mask = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(last_token_mask(mask), [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


def test_kl_penalized_rewards_put_the_score_on_the_last_token():
    """Row 0 (3 tokens): k1 = logp - ref = [-1 + 1.5, -2 + 2, -0.5 + 1] = [0.5, 0, 0.5]; beta = 0.1, score 1.0:
    r = [-0.05, 0, -0.05 + 1.0] = [-0.05, 0, 0.95], padding 0.
    Row 1 (1 token): k1 = -1 - (-0.8) = -0.2 (k1 can be negative); r = 0.02 + 0.6 = 0.62."""
    mask = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0]], jnp.float32)
    logp = jnp.array([[-1.0, -2.0, -0.5, PAD], [-1.0, PAD, PAD, PAD]])
    ref = jnp.array([[-1.5, -2.0, -1.0, -PAD], [-0.8, -PAD, 0.0, 0.0]])
    rewards, k1 = kl_penalized_rewards(jnp.array([1.0, 0.6]), logp, ref, mask, kl_coef=0.1)
    np.testing.assert_allclose(k1, [[0.5, 0, 0.5, 0], [-0.2, 0, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(rewards, [[-0.05, 0, 0.95, 0], [0.62, 0, 0, 0]], atol=1e-6)


def test_missing_eos_penalty_hits_only_truncated_completions():
    """scores [1, 2], truncated [yes, no], penalty 1.5 -> [1 - 1.5, 2] = [-0.5, 2]."""
    out = missing_eos_penalty(jnp.array([1.0, 2.0]), jnp.array([True, False]), penalty=1.5)
    np.testing.assert_allclose(out, [-0.5, 2.0])


def test_gae_worked_example_with_masks_and_the_final_token_reward():
    """gamma = 0.9, lambda = 0.8 (gamma lambda = 0.72); the last valid token is terminal (V after it is 0).

    Row 0: rewards [0, 0, 1] (score on the last token), V = [0.5, 0.6, 0.7], then padding (reward and value 99).
      delta_2 = 1 - 0.7 = 0.3;  delta_1 = 0 + 0.9 * 0.7 - 0.6 = 0.03;  delta_0 = 0 + 0.9 * 0.6 - 0.5 = 0.04
      A_2 = 0.3;  A_1 = 0.03 + 0.72 * 0.3 = 0.246;  A_0 = 0.04 + 0.72 * 0.246 = 0.21712
      R = A + V = [1.0, 0.846, 0.71712]
    Row 1: rewards [-0.1, 0.5] (a KL penalty on token 0, score on token 1), V = [0.2, 0.4]:
      delta_1 = 0.5 - 0.4 = 0.1;  delta_0 = -0.1 + 0.9 * 0.4 - 0.2 = 0.06
      A = [0.06 + 0.072, 0.1] = [0.132, 0.1];  R = [0.332, 0.5]
    """
    mask = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]], jnp.float32)
    rewards = jnp.array([[0.0, 0.0, 1.0, PAD], [-0.1, 0.5, PAD, PAD]])
    values = jnp.array([[0.5, 0.6, 0.7, PAD], [0.2, 0.4, PAD, PAD]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    np.testing.assert_allclose(adv, [[0.21712, 0.246, 0.3, 0], [0.132, 0.1, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(ret, [[0.71712, 0.846, 1.0, 0], [0.332, 0.5, 0, 0]], atol=1e-6)


def test_gae_with_gamma_and_lambda_one_is_return_minus_value():
    """gamma = lambda = 1: A_t = sum_{s >= t} r_s - V_t. Rewards [-0.05, 0, 0.95], V [0.1, 0.2, 0.3]:
    returns-to-go [0.9, 0.95, 0.95] -> A = [0.8, 0.75, 0.65]."""
    mask = jnp.array([[1, 1, 1]], jnp.float32)
    adv, ret = gae(jnp.array([[-0.05, 0.0, 0.95]]), jnp.array([[0.1, 0.2, 0.3]]), mask, gamma=1.0, lam=1.0)
    np.testing.assert_allclose(adv, [[0.8, 0.75, 0.65]], atol=1e-6)
    np.testing.assert_allclose(ret, [[0.9, 0.95, 0.95]], atol=1e-6)


def test_whitening_uses_only_valid_tokens():
    """Valid values 1, 2, 3 (padding 99 ignored): mean 2, population variance (1 + 0 + 1) / 3 = 2/3, std 0.8165:
    whitened [-1.2247, 0, 1.2247], padding 0. shift_mean=False adds the mean back: [0.7753, 2, 3.2247]."""
    x = jnp.array([[1.0, 2.0, PAD], [3.0, PAD, PAD]])
    mask = jnp.array([[1, 1, 0], [1, 0, 0]], jnp.float32)
    s = math.sqrt(1.5)
    np.testing.assert_allclose(whiten(x, mask, eps=0.0), [[-s, 0, 0], [s, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(whiten(x, mask, shift_mean=False, eps=0.0), [[2 - s, 2, 0], [2 + s, 0, 0]], atol=1e-6)


def test_clipped_value_loss_both_sides():
    """V_old = 0 everywhere, c = 0.2; loss per token 0.5 max((V - R)^2, (V_clip - R)^2):
      a) R = 1,  V = 0.5:  V_clip = 0.2,  (0.5 - 1)^2 = 0.25 < (0.2 - 1)^2 = 0.64   -> 0.32, clipped side (above)
      b) R = -1, V = -0.5: V_clip = -0.2, 0.25 < (-0.2 + 1)^2 = 0.64                 -> 0.32, clipped side (below)
      c) R = -1, V = 0.5:  V_clip = 0.2,  (1.5)^2 = 2.25 > (1.2)^2 = 1.44             -> 1.125, unclipped
      d) R = 1,  V = 0.1:  inside the range, both 0.81                               -> 0.405, unclipped
    mean (0.32 + 0.32 + 1.125 + 0.405) / 4 = 0.5425; clip fraction 2 / 4; the padding token (V = 99) is ignored.
    The clipped tokens a, b get no gradient; c gets V - R = 1.5 / 4 tokens = 0.375, d gets (0.1 - 1) / 4 = -0.225."""
    values = jnp.array([[0.5, -0.5, 0.5, 0.1, PAD]])
    old = jnp.zeros((1, 5))
    returns = jnp.array([[1.0, -1.0, -1.0, 1.0, 0.0]])
    mask = jnp.array([[1, 1, 1, 1, 0]], jnp.float32)
    loss, m = clipped_value_loss(values, old, returns, mask, clip_range=0.2)
    assert float(loss) == pytest.approx(0.5425, abs=1e-6)
    assert float(m["value_clip_frac"]) == pytest.approx(0.5)
    grad = jax.grad(lambda v: clipped_value_loss(v, old, returns, mask, clip_range=0.2)[0])(values)
    np.testing.assert_allclose(grad, [[0, 0, 0.375, -0.225, 0]], atol=1e-6)


def test_explained_variance():
    """R = [1, 2, 3], V = [1, 2, 2] (padding ignored): R - V = [0, 0, 1], Var = 1/3 - 1/9 = 2/9; Var R = 2/3;
    EV = 1 - (2/9) / (2/3) = 2/3. V = R gives 1; constant returns give 0 by convention."""
    mask = jnp.array([[1, 1, 1, 0]], jnp.float32)
    returns = jnp.array([[1.0, 2.0, 3.0, PAD]])
    assert float(explained_variance(jnp.array([[1.0, 2.0, 2.0, -PAD]]), returns, mask)) == pytest.approx(2 / 3)
    assert float(explained_variance(returns, returns, mask)) == pytest.approx(1.0)
    assert float(explained_variance(returns, jnp.ones((1, 4)), mask)) == 0.0


def test_adaptive_kl_controller_moves_beta_toward_the_target():
    """beta 0.1, target 6 nats, n = 256 completions, horizon 10 000 (n / horizon = 0.0256):
      KL 9   -> e = min(9/6 - 1, 0.2) = 0.2    -> 0.1 (1 + 0.2 * 0.0256) = 0.100512
      KL 3   -> e = max(-0.5, -0.2) = -0.2     -> 0.099488
      KL 6.6 -> e = 0.1                        -> 0.100256
    and target None keeps beta fixed."""
    kw = dict(target=6.0, horizon=10_000, n_steps=256)
    assert adaptive_kl_coef(0.1, 9.0, **kw) == pytest.approx(0.100512)
    assert adaptive_kl_coef(0.1, 3.0, **kw) == pytest.approx(0.099488)
    assert adaptive_kl_coef(0.1, 6.6, **kw) == pytest.approx(0.100256)
    assert adaptive_kl_coef(0.1, 100.0, target=None, horizon=1, n_steps=1) == 0.1
    with pytest.raises(ConfigError):
        adaptive_kl_coef(0.1, 1.0, target=0.0, horizon=1, n_steps=1)


def test_policy_loss_clips_and_reports_approx_kl():
    """Token 0: ratio 1.5 (log 1.5), A = 1, eps 0.2: min(1.5, 1.2) = 1.2 -> l = -1.2, clipped (no gradient).
    Token 1: ratio 1, A = -0.5 -> l = 0.5. Token 2 is padding. L = (-1.2 + 0.5) / 2 = -0.35, clip_frac 1/2.
    approx-KL: token 0 (1.5 - 1) - log 1.5 = 0.094535, token 1 0 -> mean 0.0472675."""
    old = jnp.array([[-1.0, -2.0, 0.0]])
    logp = old + jnp.array([[math.log(1.5), 0.0, 5.0]])
    adv = jnp.array([[1.0, -0.5, 7.0]])
    mask = jnp.array([[1, 1, 0]], jnp.float32)
    loss, m = ppo_policy_loss(logp, old, adv, mask, clip_range=0.2)
    assert float(loss) == pytest.approx(-0.35, abs=1e-6)
    assert float(m["clip_frac"]) == pytest.approx(0.5)
    assert float(m["approx_kl"]) == pytest.approx((0.5 - math.log(1.5)) / 2, abs=1e-6)
    assert float(approx_kl(old, old, mask)) == 0.0
    grad = jax.grad(lambda lp: ppo_policy_loss(lp, old, adv, mask, clip_range=0.2)[0])(logp)
    # d/dlogp of -rho A / 2 at token 1: -(1)(-0.5) / 2 = 0.25; clipped token 0 and padding get nothing.
    np.testing.assert_allclose(grad, [[0, 0.25, 0]], atol=1e-6)


def test_ppo_loss_adds_the_weighted_value_loss():
    """On-policy (ratio 1): pg = -mean(A) = -(1 - 0.5) / 2 = -0.25; value loss of V = 0.5, R = 1 and V = 0, R = 0
    (old V = V, no clip): (0.125 + 0) / 2 = 0.0625; c_v = 0.1 -> L = -0.25 + 0.00625 = -0.24375."""
    logp = jnp.array([[-1.0, -2.0]])
    values = jnp.array([[0.5, 0.0]])
    mask = jnp.ones((1, 2))
    loss, m = ppo_loss(logp, logp, values, values, jnp.array([[1.0, -0.5]]), jnp.array([[1.0, 0.0]]), mask,
                       clip_range=0.2, value_clip_range=0.2, vf_coef=0.1)
    assert float(loss) == pytest.approx(-0.24375, abs=1e-6)
    assert float(m["value_loss"]) == pytest.approx(0.0625)
    assert float(m["num_tokens"]) == 2.0
