"""tempax.eval.spec: the held-out evaluation's settings, checked when read, and the options they give."""

from __future__ import annotations

import pytest

from tempax.configlib import from_dict
from tempax.errors import ConfigError
from tempax.eval.spec import EvalConfig, eval_options


def test_bad_settings_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match="eval.num_problems and eval.group_size must be >= 0"):
        from_dict(EvalConfig, {"num_problems": -1})
    with pytest.raises(ConfigError, match=r"eval.ks=\(1, 5\) must lie in 1..group_size=4"):
        from_dict(EvalConfig, {"group_size": 4, "ks": [1, 5]})
    with pytest.raises(ConfigError, match="eval.batch_size must be >= 1"):
        from_dict(EvalConfig, {"batch_size": 0})
    assert from_dict(EvalConfig, {"group_size": 0, "ks": [9]}).ks == (9,)  # no samples: ks is not read


def test_the_old_key_num_samples_is_group_size():
    assert from_dict(EvalConfig, {"num_samples": 8, "ks": [1, 8]}).group_size == 8


def test_options_take_the_runs_budget_when_none_is_set_and_ks_only_with_samples():
    """max_new_tokens null -> the run's 48; ks (1, 4) kept with group_size 4, replaced by (1,) without samples."""
    sampled = eval_options(EvalConfig(group_size=4, ks=(1, 4), temperature=0.7, batch_size=8), 48, seed=3)
    assert (sampled.max_new_tokens, sampled.group_size, sampled.ks, sampled.temperature) == (48, 4, (1, 4), 0.7)
    assert (sampled.batch_size, sampled.seed, sampled.greedy) == (8, 3, True)
    greedy_only = eval_options(EvalConfig(max_new_tokens=16, ks=(1, 4)), 48)
    assert greedy_only.max_new_tokens == 16 and greedy_only.ks == (1,) and greedy_only.group_size == 0
