"""Tests for tempax.configlib: building typed configs from YAML and overrides, and the errors users see."""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Optional

import pytest

from tempax.configlib import (
    describe,
    dump_yaml,
    from_dict,
    load_config,
    parse_overrides,
    recipe_command,
    to_dict,
    upgrade_keys,
)
from tempax.errors import ConfigError, TempaxError


class Precision(enum.Enum):
    FP32 = "float32"
    BF16 = "bfloat16"


@dataclass(frozen=True)
class OptimizerConfig:
    learning_rate: float = field(default=3e-4, metadata={"help": "Peak learning rate."})
    warmup_steps: int = field(default=10, metadata={"help": "Linear warm-up length in steps."})
    total_steps: int = field(default=100, metadata={"help": "Length of the schedule."})
    name: Literal["adamw", "sgd"] = field(default="adamw", metadata={"help": "Update rule."})

    def validate(self) -> None:
        if self.warmup_steps > self.total_steps:
            raise ConfigError(f"warmup_steps ({self.warmup_steps}) must be <= total_steps ({self.total_steps})")


@dataclass(frozen=True)
class LoraConfig:
    rank: int = field(default=8, metadata={"help": "Adapter rank."})
    targets: tuple[str, ...] = field(default=("q_proj", "v_proj"), metadata={"help": "Modules to adapt."})


@dataclass(frozen=True)
class TrainConfig:
    model: str = field(metadata={"help": "Model id or path."})
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig, metadata={"help": "Optimizer."})
    lora: Optional[LoraConfig] = field(default=None, metadata={"help": "LoRA adapters; null trains all weights."})
    seed: int = field(default=0, metadata={"help": "Random seed."})
    packing: bool = field(default=False, metadata={"help": "Pack short rows together."})
    max_grad_norm: float | None = field(default=1.0, metadata={"help": "Clip threshold; null disables."})
    loss_weights: dict[str, float] = field(default_factory=dict, metadata={"help": "Per-source loss weights."})
    precision: Precision = field(default=Precision.FP32, metadata={"help": "Compute dtype."})
    run_name: str = field(default="run", metadata={"help": "Name of the output folder."})
    resume_from: Optional[str] = field(default=None, metadata={"help": "Checkpoint folder to resume from."})
    shape: tuple[int, int] = field(default=(1, 2), metadata={"help": "A fixed-length pair."})


@dataclass(frozen=True)
class PresetConfig:
    # The nested default differs from OptimizerConfig's own defaults.
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(learning_rate=1e-5, total_steps=7))


def test_from_dict_builds_nested_and_coerces():
    """int -> float for floats, lists -> tuples, dict values -> float, enum by value, nested dataclasses."""
    cfg = from_dict(
        TrainConfig,
        {
            "model": "tiny",
            "optimizer": {"learning_rate": 1, "warmup_steps": 2.0},
            "lora": {"targets": ["q_proj", "k_proj"]},
            "loss_weights": {"math": 1, "code": 0.5},
            "precision": "bfloat16",
            "max_grad_norm": None,
        },
    )
    assert cfg.optimizer == OptimizerConfig(learning_rate=1.0, warmup_steps=2, total_steps=100, name="adamw")
    assert isinstance(cfg.optimizer.learning_rate, float) and isinstance(cfg.optimizer.warmup_steps, int)
    assert cfg.lora == LoraConfig(rank=8, targets=("q_proj", "k_proj"))
    assert cfg.loss_weights == {"math": 1.0, "code": 0.5}
    assert cfg.precision is Precision.BF16
    assert cfg.max_grad_norm is None
    assert from_dict(TrainConfig, {"model": "m", "precision": "BF16"}).precision is Precision.BF16


