"""tempax.configlib.build: plain data to a typed config (every value checked against its field, the key named in
each error) and back."""

from __future__ import annotations

import pytest

from tempax.configlib.build import deep_merge, from_dict, to_dict
from tempax.configlib.recipes import load_config
from tempax.errors import ConfigError
from tests.configlib.configs import LoraConfig, OptimizerConfig, Precision, PresetConfig, TrainConfig


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


def test_to_dict_writes_plain_yaml_ready_data():
    """A dataclass becomes a dict of its fields, a tuple a list, an enum its value, a nested section a dict."""
    cfg = TrainConfig(model="m", lora=LoraConfig(rank=4), precision=Precision.BF16, shape=(3, 4))
    data = to_dict(cfg)
    assert data["lora"] == {"rank": 4, "targets": ["q_proj", "v_proj"]}
    assert data["precision"] == "bfloat16" and data["shape"] == [3, 4]
    assert data["optimizer"] == {"learning_rate": 3e-4, "warmup_steps": 10, "total_steps": 100, "name": "adamw"}
    assert from_dict(TrainConfig, data) == cfg


def test_deep_merge_merges_sections_and_lets_an_empty_mapping_clear_one():
    """{a: {x: 1, y: 2}, b: 1} under {a: {y: 3}} is {a: {x: 1, y: 3}, b: 1}; an empty mapping replaces the
    section ({a: {}}), a scalar replaces a mapping, and neither input changes."""
    base = {"a": {"x": 1, "y": 2}, "b": 1}
    assert deep_merge(base, {"a": {"y": 3}}) == {"a": {"x": 1, "y": 3}, "b": 1}
    assert deep_merge(base, {"a": {}}) == {"a": {}, "b": 1}
    assert deep_merge(base, {"a": 5, "c": [1]}) == {"a": 5, "b": 1, "c": [1]}
    assert base == {"a": {"x": 1, "y": 2}, "b": 1}


def test_a_union_keeps_the_arm_a_value_already_is():
    """`int | str` keeps 3 as the int 3 and "3" as the text "3"; 1e4 in an int field is 10000 (a whole float)."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Either:
        value: int | str = 0

    assert from_dict(Either, {"value": 3}).value == 3
    assert from_dict(Either, {"value": "3"}).value == "3"
    assert from_dict(TrainConfig, {"model": "m", "seed": 1e4}).seed == 10000
