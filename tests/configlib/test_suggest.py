"""tempax.configlib.suggest: "did you mean" for an unknown key and for a missing recipe file."""

from __future__ import annotations

import pytest

from tempax.configlib.build import from_dict
from tempax.configlib.suggest import nearest_choice, nearest_recipes
from tempax.errors import ConfigError
from tests.configlib.configs import TrainConfig


def test_unknown_key_suggests_nearest():
    expected = r"unknown key 'optimizer.learnig_rate'; did you mean 'optimizer.learning_rate'\?"
    with pytest.raises(ConfigError, match=expected):
        from_dict(TrainConfig, {"model": "m", "optimizer": {"learnig_rate": 1e-4}})


def test_unknown_key_at_wrong_level_suggests_full_path():
    with pytest.raises(ConfigError, match=r"unknown key 'learning_rate'; did you mean 'optimizer.learning_rate'\?"):
        from_dict(TrainConfig, {"model": "m", "learning_rate": 1e-4})


def test_unknown_key_without_neighbour_lists_valid_keys():
    with pytest.raises(ConfigError, match=r"unknown key 'lora.zzz'; valid keys under 'lora': rank, targets"):
        from_dict(TrainConfig, {"model": "m", "lora": {"zzz": 1}})


def test_nearest_choice_names_the_closest_value_or_nothing():
    assert nearest_choice("adam", ("adamw", "sgd")) == "; did you mean 'adamw'?"
    assert nearest_choice("zzz", ("adamw", "sgd")) == ""


def test_nearest_recipes_looks_in_the_folder_or_the_folder_named_nearest(tmp_path):
    """A typo in the file name finds the file beside it; a typo in the folder (`recipe/` for `recipes/`) finds
    the folder first; nothing near gives "" so the message stands alone."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "sft_tiny.yaml").write_text("model: m\n")
    (tmp_path / "recipes" / "notes.txt").write_text("")
    near = tmp_path / "recipes" / "sft_tiny.yaml"
    assert nearest_recipes(tmp_path / "recipes" / "sft_tiyn.yaml") == f"did you mean {near}? "
    assert nearest_recipes(tmp_path / "recipe" / "sft_tiny.yml") == f"did you mean {near}? "
    assert nearest_recipes(tmp_path / "recipes" / "completely_else.yaml") == ""
    assert nearest_recipes(tmp_path / "nowhere" / "deeper" / "x.yaml") == ""