def test_partial_nested_mapping_keeps_the_fields_default():
    """A partial `optimizer:` mapping is merged over the field's default instance, not the class defaults."""
    cfg = from_dict(PresetConfig, {"optimizer": {"warmup_steps": 3}})
    assert cfg.optimizer == OptimizerConfig(learning_rate=1e-5, warmup_steps=3, total_steps=7)


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


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        ({"seed": "abc"}, r"'seed': expected int, got 'abc' \(str\)"),
        ({"seed": 1.5}, r"'seed': expected int, got 1.5 \(float\)"),
        ({"packing": 1}, r"'packing': expected bool, got 1 \(int\)"),
        ({"seed": True}, r"'seed': expected int, got True \(bool\)"),
        ({"optimizer": {"learning_rate": "fast"}}, r"'optimizer.learning_rate': expected float, got 'fast'"),
        ({"optimizer": {"name": "adam"}}, r"'optimizer.name': expected one of 'adamw', 'sgd', got 'adam'.*'adamw'\?"),
        ({"lora": {"targets": "q_proj"}}, r"'lora.targets': expected tuple\[str, \.\.\.\], got 'q_proj'"),
        ({"lora": {"targets": ["q", 3]}}, r"'lora.targets\[1\]': expected str, got 3 \(int\)"),
        ({"loss_weights": {"math": "x"}}, r"'loss_weights.math': expected float, got 'x'"),
        ({"precision": "fp8"}, r"'precision': expected one of 'float32', 'bfloat16', got 'fp8'"),
        ({"run_name": 2024}, r"'run_name': expected str, got 2024 \(int\); quote"),
        ({"shape": [1, 2, 3]}, r"'shape': expected 2 items"),
        ({"max_grad_norm": "big"}, r"'max_grad_norm': expected float \| None, got 'big'"),
        ({"optimizer": 3}, r"'optimizer': expected a mapping of OptimizerConfig"),
    ],
)
def test_wrong_types_name_key_expected_and_value(data, pattern):
    with pytest.raises(ConfigError, match=pattern):
        from_dict(TrainConfig, {"model": "m", **data})


def test_missing_required_key():
    with pytest.raises(ConfigError, match=r"config key 'model' is required \(str\)"):
        from_dict(TrainConfig, {})


def test_validate_hook_runs_and_names_the_section():
    with pytest.raises(ConfigError, match=r"config 'optimizer': warmup_steps \(50\) must be <= total_steps \(20\)"):
        from_dict(TrainConfig, {"model": "m", "optimizer": {"warmup_steps": 50, "total_steps": 20}})


def test_config_error_is_a_tempax_error():
    assert issubclass(ConfigError, TempaxError)


def test_overrides_of_text_fields_keep_the_text():
    """YAML would read `no` as False and 007 as 7; fields that only hold text keep what was typed."""
    parsed = parse_overrides(
        ["optimizer.name=sgd", "run_name=no", "resume_from=007", "model='quoted'"], TrainConfig
    )
    assert parsed == {"optimizer": {"name": "sgd"}, "run_name": "no", "resume_from": "007", "model": "quoted"}
    assert parse_overrides(["resume_from=null"], TrainConfig) == {"resume_from": None}


def test_parse_overrides_uses_yaml_scalars():
    """1e-4 is a float (YAML 1.2), true a bool, [a,b] a list, null None; text fields keep the raw text."""
    parsed = parse_overrides(
        ["optimizer.learning_rate=1e-4", "packing=true", "lora.targets=[q_proj,v_proj]", "max_grad_norm=null",
         "run_name=2024", "run_name2=2024"],
        TrainConfig,
    )
    assert parsed == {
        "optimizer": {"learning_rate": 1e-4},
        "packing": True,
        "lora": {"targets": ["q_proj", "v_proj"]},
        "max_grad_norm": None,
        "run_name": "2024",  # a str field keeps the text
        "run_name2": 2024,  # unknown to the class: plain YAML; from_dict will reject the key
    }


@pytest.mark.parametrize("bad", ["novalue", "=3", "a..b=1"])
def test_malformed_override(bad):
    with pytest.raises(ConfigError, match="must look like key=value"):
        parse_overrides([bad])


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


def test_describe_lists_every_dotted_key():
    text = describe(TrainConfig)
    assert "model: str (required)\n    Model id or path." in text
    assert "optimizer.learning_rate: float = 0.0003\n    Peak learning rate." in text
    assert "optimizer.name: one of 'adamw', 'sgd' = adamw" in text
    assert "lora: LoraConfig | None = null\n    LoRA adapters; null trains all weights." in text
    assert "lora.targets: tuple[str, ...] = [q_proj, v_proj]" in text
    assert "max_grad_norm: float | None = 1.0" in text
    assert "precision: one of 'float32', 'bfloat16' = float32" in text


@pytest.mark.parametrize("raw", [".nan", ".inf", "-.inf", "nan", "inf", "'-Infinity'"])
def test_a_number_that_is_not_finite_is_refused_at_parse_time(raw, tmp_path):
    """YAML's .nan parses to a float and would compile and fail at step 2; the words nan / inf in a float field
    must read as the same problem, not as "expected float, got 'nan' (str)"."""
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, None, ["model=m", f"optimizer.learning_rate={raw}"])
    assert str(e.value).startswith("config key 'optimizer.learning_rate': ")
    assert str(e.value).endswith(" is not a finite number; numeric settings must be finite (e.g. 1e-4)")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: m\noptimizer:\n  learning_rate: {raw}\n")
    with pytest.raises(ConfigError, match="'optimizer.learning_rate': .* is not a finite number"):
        load_config(TrainConfig, recipe)


