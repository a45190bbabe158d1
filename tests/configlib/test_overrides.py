"""tempax.configlib.overrides: `a.b=value` overrides as a nested mapping, text fields kept as typed."""

from __future__ import annotations

import pytest

from tempax.configlib.overrides import parse_overrides
from tempax.errors import ConfigError
from tests.configlib.configs import TrainConfig


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


def test_the_same_key_set_twice_keeps_the_last_and_a_value_under_a_value_is_refused():
    assert parse_overrides(["seed=1", "seed=2"]) == {"seed": 2}
    with pytest.raises(ConfigError, match=r"override 'seed.x=1': 'seed' was already set to a value"):
        parse_overrides(["seed=1", "seed.x=1"])
    with pytest.raises(ConfigError, match=r"override 'a=\[1': cannot parse the value as YAML"):
        parse_overrides(["a=[1"])
