"""tempax.configlib.fields: a field's annotation read as a type, its default, its help, and a class's keys."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Optional

import pytest

from tempax.configlib.fields import (
    all_keys,
    dataclass_arm,
    default_of,
    dotted_key,
    field_types,
    help_field,
    is_required,
    is_union,
    show_value,
    type_name,
)
from tests.configlib.configs import LoraConfig, OptimizerConfig, Precision, TrainConfig


@pytest.mark.parametrize(
    ("tp", "name"),
    [
        (type(None), "None"),
        (Any, "any"),
        (int, "int"),
        (float | None, "float | None"),
        (Optional[str], "str | None"),
        (Literal["adamw", "sgd"], "one of 'adamw', 'sgd'"),
        (Precision, "one of 'float32', 'bfloat16'"),
        (tuple[str, ...], "tuple[str, ...]"),
        (tuple[int, int], "tuple[int, int]"),
        (dict[str, float], "dict[str, float]"),
        (Sequence[int], "list[int]"),
        (Mapping[str, int], "dict[str, int]"),
        (list, "list"),
        (LoraConfig | None, "LoraConfig | None"),
    ],
)
def test_type_name_spells_a_type_as_an_error_message_shows_it(tp, name):
    assert type_name(tp) == name


def test_a_union_and_its_dataclass_arm():
    assert is_union(int | None) and is_union(Optional[LoraConfig]) and not is_union(int)
    assert dataclass_arm(LoraConfig) is LoraConfig
    assert dataclass_arm(Optional[LoraConfig]) is LoraConfig and dataclass_arm(LoraConfig | None) is LoraConfig
    assert dataclass_arm(int | None) is None and dataclass_arm(str) is None
    assert dataclass_arm(LoraConfig(rank=1)) is None  # an instance is no type


def test_field_types_resolves_string_annotations():
    """configs.py uses `from __future__ import annotations`: every annotation is a string until resolved."""
    hints = field_types(TrainConfig)
    assert hints["optimizer"] is OptimizerConfig and hints["lora"] == Optional[LoraConfig]
    assert hints["shape"] == tuple[int, int]


def test_all_keys_lists_sections_and_their_fields_in_order():
    assert all_keys(LoraConfig) == ["rank", "targets"]
    keys = all_keys(TrainConfig)
    assert keys[:7] == ["model", "optimizer", "optimizer.learning_rate", "optimizer.warmup_steps",
                        "optimizer.total_steps", "optimizer.name", "lora"]
    assert keys[7:9] == ["lora.rank", "lora.targets"] and keys[-1] == "shape"
    assert all_keys(LoraConfig, "train.lora") == ["train.lora.rank", "train.lora.targets"]


def test_help_field_default_required_and_factory():
    @dataclasses.dataclass(frozen=True)
    class Knobs:
        name: str = help_field("A name.", "x")
        tags: tuple[str, ...] = help_field("Tags.", default_factory=lambda: ("a",))
        lora: LoraConfig = help_field("Adapters.", default_factory=LoraConfig)

    fields = {f.name: f for f in dataclasses.fields(Knobs)}
    assert fields["name"].metadata["help"] == "A name." and default_of(fields["name"]) == "x"
    assert default_of(fields["tags"]) == ("a",) and default_of(fields["lora"]) == LoraConfig()
    assert not is_required(fields["name"])
    model = next(f for f in dataclasses.fields(TrainConfig) if f.name == "model")
    assert is_required(model) and default_of(model) is None


def test_show_value_and_dotted_key():
    """A long value is cut to 77 characters plus '...'; the type follows in brackets."""
    assert show_value(3) == "3 (int)" and show_value("a") == "'a' (str)"
    assert show_value("x" * 100) == "'" + "x" * 76 + "... (str)"
    assert dotted_key("", "seed") == "seed" and dotted_key("train.optimizer", "name") == "train.optimizer.name"
