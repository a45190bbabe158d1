"""tempax.configlib.renames: old recipe keys read under their new names, with one warning line each."""

from __future__ import annotations

import logging

import pytest

from tempax.configlib.build import from_dict, to_dict
from tempax.configlib.renames import upgrade_keys
from tempax.errors import ConfigError
from tests.configlib.configs import NEW_RECIPE, OLD_RECIPE, HeldOutConfig, PromptDataConfig, RenamedConfig


def test_a_renamed_key_is_read_under_its_new_name_with_one_warning_line_each(caplog):
    """Every old key of OLD_RECIPE builds the config NEW_RECIPE builds; each says its new name once, on one line;
    the dump (config.yaml, `--print-config`) uses the new names only."""
    with caplog.at_level(logging.WARNING, logger="tempax.configlib"):
        cfg = from_dict(RenamedConfig, OLD_RECIPE)
    assert cfg == from_dict(RenamedConfig, NEW_RECIPE)
    assert cfg.data == PromptDataConfig(path="p.jsonl") and cfg.knobs.group_size == 4
    assert cfg.eval == HeldOutConfig(before=False, num_prompts=2)
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split("'")[1:4:2] for line in lines] == [
        ["prompts.num_eval", "eval.num_prompts"], ["prompts", "data"], ["eval_before", "eval.before"],
        ["knobs.samples", "knobs.group_size"]]
    assert all("\n" not in line and "is renamed" in line for line in lines)
    assert set(to_dict(cfg)) == {"data", "knobs", "eval"} and "samples" not in to_dict(cfg)["knobs"]


def test_upgrade_keys_moves_without_warning_and_leaves_its_input_alone(caplog):
    """What code comparing a stored config uses: the same moves, quietly, on a copy. A section left empty by a
    move goes (an empty mapping would replace the recipe's section when overrides merge)."""
    with caplog.at_level(logging.WARNING, logger="tempax.configlib"):
        upgraded, moved = upgrade_keys(RenamedConfig, OLD_RECIPE)
        only_moved, _ = upgrade_keys(RenamedConfig, {"prompts": {"num_eval": 3}})
    assert caplog.records == []
    assert upgraded == NEW_RECIPE and OLD_RECIPE["prompts"] == {"path": "p.jsonl", "num_eval": 2}
    assert moved[-1] == ("knobs.samples", "knobs.group_size")
    assert only_moved == {"eval": {"num_prompts": 3}}
    assert upgrade_keys(RenamedConfig, NEW_RECIPE) == (NEW_RECIPE, [])


def test_a_key_given_under_both_names_is_an_error_naming_both():
    with pytest.raises(ConfigError, match=r"config keys 'knobs.samples' and 'knobs.group_size' are both given, "
                                          r"and 'knobs.samples' is the old name of 'knobs.group_size'; keep only "
                                          r"'knobs.group_size'"):
        from_dict(RenamedConfig, {"knobs": {"samples": 2, "group_size": 4}})
    with pytest.raises(ConfigError, match="'eval_before' and 'eval.before' are both given"):
        from_dict(RenamedConfig, {"eval_before": True, "eval": {"before": False}})
