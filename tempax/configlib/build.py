"""Plain data to a typed config and back: `from_dict` builds a frozen dataclass, checking every value against its
field's annotation (a typo or a wrong type fails at parse time, naming the dotted key), and `to_dict` writes one
out as plain YAML-ready data."""

from __future__ import annotations

import dataclasses
import enum
import math
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from tempax.configlib.fields import dotted_key, default_of, field_types, is_required, is_union, show_value, type_name
from tempax.configlib.renames import upgrade_keys, warn_renamed
from tempax.configlib.suggest import nearest_choice, unknown_key_message
from tempax.errors import ConfigError

T = TypeVar("T")

_NOT_FINITE_WORDS = ("nan", "inf", "infinity")
_SCALARS = (bool, int, float, str, Path)


def from_dict(cls: type[T], data: Mapping[str, Any] | None, *, path: str = "") -> T:
    """Build the dataclass `cls` from plain data, coercing and validating every value.

    Nested dataclasses are built from nested mappings; a nested mapping is merged over the field's default
    instance, so a partial `optimizer: {learning_rate: 1e-4}` keeps the other optimizer defaults. A renamed key
    is read under its new name with a warning (`upgrade_keys`). `validate()` runs on every dataclass right after
    it is built. `path` is the dotted prefix used in error messages.

    Raises:
        ConfigError: an unknown key (with the nearest valid keys), a missing required key, a value of the wrong
            type, a key given under both its old and its new name, or a failed `validate()`.
    """
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"from_dict needs a dataclass type, got {cls!r}")
    data, moved = upgrade_keys(cls, {} if data is None else data, path=path)
    warn_renamed(moved)
    return _build(cls, data, path, (cls, path))


