"""Hand-computed checks for DPO, IPO, hinge, ORPO, SimPO and the Bradley-Terry reward-model loss.

Reference-based cases use beta = 0.1 and log-ratios (pi - ref) for chosen / rejected of
  chosen-better  (+2, -2): h = 4,  implicit rewards 0.2 / -0.2, margin 0.4
  tie            ( 0,  0): h = 0,  margin 0
  rejected-better(-2, +2): h = -4, margin -0.4
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import pytest
from numpy.testing import assert_allclose

from tempax.algorithms.preference.losses import (
    PREFERENCE_LOSS_NAMES,
    bradley_terry_loss,
    dpo_loss,
    hinge_loss,
    ipo_loss,
    orpo_loss,
    preference_loss,
    preference_loss_needs_reference,
    simpo_loss,
)
from tempax.errors import ConfigError

LN2 = math.log(2)


def softplus(x: float) -> float:
    """-log sigmoid(-x) = log(1 + e^x)."""
    return math.log1p(math.exp(x))


# (policy_chosen, policy_rejected, ref_chosen, ref_rejected), each [1].
CHOSEN_BETTER = tuple(jnp.array([v]) for v in (-10.0, -20.0, -12.0, -18.0))
TIE = tuple(jnp.array([v]) for v in (-10.0, -20.0, -10.0, -20.0))
REJECTED_BETTER = tuple(jnp.array([v]) for v in (-12.0, -18.0, -10.0, -20.0))


@pytest.mark.parametrize(
    "case, expected, accuracy",
    [
        # -log sigmoid(0.4) = log(1 + e^-0.4) = 0.513015
        (CHOSEN_BETTER, softplus(-0.4), 1.0),
        # -log sigmoid(0) = ln 2; a tie is not counted as correct
        (TIE, LN2, 0.0),
        # -log sigmoid(-0.4) = log(1 + e^0.4) = 0.913015
        (REJECTED_BETTER, softplus(0.4), 0.0),
    ],
)
def test_dpo_sigmoid(case, expected, accuracy):
    """L = -log sigmoid(beta (h_c - h_r)) with beta 0.1; see the module docstring for the three cases."""
    loss, metrics = dpo_loss(*case, beta=0.1)
    assert_allclose(loss, expected, rtol=1e-5)
    assert_allclose(metrics["accuracy"], accuracy)
    margin = float(metrics["reward_margin"])
    assert_allclose(margin, float(metrics["chosen_reward"] - metrics["rejected_reward"]), rtol=1e-6)
    assert_allclose(metrics["chosen_logps"], case[0])
    assert_allclose(metrics["rejected_logps"], case[1])


def test_dpo_metrics_and_batch_mean():
    """The three cases as one batch: loss = (0.513015 + 0.693147 + 0.913015) / 3 = 0.706393;
    chosen rewards 0.1 * [2, 0, -2] -> mean 0; rejected 0.1 * [-2, 0, 2] -> mean 0; accuracy 1/3."""
    batch = [jnp.concatenate([a, b, c]) for a, b, c in zip(CHOSEN_BETTER, TIE, REJECTED_BETTER)]
    loss, metrics = dpo_loss(*batch, beta=0.1)
    assert_allclose(loss, (softplus(-0.4) + LN2 + softplus(0.4)) / 3, rtol=1e-5)
    assert_allclose(metrics["accuracy"], 1 / 3, rtol=1e-6)
    assert_allclose(metrics["chosen_reward"], 0.0, atol=1e-6)
    loss_one, metrics_one = dpo_loss(*CHOSEN_BETTER, beta=0.1)
    assert_allclose(metrics_one["chosen_reward"], 0.2, rtol=1e-5)
    assert_allclose(metrics_one["rejected_reward"], -0.2, rtol=1e-5)
    assert_allclose(metrics_one["reward_margin"], 0.4, rtol=1e-5)


def test_dpo_label_smoothing():
    """cDPO eps = 0.1, margin 0.4: 0.9 log(1 + e^-0.4) + 0.1 log(1 + e^0.4) = 0.9 * 0.513015 + 0.1 * 0.913015
    = 0.553015 (= 0.513015 + 0.1 * 0.4, since softplus(x) - softplus(-x) = x). At a tie smoothing changes
    nothing: ln 2."""
    loss, _ = dpo_loss(*CHOSEN_BETTER, beta=0.1, label_smoothing=0.1)
    assert_allclose(loss, 0.9 * softplus(-0.4) + 0.1 * softplus(0.4), rtol=1e-5)
    loss, _ = dpo_loss(*TIE, beta=0.1, label_smoothing=0.1)
    assert_allclose(loss, LN2, rtol=1e-5)


@pytest.mark.parametrize(
    "case, expected",
    [
        (CHOSEN_BETTER, (4 - 5) ** 2),  # h = 4, target 1/(2 * 0.1) = 5: (4 - 5)^2 = 1
        (TIE, (0 - 5) ** 2),  # 25
        (REJECTED_BETTER, (-4 - 5) ** 2),  # 81
    ],
)
def test_ipo(case, expected):
    """L = (h - 1/(2 beta))^2 with beta 0.1."""
    loss, metrics = ipo_loss(*case, beta=0.1)
    assert_allclose(loss, expected, rtol=1e-5)
    assert "accuracy" in metrics


@pytest.mark.parametrize(
    "case, expected",
    [
        (CHOSEN_BETTER, 0.6),  # max(0, 1 - 0.1 * 4) = 0.6
        (TIE, 1.0),  # max(0, 1 - 0) = 1
        (REJECTED_BETTER, 1.4),  # max(0, 1 + 0.4) = 1.4
    ],
)
def test_hinge(case, expected):
    """L = max(0, 1 - beta h) with beta 0.1."""
    loss, _ = hinge_loss(*case, beta=0.1)
    assert_allclose(loss, expected, rtol=1e-5)


def test_hinge_is_zero_past_the_margin():
    """h = 20 > 1/beta = 10: max(0, 1 - 2) = 0, and no gradient."""
    args = tuple(jnp.array([v]) for v in (-10.0, -20.0, -20.0, -10.0))
    loss, _ = hinge_loss(*args, beta=0.1)
    assert_allclose(loss, 0.0)
    grad = jax.grad(lambda pc: hinge_loss(pc, *args[1:], beta=0.1)[0])(args[0])
    assert_allclose(grad, [0.0])


# ORPO: chosen-better has average log-prob ln 0.5 (odds 1, log-odds 0) over 2 tokens and rejected ln 0.2
# (odds 0.25, log-odds -ln 4) over 4 tokens.
ORPO_CHOSEN_BETTER = (jnp.array([2 * math.log(0.5)]), jnp.array([4 * math.log(0.2)]), jnp.array([2]), jnp.array([4]))
ORPO_TIE = (jnp.array([2 * math.log(0.5)]), jnp.array([3 * math.log(0.5)]), jnp.array([2]), jnp.array([3]))
ORPO_REJECTED_BETTER = (jnp.array([math.log(0.2)]), jnp.array([2 * math.log(0.5)]), jnp.array([1]), jnp.array([2]))


@pytest.mark.parametrize(
    "case, expected, accuracy",
    [
        # nll = ln 2; L_OR = -log sigmoid(0 - (-ln 4)) = -ln(4/5) = ln 1.25; L = ln 2 + 0.5 ln 1.25 = 0.804719
        (ORPO_CHOSEN_BETTER, LN2 + 0.5 * math.log(1.25), 1.0),
        # equal averages: L_OR = ln 2; L = ln 2 + 0.5 ln 2 = 1.039721
        (ORPO_TIE, 1.5 * LN2, 0.0),
        # nll = -ln 0.2 = ln 5; L_OR = -log sigmoid(-ln 4) = -ln(1/5) = ln 5; L = 1.5 ln 5 = 2.414157
        (ORPO_REJECTED_BETTER, 1.5 * math.log(5), 0.0),
    ],
)
def test_orpo(case, expected, accuracy):
    """L = nll(chosen, length-averaged) + lam * -log sigmoid(log odds_c - log odds_r), lam = 0.5."""
    loss, metrics = orpo_loss(*case, lam=0.5)
    assert_allclose(loss, expected, rtol=1e-5)
    assert_allclose(metrics["accuracy"], accuracy)


def test_orpo_metrics_and_custom_nll():
    """Chosen-better: log-odds 0 and -ln 4 = -1.386294, or_loss ln 1.25; with chosen_nll = 1.0 the loss is
    1.0 + 0.5 ln 1.25 = 1.111572."""
    _, metrics = orpo_loss(*ORPO_CHOSEN_BETTER, lam=0.5)
    assert_allclose(metrics["chosen_reward"], 0.0, atol=1e-5)
    assert_allclose(metrics["rejected_reward"], -math.log(4), rtol=1e-5)
    assert_allclose(metrics["or_loss"], math.log(1.25), rtol=1e-5)
    assert_allclose(metrics["nll"], LN2, rtol=1e-5)
    assert_allclose(metrics["log_odds_ratio"], math.log(4), rtol=1e-5)
    loss, _ = orpo_loss(*ORPO_CHOSEN_BETTER, lam=0.5, chosen_nll=jnp.array([1.0]))
    assert_allclose(loss, 1.0 + 0.5 * math.log(1.25), rtol=1e-5)


def test_orpo_finite_when_policy_is_certain():
    """Average log-prob 0 (p = 1) would give infinite odds; the cap keeps loss and gradient finite."""
    args = (jnp.array([0.0]), jnp.array([-3.0]), jnp.array([3]), jnp.array([3]))
    loss, _ = orpo_loss(*args, lam=1.0)
    grad = jax.grad(lambda pr: orpo_loss(args[0], pr, *args[2:], lam=1.0)[0])(args[1])
    assert jnp.isfinite(loss) and jnp.all(jnp.isfinite(grad))


# SimPO with beta 2, gamma 1. Average log-probs: chosen-better -1 (sum -2 over 2) vs -2 (sum -6 over 3).
SIMPO_CHOSEN_BETTER = (jnp.array([-2.0]), jnp.array([-6.0]), jnp.array([2]), jnp.array([3]))
SIMPO_TIE = (jnp.array([-2.0]), jnp.array([-3.0]), jnp.array([2]), jnp.array([3]))
SIMPO_REJECTED_BETTER = (jnp.array([-4.0]), jnp.array([-3.0]), jnp.array([2]), jnp.array([3]))


@pytest.mark.parametrize(
    "case, expected, accuracy",
    [
        # 2 (-1 - -2) - 1 = 1: log(1 + e^-1) = 0.313262
        (SIMPO_CHOSEN_BETTER, softplus(-1.0), 1.0),
        # 2 (-1 - -1) - 1 = -1: log(1 + e) = 1.313262
        (SIMPO_TIE, softplus(1.0), 0.0),
        # 2 (-2 - -1) - 1 = -3: log(1 + e^3) = 3.048587
        (SIMPO_REJECTED_BETTER, softplus(3.0), 0.0),
    ],
)
def test_simpo(case, expected, accuracy):
    """L = -log sigmoid(beta (avg_c - avg_r) - gamma), beta 2, gamma 1."""
    loss, metrics = simpo_loss(*case, beta=2.0, gamma=1.0)
    assert_allclose(loss, expected, rtol=1e-5)
    assert_allclose(metrics["accuracy"], accuracy)


def test_simpo_rewards_are_length_normalised():
    """Chosen-better: rewards 2 * -2/2 = -2 and 2 * -6/3 = -4, margin 2."""
    _, metrics = simpo_loss(*SIMPO_CHOSEN_BETTER, beta=2.0, gamma=1.0)
    assert_allclose(metrics["chosen_reward"], -2.0, rtol=1e-6)
    assert_allclose(metrics["rejected_reward"], -4.0, rtol=1e-6)
    assert_allclose(metrics["reward_margin"], 2.0, rtol=1e-6)


@pytest.mark.parametrize(
    "chosen, rejected, margin, expected, accuracy",
    [
        (2.0, 1.0, None, softplus(-1.0), 1.0),  # -log sigmoid(1) = 0.313262
        (2.0, 1.0, 1.0, LN2, 1.0),  # -log sigmoid(2 - 1 - 1) = ln 2; accuracy ignores the margin
        (1.5, 1.5, None, LN2, 0.0),  # tie: ln 2, not counted correct
        (1.0, 2.0, None, softplus(1.0), 0.0),  # -log sigmoid(-1) = 1.313262
    ],
)
def test_bradley_terry(chosen, rejected, margin, expected, accuracy):
    """L = -log sigmoid(r_c - r_r - m)."""
    loss, metrics = bradley_terry_loss(jnp.array([chosen]), jnp.array([rejected]), margin=margin)
    assert_allclose(loss, expected, rtol=1e-5)
    assert_allclose(metrics["accuracy"], accuracy)


def test_bradley_terry_per_example_margin():
    """r_c - r_r = [1, 1], margins [0, 1]: (log(1 + e^-1) + ln 2) / 2 = (0.313262 + 0.693147) / 2 = 0.503204."""
    loss, _ = bradley_terry_loss(jnp.array([2.0, 2.0]), jnp.array([1.0, 1.0]), margin=jnp.array([0.0, 1.0]))
    assert_allclose(loss, (softplus(-1.0) + LN2) / 2, rtol=1e-5)


REFERENCE_LOSSES = {
    "sigmoid": functools.partial(dpo_loss, beta=0.1),
    "ipo": functools.partial(ipo_loss, beta=0.1),
    "hinge": functools.partial(hinge_loss, beta=0.1),
}


@pytest.mark.parametrize("name", list(REFERENCE_LOSSES))
@pytest.mark.parametrize("case", [CHOSEN_BETTER, TIE, REJECTED_BETTER], ids=["chosen", "tie", "rejected"])
def test_reference_losses_gradient_direction(name, case):
    """Descending the loss raises the chosen log-prob and lowers the rejected one: d L / d pi_c < 0 < d L / d pi_r.
    (Every case is inside the hinge margin and below IPO's target gap h = 5.)"""
    fn = REFERENCE_LOSSES[name]
    grad_c, grad_r = jax.grad(lambda c, r: fn(c, r, case[2], case[3])[0], argnums=(0, 1))(case[0], case[1])
    assert float(grad_c[0]) < 0 < float(grad_r[0])


@pytest.mark.parametrize(
    "fn, case",
    [
        (functools.partial(orpo_loss, lam=0.5), ORPO_CHOSEN_BETTER),
        (functools.partial(orpo_loss, lam=0.5), ORPO_REJECTED_BETTER),
        (functools.partial(simpo_loss, beta=2.0, gamma=1.0), SIMPO_CHOSEN_BETTER),
        (functools.partial(simpo_loss, beta=2.0, gamma=1.0), SIMPO_TIE),
    ],
)
def test_reference_free_losses_gradient_direction(fn, case):
    """Same direction for ORPO and SimPO: d L / d pi_c < 0 < d L / d pi_r."""
    grad_c, grad_r = jax.grad(lambda c, r: fn(c, r, case[2], case[3])[0], argnums=(0, 1))(case[0], case[1])
    assert float(grad_c[0]) < 0 < float(grad_r[0])


def test_bradley_terry_gradient_direction():
    """d L / d r_c = -sigmoid(-(r_c - r_r)) = -sigmoid(-1) = -0.268941 and d L / d r_r = +0.268941."""
    grad_c, grad_r = jax.grad(lambda c, r: bradley_terry_loss(c, r)[0], argnums=(0, 1))(
        jnp.array([2.0]), jnp.array([1.0])
    )
    sig = 1 / (1 + math.e)
    assert_allclose(grad_c, [-sig], rtol=1e-5)
    assert_allclose(grad_r, [sig], rtol=1e-5)


def test_dpo_gradient_value():
    """d L / d pi_c = -beta sigmoid(-beta h) = -0.1 sigmoid(-0.4) = -0.1 * 0.401312 = -0.0401312."""
    grad = jax.grad(lambda c: dpo_loss(c, *CHOSEN_BETTER[1:], beta=0.1)[0])(CHOSEN_BETTER[0])
    assert_allclose(grad, [-0.1 / (1 + math.exp(0.4))], rtol=1e-5)


def test_dispatcher_matches_direct_calls():
    """preference_loss(name, ...) gives the same loss as calling the function."""
    pc, pr, rc, rr = CHOSEN_BETTER
    assert_allclose(
        preference_loss("sigmoid", pc, pr, ref_chosen_logps=rc, ref_rejected_logps=rr, beta=0.1)[0],
        dpo_loss(pc, pr, rc, rr, beta=0.1)[0],
    )
    assert_allclose(
        preference_loss("ipo", pc, pr, ref_chosen_logps=rc, ref_rejected_logps=rr, beta=0.1)[0], 1.0, rtol=1e-5
    )
    assert_allclose(
        preference_loss("hinge", pc, pr, ref_chosen_logps=rc, ref_rejected_logps=rr, beta=0.1)[0], 0.6, rtol=1e-5
    )
    c, r, lc, lr = ORPO_CHOSEN_BETTER
    assert_allclose(
        preference_loss("orpo", c, r, chosen_lengths=lc, rejected_lengths=lr, lam=0.5)[0],
        LN2 + 0.5 * math.log(1.25),
        rtol=1e-5,
    )
    assert_allclose(
        preference_loss("orpo", c, r, chosen_lengths=lc, rejected_lengths=lr, chosen_nll=jnp.array([1.0]), lam=0.5)[0],
        1.0 + 0.5 * math.log(1.25),
        rtol=1e-5,
    )
    c, r, lc, lr = SIMPO_CHOSEN_BETTER
    # Unused reference arrays are ignored.
    assert_allclose(
        preference_loss(
            "simpo", c, r, ref_chosen_logps=rc, chosen_lengths=lc, rejected_lengths=lr, beta=2.0, gamma=1.0
        )[0],
        softplus(-1.0),
        rtol=1e-5,
    )


def test_dispatcher_errors():
    pc, pr, _, _ = CHOSEN_BETTER
    with pytest.raises(ConfigError, match="unknown preference loss 'kto'.*sigmoid"):
        preference_loss("kto", pc, pr, beta=0.1)
    with pytest.raises(ValueError, match="ref_chosen_logps, ref_rejected_logps"):
        preference_loss("sigmoid", pc, pr, beta=0.1)
    with pytest.raises(ValueError, match="chosen_lengths"):
        preference_loss("simpo", pc, pr, beta=2.0, gamma=1.0)
    assert PREFERENCE_LOSS_NAMES == ("sigmoid", "ipo", "hinge", "orpo", "simpo")
    assert [preference_loss_needs_reference(n) for n in PREFERENCE_LOSS_NAMES] == [True, True, True, False, False]


def test_losses_jit_and_accept_bfloat16():
    """Under jit with bf16 inputs the loss is float32 and equals the float32 value (inputs are exact in bf16)."""
    args = [a.astype(jnp.bfloat16) for a in CHOSEN_BETTER]
    loss, metrics = jax.jit(functools.partial(dpo_loss, beta=0.1))(*args)
    assert loss.dtype == jnp.float32 and metrics["accuracy"].dtype == jnp.float32
    assert_allclose(loss, softplus(-0.4), rtol=1e-5)
