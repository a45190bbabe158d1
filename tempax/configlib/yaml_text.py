"""YAML as recipes are read and written: YAML 1.2 floats (`1e-4` is a float, not PyYAML's YAML 1.1 string
"1e-4"), sections as blocks and lists inline."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-4` and `5E3` as floats (YAML 1.1 demands a dot in the mantissa)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


class _Dumper(yaml.SafeDumper):
    """SafeDumper writing sections as blocks and lists inline (`targets: [q_proj, v_proj]`), as recipes do."""


_Dumper.add_representer(
    list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)
)


def load_yaml_text(text: str) -> Any:
    """YAML text as plain data, with YAML 1.2 floats.

    Raises:
        yaml.YAMLError: the text is not valid YAML.
    """
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader


def read_yaml(path: str | Path) -> Any:
    """A YAML file as plain data, with the YAML 1.2 floats recipes are parsed with (`1e-4` is a float)."""
    return load_yaml_text(Path(path).read_text())


def dump_yaml_text(data: Any) -> str:
    """Plain data as recipe-shaped YAML text: keys in their given order, sections as blocks, lists inline."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def yaml_inline(value: Any) -> str:
    """A value as one line of YAML flow text (`[q_proj, v_proj]`, `{a: 1}`, `0.0003`)."""
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 30).strip().removesuffix("...").strip()
