"""tempax.configlib.yaml_text: YAML 1.2 floats on reading, recipe-shaped text on writing."""

from __future__ import annotations

import pytest
import yaml

from tempax.configlib.yaml_text import dump_yaml_text, load_yaml_text, read_yaml, yaml_inline


@pytest.mark.parametrize(("text", "value"), [("1e-4", 1e-4), ("5E3", 5000.0), ("-2.5e+1", -25.0), ("3", 3),
                                             ("1.0", 1.0), ("'1e-4'", "1e-4"), ("yes", True), ("null", None)])
def test_numbers_read_as_yaml_1_2(text, value):
    """PyYAML's YAML 1.1 reads 1e-4 (no dot in the mantissa) as text; recipes mean a float."""
    loaded = load_yaml_text(f"x: {text}\n")["x"]
    assert loaded == value and type(loaded) is type(value)
    assert yaml.safe_load("x: 1e-4\n")["x"] == "1e-4"  # what the plain loader does, the reason for ours


def test_dump_writes_sections_as_blocks_lists_inline_in_the_given_order(tmp_path):
    data = {"model": "m", "lora": {"rank": 4, "targets": ["q_proj", "v_proj"]}, "a": 1}
    text = dump_yaml_text(data)
    assert text == "model: m\nlora:\n  rank: 4\n  targets: [q_proj, v_proj]\na: 1\n"
    path = tmp_path / "r.yaml"
    path.write_text(text)
    assert read_yaml(path) == data


def test_yaml_inline_is_one_line():
    assert yaml_inline(["q_proj", "v_proj"]) == "[q_proj, v_proj]"
    assert yaml_inline(0.0003) == "0.0003" and yaml_inline(None) == "null" and yaml_inline({"a": 1}) == "{a: 1}"
