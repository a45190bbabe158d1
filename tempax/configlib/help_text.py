"""`describe`: every dotted key of a config class with its type, default and help text, as `--help` and
`tempax validate` show them."""

from __future__ import annotations

import dataclasses

from tempax.configlib.build import to_dict
from tempax.configlib.fields import dataclass_arm, default_of, dotted_key, field_types, is_required, type_name
from tempax.configlib.yaml_text import yaml_inline


def describe(cls: type) -> str:
    """Every dotted key of `cls` with its type, default and help text, one block per key."""
    lines: list[str] = []
    _describe_into(cls, "", lines)
    return "\n".join(lines)


def _describe_into(cls: type, path: str, lines: list[str]) -> None:
    hints = field_types(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key, tp = dotted_key(path, f.name), hints[f.name]
        help_text = f.metadata.get("help", "")
        sub = dataclass_arm(tp)
        default = default_of(f)
        if sub is not None:
            # A nested section: its own fields carry the values; an optional one also shows it defaults to null.
            shown = "= null" if default is None and tp is not sub else ""
            lines.append(f"{key}: {type_name(tp)} {shown}".rstrip())
            if help_text:
                lines.append(f"    {help_text}")
            _describe_into(sub, key, lines)
            continue
        shown = "(required)" if is_required(f) else "= " + yaml_inline(to_dict(default))
        lines.append(f"{key}: {type_name(tp)} {shown}")
        if help_text:
            lines.append(f"    {help_text}")
