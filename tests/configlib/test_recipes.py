"""tempax.configlib.recipes: YAML recipes with overrides on top, their `command:` key, and configs written back
out as recipes."""

from __future__ import annotations

import logging

import pytest

from tempax.configlib.build import from_dict, to_dict
from tempax.configlib.help_text import describe
from tempax.configlib.overrides import parse_overrides
from tempax.configlib.recipes import dump_yaml, load_config, recipe_command, with_overrides
from tempax.errors import ConfigError
from tests.configlib.configs import (
    LoraConfig,
    OptimizerConfig,
    PresetConfig,
    PromptDataConfig,
    RenamedConfig,
    TrainConfig,
)


def test_load_config_yaml_plus_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("# a recipe\nmodel: tiny\noptimizer:\n  learning_rate: 5e-5\n  total_steps: 40\nlora: null\n")
    cfg = load_config(TrainConfig, recipe, ["optimizer.warmup_steps=4", "lora.rank=16", "seed=3"])
    assert cfg.optimizer == OptimizerConfig(learning_rate=5e-5, warmup_steps=4, total_steps=40)
    assert cfg.lora == LoraConfig(rank=16)
    assert cfg.seed == 3
    assert load_config(TrainConfig, None, ["model=x"]).model == "x"


def test_load_config_override_typo_is_reported_with_path(tmp_path):
    expected = r"unknown key 'optimizer.learnig_rate'; did you mean 'optimizer.learning_rate'"
    with pytest.raises(ConfigError, match=expected):
        load_config(TrainConfig, None, ["model=x", "optimizer.learnig_rate=1e-4"])


def test_load_config_missing_file_names_path(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=f"config file '{missing}' does not exist"):
        load_config(TrainConfig, missing, [])


def test_load_config_bad_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(TrainConfig, bad, [])
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just text\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(TrainConfig, scalar, [])


def test_round_trip_through_yaml(tmp_path):
    cfg = from_dict(
        TrainConfig,
        {"model": "m", "lora": {"rank": 4}, "loss_weights": {"a": 0.25}, "precision": "bfloat16",
         "optimizer": {"learning_rate": 1e-10}},
    )
    assert to_dict(cfg)["lora"] == {"rank": 4, "targets": ["q_proj", "v_proj"]}
    path = tmp_path / "dump.yaml"
    path.write_text(dump_yaml(cfg))
    assert load_config(TrainConfig, path, []) == cfg


def test_a_recipes_command_key_is_checked_and_left_out_of_the_config(tmp_path):
    """`command: sft` names the recipe's command: `recipe_command` reads it, `load_config` accepts it for that
    command (or when none is asked for) without passing it to the config, refuses it for another command whose
    config it does not fit (naming the recipe's own command), accepts it for one whose config it fits (an SFT
    recipe for continued pre-training), and `dump_yaml(cfg, command=...)` writes it first so the printed recipe
    loads back to the same config."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("# a recipe\ncommand: sft\nmodel: m\nlora: {rank: 4}\n")
    assert recipe_command(recipe) == "sft"
    assert load_config(TrainConfig, recipe, [], command="sft") == load_config(TrainConfig, recipe, []) == \
        TrainConfig(model="m", lora=LoraConfig(rank=4))
    with pytest.raises(ConfigError, match=r"is a recipe for `tempax sft` \(its command: key\), not `tempax dpo`"):
        load_config(PresetConfig, recipe, [], command="dpo")  # `lora` is no key of PresetConfig
    assert load_config(TrainConfig, recipe, [], command="pretrain") == TrainConfig(model="m", lora=LoraConfig(rank=4))
    printed = tmp_path / "printed.yaml"
    printed.write_text(dump_yaml(load_config(TrainConfig, recipe, []), command="sft"))
    assert printed.read_text().startswith("command: sft\n")
    assert load_config(TrainConfig, printed, [], command="sft") == TrainConfig(model="m", lora=LoraConfig(rank=4))
    plain = tmp_path / "plain.yaml"
    plain.write_text("model: m\n")
    assert recipe_command(plain) is None and recipe_command(tmp_path / "missing.yaml") is None


def test_old_keys_in_a_recipe_and_in_overrides(tmp_path, caplog):
    """The recipe and the overrides are each read under the new names before the overrides apply: an old
    recipe takes a new-name override (which wins), an old-name override is typed by its new key's field (a text
    field keeps `2024` as text), and the warning names where the old key was."""
    recipe = tmp_path / "old.yaml"
    recipe.write_text("prompts: {path: p.jsonl, num_eval: 2}\nknobs: {samples: 4}\n")
    with caplog.at_level(logging.WARNING, logger="tempax.configlib"):
        cfg = load_config(RenamedConfig, recipe, ["knobs.group_size=8", "prompts.eval_path=2024"])
    assert cfg.knobs.group_size == 8 and cfg.data == PromptDataConfig(path="p.jsonl", eval_path="2024")
    assert cfg.eval.num_prompts == 2
    lines = [r.getMessage() for r in caplog.records]
    assert f"{recipe}: config key 'knobs.samples' is renamed 'knobs.group_size'" in "\n".join(lines)
    assert "override: config key 'prompts' is renamed 'data'" in "\n".join(lines)
    assert parse_overrides(["prompts.eval_path=2024"], RenamedConfig) == {"prompts": {"eval_path": "2024"}}
    assert load_config(RenamedConfig, None, ["knobs.samples=3"]).knobs.group_size == 3
    assert "RENAMED_KEYS" not in describe(RenamedConfig)


def test_with_overrides_changes_a_copy_and_names_the_origin_of_a_bad_key():
    from tempax.algorithms.grpo.config import GRPOConfig

    base = GRPOConfig()
    changed = with_overrides(base, ["grpo.beta=0.04", "train.optimizer.learning_rate=5e-5"],
                             where="after_sft_overrides")
    assert changed.grpo.beta == 0.04 and changed.train.optimizer.learning_rate == 5e-5
    assert base.grpo.beta != 0.04 or base.train.optimizer.learning_rate != 5e-5
    assert changed.lora == base.lora and changed.task == base.task
    with pytest.raises(ConfigError, match="^after_sft_overrides: .*grpo.betta"):
        with_overrides(base, ["grpo.betta=1"], where="after_sft_overrides")
