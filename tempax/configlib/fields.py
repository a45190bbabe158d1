"""What a config field is: its annotation read as a type, its default, its help text, and the dotted keys a
config class holds. The helpers every other part of `tempax.configlib` reads fields with."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Union


def help_field(text: str, default: Any = None, **kw: Any) -> Any:
    """A dataclass field documented once: `help` metadata shown by `describe` and `tempax validate`.

    Pass `default_factory=` instead of a default for mutable or nested-dataclass defaults.
    """
    if "default_factory" in kw:
        return dataclasses.field(metadata={"help": text}, **kw)
    return dataclasses.field(default=default, metadata={"help": text})


def field_types(cls: type) -> dict[str, Any]:
    """The resolved annotation of every field of the dataclass `cls`, by name."""
    # get_type_hints resolves `from __future__ import annotations` strings against the defining module.
    try:
        return typing.get_type_hints(cls)
    except NameError as exc:  # a type defined in a local scope cannot be resolved from its string annotation
        raise TypeError(f"cannot resolve the field types of {cls.__qualname__}: {exc}") from exc


def is_union(tp: Any) -> bool:
    """Whether `tp` is `A | B` or `Union[A, B]` (`Optional[A]` included)."""
    return typing.get_origin(tp) in (Union, types.UnionType)


def type_name(tp: Any) -> str:
    """A short human-readable spelling of a type for error messages and `describe`."""
    if tp is type(None):
        return "None"
    if tp is Any:
        return "any"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if is_union(tp):
        return " | ".join(type_name(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in tp)
    if origin in (tuple, list, dict, Sequence, Mapping):
        name = {tuple: "tuple", list: "list", dict: "dict", Sequence: "list", Mapping: "dict"}[origin]
        if not args:
            return name
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return f"tuple[{type_name(args[0])}, ...]"
        return f"{name}[{', '.join(type_name(a) for a in args)}]"
    return getattr(tp, "__name__", repr(tp))


def show_value(value: Any) -> str:
    """A value as an error message quotes it: its repr, cut at 80 characters, and its type."""
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def dotted_key(path: str, name: str) -> str:
    """The dotted key of field `name` inside the section at `path` ("" for the top level)."""
    return f"{path}.{name}" if path else name


def dataclass_arm(tp: Any) -> type | None:
    """The dataclass inside `tp`, `tp | None` or `Optional[tp]`, if any."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp
    if is_union(tp):
        for arm in typing.get_args(tp):
            if dataclasses.is_dataclass(arm) and isinstance(arm, type):
                return arm
    return None


def default_of(f: dataclasses.Field) -> Any:
    """A field's default value (a fresh one from its factory), or None when it has none."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def is_required(f: dataclasses.Field) -> bool:
    """Whether a field has neither a default nor a default factory."""
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def all_keys(cls: type, path: str = "") -> list[str]:
    """Every dotted key of the config class `cls`, sections and their fields, in declaration order."""
    keys: list[str] = []
    hints = field_types(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = dotted_key(path, f.name)
        keys.append(key)
        sub = dataclass_arm(hints[f.name])
        if sub is not None:
            keys.extend(all_keys(sub, key))
    return keys
