"""Hand-computed checks for the KTO loss (Ethayarajh et al. 2024): the KL reference point from mismatched pairs,
its clamp at 0 and its missing gradient, the desirable / undesirable weights, padding rows, gradient direction.

The base case, beta = 1, two real rows:
  row 0 desirable:   policy -1.0, reference -1.5  ->  r = +0.5
  row 1 undesirable: policy -2.0, reference -1.5  ->  r = -0.5
  mismatched pairs:  policy (-3.0, -4.0), reference (-3.2, -4.2)  ->  log-ratios 0.2, 0.2  ->  z_0 = 0.2
  L_0 = 1 - sigmoid(0.5 - 0.2) = 1 - sigmoid(0.3) = 0.4255575
  L_1 = 1 - sigmoid(0.2 + 0.5) = 1 - sigmoid(0.7) = 0.3318122
  L   = (0.4255575 + 0.3318122) / 2 = 0.3786849
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from numpy.testing import assert_allclose

from tempax.algorithms.preference.losses import kto_loss

POLICY = jnp.array([-1.0, -2.0])
REF = jnp.array([-1.5, -1.5])
POLICY_KL = jnp.array([-3.0, -4.0])
REF_KL = jnp.array([-3.2, -4.2])
DESIRABLE = jnp.array([1.0, 0.0])


def test_kto_base_case_loss_rewards_and_kl_point():
    """See the module docstring: L = 0.3786849, z_0 = 0.2; rewards beta r = +0.5 / -0.5, margin 1.0; both rows
    are on their labelled side of z_0 (0.5 > 0.2, -0.5 < 0.2), so accuracy 1."""
    loss, m = kto_loss(POLICY, REF, POLICY_KL, REF_KL, DESIRABLE, beta=1.0)
    assert_allclose(loss, 0.3786849, rtol=1e-6)
    assert_allclose(m["kl"], 0.2, rtol=1e-5)
    assert_allclose([m["desirable_reward"], m["undesirable_reward"], m["reward_margin"]], [0.5, -0.5, 1.0], rtol=1e-6)
    assert_allclose([m["accuracy"], m["num_desirable"], m["num_undesirable"]], [1.0, 1.0, 1.0])
    assert_allclose([m["desirable_logps"], m["undesirable_logps"]], [-1.0, -2.0])


def test_kto_beta_scales_the_log_ratio_gap():
    """beta = 0.1: L_0 = 1 - sigmoid(0.1 * 0.3) = 1 - sigmoid(0.03) = 0.4925006; rewards 0.1 r = +0.05."""
    # One desirable row with its own mismatched pair (log-ratio 0.2), so z_0 is still 0.2.
    loss, m = kto_loss(POLICY[:1], REF[:1], POLICY_KL[:1], REF_KL[:1], DESIRABLE[:1], beta=0.1)
    assert_allclose(loss, 0.4925006, rtol=1e-6)
    assert_allclose(m["desirable_reward"], 0.05, rtol=1e-5)
    # No undesirable row: its metrics are 0, not NaN.
    assert float(m["undesirable_reward"]) == 0.0 and float(m["num_undesirable"]) == 0.0


def test_kto_weights_scale_each_kind():
    """lambda_D = 2, lambda_U = 0.5: L = (2 * 0.4255575 + 0.5 * 0.3318122) / 2 = 0.5085105."""
    loss, _ = kto_loss(POLICY, REF, POLICY_KL, REF_KL, DESIRABLE, beta=1.0, desirable_weight=2.0,
                       undesirable_weight=0.5)
    assert_allclose(loss, 0.5085105, rtol=1e-6)


def test_kto_kl_point_is_clamped_at_zero():
    """Mismatched log-ratios -0.3 and -0.1 average -0.2 < 0, so z_0 = 0 and both rows sit at |r| = 0.5 from it:
    L_0 = L_1 = 1 - sigmoid(0.5) = 0.3775407."""
    loss, m = kto_loss(POLICY, REF, jnp.array([-3.5, -4.3]), jnp.array([-3.2, -4.2]), DESIRABLE, beta=1.0)
    assert float(m["kl"]) == 0.0
    assert_allclose(loss, 0.3775407, rtol=1e-6)


def test_kto_padding_rows_count_nowhere():
    """A third, padding row (mask 0) with a mismatched log-ratio of 10 and a huge loss changes nothing: z_0 stays
    0.2 (mean over the two real rows) and L stays 0.3786849."""
    pad = lambda x, v: jnp.concatenate([x, jnp.array([v])])  # noqa: E731
    loss, m = kto_loss(pad(POLICY, -50.0), pad(REF, 0.0), pad(POLICY_KL, 0.0), pad(REF_KL, -10.0),
                       pad(DESIRABLE, 1.0), beta=1.0, mask=jnp.array([1.0, 1.0, 0.0]))
    assert_allclose(loss, 0.3786849, rtol=1e-6)
    assert_allclose(m["kl"], 0.2, rtol=1e-5)
    assert_allclose([m["num_desirable"], m["desirable_logps"]], [1.0, -1.0])


def test_kto_gradient_raises_desirable_lowers_undesirable_and_skips_the_kl_point():
    """dL/dp_0 = -beta sigmoid(0.3) (1 - sigmoid(0.3)) / 2 = -0.1222292 (raising a desirable log-prob lowers the
    loss); dL/dp_1 = +sigmoid(0.7) (1 - sigmoid(0.7)) / 2 = +0.1108564 (an undesirable one raises it). z_0 is
    detached: the gradient with respect to the mismatched log-probs is exactly 0."""
    grads = jax.grad(lambda p, pk: kto_loss(p, REF, pk, REF_KL, DESIRABLE, beta=1.0)[0], argnums=(0, 1))(
        POLICY, POLICY_KL
    )
    assert_allclose(grads[0], [-0.1222292, 0.1108564], rtol=1e-5)
    assert_allclose(grads[1], [0.0, 0.0], atol=0)