def to_dict(cfg: Any) -> Any:
    """Plain YAML-ready data for a config: dataclasses -> dicts, tuples -> lists, enums -> their values."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.init}
    if isinstance(cfg, enum.Enum):
        return cfg.value
    if isinstance(cfg, Path):
        return str(cfg)
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, Mapping):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg


def deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """`update` on top of `base`, mappings merged key by key; an empty mapping (`model.overrides={}`) replaces
    the value, so an override can clear what a recipe set."""
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, Mapping) and v and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _build(cls: type[T], data: Any, path: str, root: tuple[type, str]) -> T:
    # `root` is the outermost class and its path, for suggesting a key that sits at another level.
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        where = f"config key '{path}'" if path else "the config"
        raise ConfigError(f"{where}: expected a mapping of {cls.__name__} keys to values, got {show_value(data)}")
    hints = field_types(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for name in data:
        if not isinstance(name, str) or name not in fields:
            raise ConfigError(unknown_key_message(dotted_key(path, str(name)), list(fields), path, root))
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        key = dotted_key(path, name)
        if name in data:
            value = data[name]
            if isinstance(value, Mapping):
                # Merge a partial nested mapping over the field's own default so presets keep their other values.
                default = default_of(f)
                if dataclasses.is_dataclass(default) and not isinstance(default, type):
                    value = deep_merge(to_dict(default), value)
            kwargs[name] = _coerce(value, hints[name], key, root)
        elif is_required(f):
            raise ConfigError(f"config key '{key}' is required ({type_name(hints[name])}) but was not given")
    try:
        obj = cls(**kwargs)
    except ConfigError as exc:  # raised by a __post_init__
        raise _in_path(exc, path) from None
    validate = getattr(obj, "validate", None)
    if callable(validate):
        try:
            validate()
        except ConfigError as exc:
            raise _in_path(exc, path) from None
    return obj


def _in_path(exc: ConfigError, path: str) -> ConfigError:
    # A nested config's validate() does not know where it sits in the tree; add that.
    return ConfigError(f"config '{path}': {exc}") if path else exc


def _not_finite(path: str, value: Any) -> ConfigError:
    return ConfigError(f"config key '{path}': {value!r} is not a finite number; numeric settings must be finite "
                       "(e.g. 1e-4)")


def _wrong(path: str, tp: Any, value: Any, hint: str = "") -> ConfigError:
    return ConfigError(f"config key '{path}': expected {type_name(tp)}, got {show_value(value)}{hint}")


def _coerce(value: Any, tp: Any, path: str, root: tuple[type, str]) -> Any:
    """Check `value` against the annotation `tp`, converting where the conversion is lossless."""
    if tp is Any:
        return value
    if isinstance(value, float) and not math.isfinite(value):  # YAML's .nan / .inf would fail only once training
        raise _not_finite(path, value)
    if tp is type(None):
        if value is None:
            return None
        raise _wrong(path, tp, value)
    origin = typing.get_origin(tp)
    if is_union(tp):
        return _coerce_union(value, tp, path, root)
    if origin is Literal:
        return _coerce_literal(value, tp, path)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _coerce_enum(value, tp, path)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _build(tp, value, path, root)
    if tp in _SCALARS:
        return _coerce_scalar(value, tp, path)
    if origin in (tuple, list, Sequence):
        return _coerce_sequence(value, tp, path, root)
    if origin in (dict, Mapping):
        return _coerce_mapping(value, tp, path, root)
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _wrong(path, tp, value)
    raise TypeError(f"config key '{path}': unsupported field type {tp!r}")


def _coerce_union(value: Any, tp: Any, path: str, root: tuple[type, str]) -> Any:
    args = typing.get_args(tp)
    if value is None:
        if type(None) in args:
            return None
        raise _wrong(path, tp, value)
    arms = [a for a in args if a is not type(None)]
    # Prefer an arm the value already is, so `int | str` keeps 3 as int and "3" as str.
    for arm in arms:
        if isinstance(arm, type) and type(value) is arm:
            return value
    errors = []
    for arm in arms:
        try:
            return _coerce(value, arm, path, root)
        except ConfigError as exc:
            errors.append(exc)
    if len(errors) == 1 and not (isinstance(arms[0], type) and not dataclasses.is_dataclass(arms[0])):
        raise errors[0]  # inside a list or a nested config the inner message points at the exact item
    raise _wrong(path, tp, value)


def _coerce_literal(value: Any, tp: Any, path: str) -> Any:
    args = typing.get_args(tp)
    if value in args and any(type(value) is type(a) for a in args if a == value):
        return value
    shown = ", ".join(repr(a) for a in args)
    raise ConfigError(f"config key '{path}': expected one of {shown}, got {show_value(value)}"
                      f"{nearest_choice(value, args)}")


def _coerce_enum(value: Any, tp: type[enum.Enum], path: str) -> enum.Enum:
    if isinstance(value, tp):
        return value
    for member in tp:
        if value == member.name or value == member.value:
            return member
    raise _wrong(path, tp, value)


def _coerce_scalar(value: Any, tp: type, path: str) -> Any:
    if tp is bool:
        # Strict: 1/0 or "yes" in a bool field is much more often a mistake than an intent.
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():  # `steps: 1e4` means 10000
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and value.strip().lower().lstrip("+-.") in _NOT_FINITE_WORDS:
            raise _not_finite(path, value)
    elif tp is str:
        if isinstance(value, str):
            return value
        # YAML turns unquoted 1.10, yes and 2024 into numbers/bools; say how to keep the text.
        raise _wrong(path, tp, value, "; quote the value in YAML to keep it as text")
    elif isinstance(value, (str, Path)):  # tp is Path
        return Path(value)
    raise _wrong(path, tp, value)


def _coerce_sequence(value: Any, tp: Any, path: str, root: tuple[type, str]) -> list[Any] | tuple[Any, ...]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise _wrong(path, tp, value, "; write a list like [a, b]")
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):
            raise ConfigError(f"config key '{path}': expected {len(args)} items ({type_name(tp)}), got {len(value)}")
        return tuple(_coerce(v, a, f"{path}[{i}]", root) for i, (v, a) in enumerate(zip(value, args)))
    item_tp = args[0] if args else Any
    items = [_coerce(v, item_tp, f"{path}[{i}]", root) for i, v in enumerate(value)]
    return list(items) if origin is list else tuple(items)


def _coerce_mapping(value: Any, tp: Any, path: str, root: tuple[type, str]) -> dict[Any, Any]:
    if not isinstance(value, Mapping):
        raise _wrong(path, tp, value)
    key_tp, val_tp = typing.get_args(tp) or (Any, Any)
    return {
        _coerce(k, key_tp, f"{path}.{k}", root): _coerce(v, val_tp, f"{path}.{k}", root)
        for k, v in value.items()
    }
