"""`a.b.c=value` overrides from the command line as a nested mapping, each value read as YAML unless the field it
sets holds text (so `name=2024` stays "2024" and `mode=no` stays "no")."""

from __future__ import annotations

import enum
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from tempax.configlib.fields import dataclass_arm, field_types, is_union
from tempax.configlib.renames import renamed_keys
from tempax.configlib.yaml_text import load_yaml_text
from tempax.errors import ConfigError


def parse_overrides(overrides: Sequence[str], cls: type | None = None) -> dict[str, Any]:
    """Turn `["a.b=1", "c=[x, y]"]` into the nested mapping `{"a": {"b": 1}, "c": ["x", "y"]}`.

    Values are parsed as YAML scalars/flow collections (`1e-4`, `true`, `null`, `[q_proj, v_proj]`), except
    that when `cls` says the target field is text, the value is kept verbatim (so `name=2024` stays "2024").
    """
    out: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(
                f"override '{item}' must look like key=value, for example train.optimizer.learning_rate=1e-4"
            )
        value = _parse_override_value(raw.strip(), _field_type(cls, key) if cls is not None else None, item)
        _set_dotted(out, key, value, item)
    return out


def _parse_override_value(raw: str, tp: Any, item: str) -> Any:
    quoted = len(raw) > 1 and raw[0] in "'\"" and raw[-1] == raw[0]
    if _is_text(tp) and not quoted:
        if raw in ("null", "~") and is_union(tp) and type(None) in typing.get_args(tp):
            return None
        return raw
    try:
        return load_yaml_text(raw) if raw else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override '{item}': cannot parse the value as YAML ({exc.problem})") from None


def _is_text(tp: Any) -> bool:
    """Whether a field only ever holds text, so an override's raw value must not go through YAML (`no` -> False)."""
    if tp is str or tp is Path:
        return True
    if typing.get_origin(tp) is Literal:
        return all(isinstance(a, str) for a in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return all(isinstance(m.value, str) for m in tp)
    if is_union(tp):
        arms = [a for a in typing.get_args(tp) if a is not type(None)]
        return len(arms) == 1 and _is_text(arms[0])
    return False


def _field_type(cls: type, dotted: str) -> Any:
    """The annotation of `dotted` inside `cls` (a renamed key's: that of its new name), or None when the path
    names no field."""
    tp: Any = cls
    parts = dotted.split(".")
    i = 0
    while i < len(parts):
        sub = dataclass_arm(tp)
        if sub is None:
            return None
        rest = ".".join(parts[i:])
        for old, new in renamed_keys(sub).items():
            if rest == old or rest.startswith(old + "."):
                parts = parts[:i] + new.split(".") + parts[i + old.count(".") + 1:]
                break
        tp = field_types(sub).get(parts[i])
        if tp is None:
            return None
        i += 1
    return tp


def _set_dotted(out: dict[str, Any], key: str, value: Any, item: str) -> None:
    parts = key.split(".")
    node = out
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"override '{item}': '{'.'.join(parts[: i + 1])}' was already set to a value")
        node = child
    node[parts[-1]] = value