def test_the_real_sft_config_refuses_nan_learning_rate():
    from tempax.algorithms.registry import resolve

    with pytest.raises(ConfigError, match=r"^config key 'train.optimizer.learning_rate': nan is not a finite number"):
        load_config(resolve("sft")[0], None, ["train.optimizer.learning_rate=.nan"])


def test_import_callable_reads_a_file_a_module_and_names_what_is_wrong(tmp_path, monkeypatch):
    """`file.py:name` relative to the working directory, `module:name` with the working directory on the path
    (the `tempax` script's own folder is what Python puts first), and one-line errors for each bad reference."""
    from tempax.configlib import import_callable

    (tmp_path / "my_rewards.py").write_text("def exact(prompts, completions, **columns):\n    return [1.0]\n")
    (tmp_path / "broken.py").write_text("raise RuntimeError('bad module')\n")
    monkeypatch.chdir(tmp_path)
    assert import_callable("my_rewards.py:exact", key="k")([], ["x"]) == [1.0]
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    assert import_callable("my_rewards:exact", key="k")([], ["x"]) == [1.0]
    cases = [("nothing", "is not 'package.module:name'"), ("missing.py:f", "no file missing.py"),
             ("my_rewards.py:nope", "has no 'nope'; it defines exact"),
             ("broken.py:f", "cannot import 'broken.py:f' \\(RuntimeError: bad module\\)"),
             ("tempax_no_such_module:f", "cannot import 'tempax_no_such_module:f'")]
    for ref, message in cases:
        with pytest.raises(ConfigError, match=f"^k: .*{message}"):
            import_callable(ref, key="k")


# A config whose keys were renamed: a field (samples -> group_size), a section (prompts -> data) after one of its
# keys moved into another section (prompts.num_eval -> eval.num_prompts), and a top-level key moved into a section
# (eval_before -> eval.before).
@dataclass(frozen=True)
class SamplingKnobsConfig:
    RENAMED_KEYS: ClassVar[Mapping[str, str]] = {"samples": "group_size"}

    group_size: int = field(default=1, metadata={"help": "Completions per prompt."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})


@dataclass(frozen=True)
class PromptDataConfig:
    path: str = field(default="train.jsonl", metadata={"help": "Training prompts."})
    eval_path: Optional[str] = field(default=None, metadata={"help": "Held-out prompts."})


@dataclass(frozen=True)
class HeldOutConfig:
    before: bool = field(default=True, metadata={"help": "Evaluate the starting model."})
    num_prompts: int = field(default=64, metadata={"help": "Held-out prompts to evaluate."})


@dataclass(frozen=True)
class RenamedConfig:
    RENAMED_KEYS: ClassVar[Mapping[str, str]] = {
        "prompts.num_eval": "eval.num_prompts", "prompts": "data", "eval_before": "eval.before"}

    data: PromptDataConfig = field(default_factory=PromptDataConfig, metadata={"help": "Prompts."})
    knobs: SamplingKnobsConfig = field(default_factory=SamplingKnobsConfig, metadata={"help": "Sampling."})
    eval: HeldOutConfig = field(default_factory=HeldOutConfig, metadata={"help": "Evaluation."})


OLD_RECIPE = {"prompts": {"path": "p.jsonl", "num_eval": 2}, "knobs": {"samples": 4}, "eval_before": False}
NEW_RECIPE = {"data": {"path": "p.jsonl"}, "knobs": {"group_size": 4}, "eval": {"num_prompts": 2, "before": False}}


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
    from tempax.configlib import with_overrides

    base = GRPOConfig()
    changed = with_overrides(base, ["grpo.beta=0.04", "train.optimizer.learning_rate=5e-5"], where="after_sft_overrides")
    assert changed.grpo.beta == 0.04 and changed.train.optimizer.learning_rate == 5e-5
    assert base.grpo.beta != 0.04 or base.train.optimizer.learning_rate != 5e-5
    assert changed.lora == base.lora and changed.task == base.task
    with pytest.raises(ConfigError, match="^after_sft_overrides: .*grpo.betta"):
        with_overrides(base, ["grpo.betta=1"], where="after_sft_overrides")
