"""Hand-computed checks for the advantage estimators (GRPO, Dr. GRPO, RLOO, REINFORCE++) and for combining
several rewards (weighted sum vs normalising each reward first, GDPO), including all-equal groups and groups of
one sample."""

from __future__ import annotations

import math

import jax.numpy as jnp
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from tempax.rl.advantages import (
    batch_normalize,
    combine_and_estimate,
    estimate_advantages,
    group_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from tempax.errors import ConfigError

# Groups of 2: [1, 0], [0.5, 0.5] (all equal), [3, 1].
PAIRS = jnp.array([1.0, 0.0, 0.5, 0.5, 3.0, 1.0])


# ------------------------------------------------------------------------------------------- GRPO / Dr. GRPO


def test_group_advantages_grpo():
    """Groups of 2: [1, 0] mean 0.5 std 0.5 -> +-0.5 / (0.5 + 1e-4) = +-0.9998;
    [0.5, 0.5] all equal -> 0, 0; [3, 1] mean 2 std 1 -> +-1 / 1.0001 = +-0.9999."""
    adv, zero = group_advantages(jnp.array([1.0, 0.0, 0.5, 0.5, 3.0, 1.0]), 2)
    assert_allclose(adv, [0.5 / 0.5001, -0.5 / 0.5001, 0.0, 0.0, 1 / 1.0001, -1 / 1.0001], rtol=1e-6)
    assert_array_equal(zero, [False, False, True, True, False, False])


def test_group_advantages_dr_grpo_no_std():
    """Without std scaling: [1, 0] -> +-0.5; [0.5, 0.5] -> 0; [3, 1] -> +-1."""
    adv, _ = group_advantages(jnp.array([1.0, 0.0, 0.5, 0.5, 3.0, 1.0]), 2, scale_by_std=False)
    assert_allclose(adv, [0.5, -0.5, 0.0, 0.0, 1.0, -1.0], rtol=1e-6)


def test_group_advantages_population_std_and_all_equal_group_without_eps():
    """Group of 3 [0, 0, 1]: mean 1/3, population std sqrt((1/9 + 1/9 + 4/9) / 3) = sqrt(2)/3, so with eps = 0
    A = [-1/3, -1/3, 2/3] / (sqrt(2)/3) = [-1/sqrt(2), -1/sqrt(2), sqrt(2)].
    Group [0.1, 0.1, 0.1] has std 0 and eps = 0 (0/0): advantages must be exactly 0, not NaN."""
    adv, zero = group_advantages(jnp.array([0.0, 0.0, 1.0, 0.1, 0.1, 0.1]), 3, eps=0.0)
    s = 1 / math.sqrt(2)
    assert_allclose(adv[:3], [-s, -s, math.sqrt(2)], rtol=1e-5)
    assert_array_equal(adv[3:], [0.0, 0.0, 0.0])
    assert_array_equal(zero, [False, False, False, True, True, True])


def test_group_advantages_rejects_ragged_batch():
    with pytest.raises(ValueError, match="group_size=4"):
        group_advantages(jnp.zeros(6), 4)


# ------------------------------------------------------------------------------------------- RLOO


def test_rloo_leave_one_out_baseline():
    """Groups of 3. [1, 0, 0]: A_0 = 1 - (0 + 0)/2 = 1, A_1 = 0 - (1 + 0)/2 = -0.5, A_2 = -0.5.
    [0.5, 0.5, 0.5]: all equal -> exactly 0. [2, 1, 0]: 2 - 0.5 = 1.5, 1 - 1 = 0, 0 - 1.5 = -1.5.
    Each equals G/(G-1) (r - mean) = 1.5 x Dr. GRPO's advantage."""
    rewards = jnp.array([1.0, 0.0, 0.0, 0.5, 0.5, 0.5, 2.0, 1.0, 0.0])
    adv, zero = rloo_advantages(rewards, 3)
    assert_allclose(adv, [1.0, -0.5, -0.5, 0.0, 0.0, 0.0, 1.5, 0.0, -1.5], rtol=1e-6, atol=1e-7)
    assert_array_equal(zero, [False] * 3 + [True] * 3 + [False] * 3)
    dr, _ = group_advantages(rewards, 3, scale_by_std=False)
    assert_allclose(adv, 1.5 * dr, rtol=1e-6, atol=1e-7)


def test_rloo_groups_of_two_and_of_one():
    """G = 2: [1, 0] -> the other sample is the baseline: +1, -1. G = 1: no other sample, advantage 0 and the
    group counts as zero spread (rather than a division by G - 1 = 0)."""
    adv, _ = rloo_advantages(jnp.array([1.0, 0.0]), 2)
    assert_allclose(adv, [1.0, -1.0])
    adv, zero = rloo_advantages(jnp.array([1.0, 0.0, 3.0]), 1)
    assert_array_equal(adv, [0.0, 0.0, 0.0])
    assert_array_equal(zero, [True, True, True])


# ------------------------------------------------------------------------------------------- REINFORCE++


def test_reinforce_pp_centres_per_group_and_scales_by_one_batch_std():
    """Groups [1, 0], [0.5, 0.5], [3, 1] centred: [0.5, -0.5, 0, 0, 1, -1]; batch mean 0, batch std
    sqrt((0.25 + 0.25 + 0 + 0 + 1 + 1) / 6) = sqrt(5/12) = 0.6454972; with eps = 0:
    A = [0.7745967, -0.7745967, 0, 0, 1.5491933, -1.5491933]. GRPO would give both spread groups +-1: here the
    group with twice the reward gap keeps twice the advantage."""
    adv, zero = reinforce_pp_advantages(PAIRS, 2, eps=0.0)
    s = math.sqrt(5 / 12)
    assert_allclose(adv, [0.5 / s, -0.5 / s, 0.0, 0.0, 1 / s, -1 / s], rtol=1e-6)
    assert_array_equal(zero, [False, False, True, True, False, False])


def test_reinforce_pp_without_groups_normalises_over_the_batch_even_for_single_samples():
    """group_baseline=False, G = 1: rewards [2, 0, 1, 1], batch mean 1, std sqrt((1 + 1 + 0 + 0)/4) = sqrt(0.5):
    A = [sqrt(2), -sqrt(2), 0, 0]. With the group baseline, groups of one centre to 0 everywhere."""
    rewards = jnp.array([2.0, 0.0, 1.0, 1.0])
    adv, _ = reinforce_pp_advantages(rewards, 1, group_baseline=False, eps=0.0)
    assert_allclose(adv, [math.sqrt(2), -math.sqrt(2), 0.0, 0.0], rtol=1e-6, atol=1e-7)
    adv, zero = reinforce_pp_advantages(rewards, 1)
    assert_array_equal(adv, [0.0, 0.0, 0.0, 0.0])
    assert zero.all()


def test_all_equal_rewards_give_exact_zeros_for_every_estimator():
    """A batch of equal rewards has std 0 everywhere: every estimator returns exactly 0 (no 0/0 NaN, eps = 0)."""
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp"):
        adv, zero = estimate_advantages(jnp.full((6,), 0.7), 3, estimator=name, eps=0.0)
        assert_array_equal(adv, jnp.zeros(6)), name
        assert zero.all(), name
    assert_array_equal(batch_normalize(jnp.full((4,), 2.0), eps=0.0), jnp.zeros(4))


def test_estimate_advantages_dispatches_by_name():
    """grpo = group_advantages, dr_grpo = no std, rloo, reinforce_pp = the functions above; a typo is named."""
    assert_allclose(estimate_advantages(PAIRS, 2)[0], group_advantages(PAIRS, 2)[0])
    assert_allclose(estimate_advantages(PAIRS, 2, estimator="dr_grpo")[0], [0.5, -0.5, 0, 0, 1, -1])
    assert_allclose(estimate_advantages(PAIRS, 2, estimator="rloo")[0], [1, -1, 0, 0, 2, -2])
    assert_allclose(estimate_advantages(PAIRS, 2, estimator="reinforce_pp")[0], reinforce_pp_advantages(PAIRS, 2)[0])
    with pytest.raises(ConfigError, match="rloo"):
        estimate_advantages(PAIRS, 2, estimator="rlo")


# ------------------------------------------------------------------------------------------- several rewards


# Two groups of 3, two reward functions with weight 1:
#   group A: format [1, 1, 0], correctness [1, 0, 0]  -> totals [2, 1, 0]
#   group B: format [1, 0, 0], correctness [0, 0, 0]  -> totals [1, 0, 0]
FORMAT = jnp.array([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
CORRECT = jnp.array([1.0, 0.0, 0.0, 0.0, 0.0, 0.0])


def test_sum_then_grpo_rescales_each_group_to_unit_std():
    """sum: totals [2, 1, 0] -> mean 1, std sqrt(2/3) -> [1.2247449, 0, -1.2247449]; totals [1, 0, 0] -> mean 1/3,
    std sqrt(2)/3 -> [1.4142136, -0.7071068, -0.7071068]. The group where only the format differs gets the larger
    top advantage (1.414 > 1.225)."""
    adv, zero = combine_and_estimate([FORMAT, CORRECT], [1.0, 1.0], 3, combination="sum", eps=0.0)
    a, b = math.sqrt(1.5), math.sqrt(2)
    assert_allclose(adv, [a, 0.0, -a, b, -b / 2, -b / 2], rtol=1e-5, atol=1e-6)
    assert not zero.any()


def test_normalize_each_gives_each_reward_its_own_group_scale_then_one_batch_scale():
    """normalize_each + grpo (GDPO), eps = 0:
      format A [1, 1, 0]: mean 2/3, std sqrt(2)/3 -> [0.7071068, 0.7071068, -1.4142136]
      correct A [1, 0, 0]:                        -> [1.4142136, -0.7071068, -0.7071068]
      format B [1, 0, 0]:                         -> [1.4142136, -0.7071068, -0.7071068]
      correct B [0, 0, 0]: all equal              -> [0, 0, 0]
      sums: [2.1213203, 0, -2.1213203, 1.4142136, -0.7071068, -0.7071068]; batch mean 0,
      std sqrt((4.5 + 0 + 4.5 + 2 + 0.5 + 0.5) / 6) = sqrt(2) -> [1.5, 0, -1.5, 1, -0.5, -0.5].
    Now the group where both rewards separate the samples gets the larger advantage (1.5 > 1)."""
    adv, zero = combine_and_estimate([FORMAT, CORRECT], [1.0, 1.0], 3, combination="normalize_each", eps=0.0)
    assert_allclose(adv, [1.5, 0.0, -1.5, 1.0, -0.5, -0.5], rtol=1e-5, atol=1e-6)
    assert not zero.any()


def test_normalize_each_weights_and_zero_spread():
    """Weights scale each normalised reward before the batch normalisation: correctness weight 0 leaves only the
    format's group advantages, [0.7071068, 0.7071068, -1.4142136, 1.4142136, -0.7071068, -0.7071068] (batch
    mean 0, std 1 already). A group where every reward is constant is zero spread and gets exactly 0."""
    adv, _ = combine_and_estimate([FORMAT, CORRECT], [1.0, 0.0], 3, combination="normalize_each", eps=0.0)
    h = 1 / math.sqrt(2)
    assert_allclose(adv, [h, h, -2 * h, 2 * h, -h, -h], rtol=1e-5)
    flat = jnp.array([1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    adv, zero = combine_and_estimate([flat, jnp.zeros(6)], [1.0, 1.0], 3, combination="normalize_each", eps=0.0)
    assert_array_equal(zero, [True, True, True, False, False, False])
    assert_array_equal(adv[:3], [0.0, 0.0, 0.0])


def test_combination_errors_name_the_choice():
    with pytest.raises(ConfigError, match="normalize_each"):
        combine_and_estimate([FORMAT], [1.0], 3, combination="gdpo")
    with pytest.raises(ConfigError, match="weights"):
        combine_and_estimate([FORMAT, CORRECT], [1.0], 3)


# ------------------------------------------------------------------------------------------- config


def test_settings_choose_the_estimator_and_combination():
    """grpo.advantage / grpo.reward_combination come from YAML or overrides; scale_rewards=false keeps meaning
    Dr. GRPO, and combining it with another estimator is refused with the key named."""
    from tempax.algorithms.grpo.config import GRPOConfig
    from tempax.configlib import from_dict

    cfg = from_dict(GRPOConfig, {"grpo": {"advantage": "rloo", "reward_combination": "normalize_each"}})
    assert (cfg.grpo.estimator, cfg.grpo.reward_combination) == ("rloo", "normalize_each")
    assert from_dict(GRPOConfig, {"grpo": {"scale_rewards": False}}).grpo.estimator == "dr_grpo"
    assert from_dict(GRPOConfig, {}).grpo.estimator == "grpo"
    with pytest.raises(ConfigError, match="scale_rewards"):
        from_dict(GRPOConfig, {"grpo": {"advantage": "reinforce_pp", "scale_rewards": False}})
    with pytest.raises(ConfigError, match="grpo.advantage"):
        from_dict(GRPOConfig, {"grpo": {"advantage": "ppo"}})
