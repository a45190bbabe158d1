"""Typed configs: frozen dataclasses read from YAML and `a.b.c=value` overrides.

Every recipe and CLI command describes its settings as a frozen dataclass whose fields are documented once:

    @dataclass(frozen=True)
    class OptimizerConfig:
        learning_rate: float = field(default=3e-4, metadata={"help": "Peak learning rate."})

`from_dict` builds such a class from plain data, coercing and checking every value, so that a typo or a wrong
type fails at parse time with a message naming the dotted key (`optimizer.learnig_rate`) instead of deep inside
training. A dataclass may define `validate(self)` for cross-field checks; it runs right after construction and
raises `ConfigError`. Configs are parsed once and never mutated afterwards.

A recipe key that was renamed keeps working: the class declares `RENAMED_KEYS = {"old": "new"}` (dotted keys
relative to the class, so a key can also move into another section), and `from_dict` / `load_config` read the
old key as the new one with one warning line naming the new key (`upgrade_keys`; giving both is an error). Old
recipes, `a.b=value` overrides and the `config.yaml` of old runs all go through it.

Numbers follow YAML 1.2 rather than PyYAML's YAML 1.1 default: `1e-4` is a float, not the string "1e-4".
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import logging
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

from tempax.errors import ConfigError

__all__ = ["ConfigError", "RENAMED_KEYS", "describe", "dump_yaml", "from_dict", "load_config", "parse_overrides",
           "read_yaml", "renamed_keys", "to_dict", "upgrade_keys"]

T = TypeVar("T")

_log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------------------
# YAML with YAML 1.2 floats


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


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader


def read_yaml(path: str | Path) -> Any:
    """A YAML file as plain data, with the YAML 1.2 floats recipes are parsed with (`1e-4` is a float)."""
    return _yaml_load(Path(path).read_text())


# --------------------------------------------------------------------------------------------------------------
# Type helpers


def _hints(cls: type) -> dict[str, Any]:
    # get_type_hints resolves `from __future__ import annotations` strings against the defining module.
    try:
        return typing.get_type_hints(cls)
    except NameError as exc:  # a type defined in a local scope cannot be resolved from its string annotation
        raise TypeError(f"cannot resolve the field types of {cls.__qualname__}: {exc}") from exc


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _type_name(tp: Any) -> str:
    """A short human-readable spelling of a type for error messages and `describe`."""
    if tp is type(None):
        return "None"
    if tp is Any:
        return "any"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if _is_union(tp):
        return " | ".join(_type_name(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in tp)
    if origin in (tuple, list, dict, Sequence, Mapping):
        name = {tuple: "tuple", list: "list", dict: "dict", Sequence: "list", Mapping: "dict"}[origin]
        if not args:
            return name
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return f"tuple[{_type_name(args[0])}, ...]"
        return f"{name}[{', '.join(_type_name(a) for a in args)}]"
    return getattr(tp, "__name__", repr(tp))


def _show(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def _key(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


_NOT_FINITE_WORDS = ("nan", "inf", "infinity")


def _not_finite(path: str, value: Any) -> ConfigError:
    return ConfigError(f"config key '{path}': {value!r} is not a finite number; numeric settings must be finite "
                       "(e.g. 1e-4)")


def _wrong(path: str, tp: Any, value: Any, hint: str = "") -> ConfigError:
    return ConfigError(f"config key '{path}': expected {_type_name(tp)}, got {_show(value)}{hint}")


def _dataclass_arm(tp: Any) -> type | None:
    """The dataclass inside `tp`, `tp | None` or `Optional[tp]`, if any."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp
    if _is_union(tp):
        for arm in typing.get_args(tp):
            if dataclasses.is_dataclass(arm) and isinstance(arm, type):
                return arm
    return None


# --------------------------------------------------------------------------------------------------------------
# Renamed keys

# The class attribute a config class declares its renamed recipe keys in:
#
#     @dataclass(frozen=True)
#     class PPOKnobsConfig:
#         RENAMED_KEYS: ClassVar[Mapping[str, str]] = {"samples_per_prompt": "group_size"}
#
# Keys are dotted and relative to the class: "old" -> "new" renames a field, "eval_before" -> "eval.before" moves
# one into a section, "prompts" -> "data" renames a section. Renames apply in the order given, each class's
# before its sections', and a subclass inherits its base's.
RENAMED_KEYS = "RENAMED_KEYS"


def renamed_keys(cls: type) -> Mapping[str, str]:
    """The renamed recipe keys `cls` declares, old -> new (dotted, relative to `cls`); empty when none."""
    return getattr(cls, RENAMED_KEYS, None) or {}


def upgrade_keys(cls: type, data: Any, *, path: str = "") -> tuple[Any, list[tuple[str, str]]]:
    """`data` (plain nested mappings for `cls`) with every renamed key of `cls` and its sections under its new
    name, and the (old, new) dotted keys that moved, in order. `data` itself is not changed.

    This is the whole of the renamed-key rule: `from_dict` runs it (and warns once per moved key), and code that
    compares a stored config with a new one (`tempax.train.run_identity`, the model card) runs it quietly, so an
    old name is the same setting as its new one everywhere.

    Raises:
        ConfigError: a mapping gives both a key and its old name (which one is meant is not knowable).
    """
    if not isinstance(data, Mapping) or not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        return data, []
    out = _copy_mappings(data)
    moved: list[tuple[str, str]] = []
    for old, new in renamed_keys(cls).items():
        found, value = _pop_dotted(out, old)
        if not found:
            continue
        if _has_dotted(out, new):
            raise ConfigError(f"config keys '{_key(path, old)}' and '{_key(path, new)}' are both given, and "
                              f"'{_key(path, old)}' is the old name of '{_key(path, new)}'; keep only "
                              f"'{_key(path, new)}'")
        _put_dotted(out, new, value, path)
        moved.append((_key(path, old), _key(path, new)))
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.init and f.name in out:
            sub = _dataclass_arm(hints[f.name])
            if sub is not None:
                out[f.name], inner = upgrade_keys(sub, out[f.name], path=_key(path, f.name))
                moved.extend(inner)
    return out, moved


def _warn_renamed(moved: Sequence[tuple[str, str]], where: str = "") -> None:
    prefix = f"{where}: " if where else ""
    for old, new in moved:
        _log.warning("%sconfig key '%s' is renamed '%s'; its value is used as '%s' (write '%s' to silence this "
                     "warning)", prefix, old, new, new, new)


def _copy_mappings(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy_mappings(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def _pop_dotted(tree: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    """(found, value) of `dotted` in `tree`, removed from it; a section left empty by the removal goes too (it
    held only the moved key, and an empty mapping would otherwise replace a recipe's section when merged)."""
    *parents, leaf = dotted.split(".")
    chain = [tree]
    for part in parents:
        child = chain[-1].get(part)
        if not isinstance(child, dict):
            return False, None
        chain.append(child)
    if leaf not in chain[-1]:
        return False, None
    value = chain[-1].pop(leaf)
    for parent, part, child in reversed(list(zip(chain[:-1], parents, chain[1:]))):
        if child:
            break
        del parent[part]
    return True, value


def _has_dotted(tree: Mapping[str, Any], dotted: str) -> bool:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _put_dotted(tree: dict[str, Any], dotted: str, value: Any, path: str) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for i, part in enumerate(parents):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config key '{_key(path, '.'.join(parents[: i + 1]))}' must be a mapping (it holds "
                              f"'{_key(path, dotted)}'), got {_show(child)}")
        node = child
    node[leaf] = value


# --------------------------------------------------------------------------------------------------------------
# from_dict


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
    _warn_renamed(moved)
    return _build(cls, data, path, (cls, path))


def _build(cls: type[T], data: Any, path: str, root: tuple[type, str]) -> T:
    # `root` is the outermost class and its path, for suggesting a key that sits at another level.
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        where = f"config key '{path}'" if path else "the config"
        raise ConfigError(f"{where}: expected a mapping of {cls.__name__} keys to values, got {_show(data)}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for name in data:
        if not isinstance(name, str) or name not in fields:
            raise ConfigError(_unknown_key_message(_key(path, str(name)), list(fields), path, root))
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        key = _key(path, name)
        if name in data:
            value = data[name]
            if isinstance(value, Mapping):
                # Merge a partial nested mapping over the field's own default so presets keep their other values.
                default = _default_of(f)
                if dataclasses.is_dataclass(default) and not isinstance(default, type):
                    value = _deep_merge(to_dict(default), value)
            kwargs[name] = _coerce(value, hints[name], key, root)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"config key '{key}' is required ({_type_name(hints[name])}) but was not given")
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


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """`update` on top of `base`, mappings merged key by key; an empty mapping (`model.overrides={}`) replaces
    the value, so an override can clear what a recipe set."""
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, Mapping) and v and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _unknown_key_message(key: str, siblings: list[str], path: str, root: tuple[type, str]) -> str:
    leaf = key.rsplit(".", 1)[-1]
    close = [_key(path, s) for s in difflib.get_close_matches(leaf, siblings, n=3, cutoff=0.6)]
    if not close:
        # Maybe the key is right but at the wrong level ('learning_rate' instead of 'optimizer.learning_rate').
        leaves: dict[str, list[str]] = {}
        for k in _all_keys(*root):
            leaves.setdefault(k.rsplit(".", 1)[-1], []).append(k)
        near = leaves.get(leaf) or [
            k for name in difflib.get_close_matches(leaf, list(leaves), n=3, cutoff=0.8) for k in leaves[name]
        ]
        close = near[:3]
    msg = f"unknown key '{key}'"
    if close:
        return msg + "; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    where = f"under '{path}'" if path else "at the top level"
    return msg + f"; valid keys {where}: " + ", ".join(siblings)


def _all_keys(cls: type, path: str = "") -> list[str]:
    keys: list[str] = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = _key(path, f.name)
        keys.append(key)
        sub = _dataclass_arm(hints[f.name])
        if sub is not None:
            keys.extend(_all_keys(sub, key))
    return keys


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
    origin, args = typing.get_origin(tp), typing.get_args(tp)

    if _is_union(tp):
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

    if origin is Literal:
        if value in args and any(type(value) is type(a) for a in args if a == value):
            return value
        shown = ", ".join(repr(a) for a in args)
        close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"config key '{path}': expected one of {shown}, got {_show(value)}{hint}")

    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        for member in tp:
            if value == member.name or value == member.value:
                return member
        raise _wrong(path, tp, value)

    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _build(tp, value, path, root)

    if tp is bool:
        # Strict: 1/0 or "yes" in a bool field is much more often a mistake than an intent.
        if isinstance(value, bool):
            return value
        raise _wrong(path, tp, value)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():  # `steps: 1e4` means 10000
            return int(value)
        raise _wrong(path, tp, value)
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and value.strip().lower().lstrip("+-.") in _NOT_FINITE_WORDS:
            raise _not_finite(path, value)
        raise _wrong(path, tp, value)
    if tp is str:
        if isinstance(value, str):
            return value
        # YAML turns unquoted 1.10, yes and 2024 into numbers/bools; say how to keep the text.
        raise _wrong(path, tp, value, "; quote the value in YAML to keep it as text")
    if tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        raise _wrong(path, tp, value)

    if origin in (tuple, list, Sequence):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise _wrong(path, tp, value, "; write a list like [a, b]")
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                raise ConfigError(
                    f"config key '{path}': expected {len(args)} items ({_type_name(tp)}), got {len(value)}"
                )
            return tuple(_coerce(v, a, f"{path}[{i}]", root) for i, (v, a) in enumerate(zip(value, args)))
        item_tp = args[0] if args else Any
        items = [_coerce(v, item_tp, f"{path}[{i}]", root) for i, v in enumerate(value)]
        return list(items) if origin is list else tuple(items)

    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise _wrong(path, tp, value)
        key_tp, val_tp = args if args else (Any, Any)
        return {
            _coerce(k, key_tp, f"{path}.{k}", root): _coerce(v, val_tp, f"{path}.{k}", root)
            for k, v in value.items()
        }

    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _wrong(path, tp, value)
    raise TypeError(f"config key '{path}': unsupported field type {tp!r}")


# --------------------------------------------------------------------------------------------------------------
# YAML and overrides


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
        if raw in ("null", "~") and _is_union(tp) and type(None) in typing.get_args(tp):
            return None
        return raw
    try:
        return _yaml_load(raw) if raw else None
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
    if _is_union(tp):
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
        sub = _dataclass_arm(tp)
        if sub is None:
            return None
        rest = ".".join(parts[i:])
        for old, new in renamed_keys(sub).items():
            if rest == old or rest.startswith(old + "."):
                parts = parts[:i] + new.split(".") + parts[i + old.count(".") + 1:]
                break
        tp = _hints(sub).get(parts[i])
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


# The top-level recipe key naming the command that runs it (`command: sft`). It belongs to the recipe, not to
# the config: `load_config` checks it against the command asked for and leaves it out of the config.
COMMAND_KEY = "command"


def read_recipe(yaml_path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML recipe (`command:` included).

    Raises:
        ConfigError: the file is missing, is not valid YAML, or does not hold a mapping.
    """
    path = Path(yaml_path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist; {_nearest_recipes(path)}pass the path of a YAML recipe")
    try:
        loaded = _yaml_load(path.read_text())
    except yaml.YAMLError as exc:
        where = ""
        if getattr(exc, "problem_mark", None) is not None:
            where = f" at line {exc.problem_mark.line + 1}"
        problem = getattr(exc, "problem", exc)
        raise ConfigError(f"config file '{path}' is not valid YAML{where}: {problem}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of keys to values, got {_show(loaded)}")
    return loaded or {}


def _nearest_recipes(path: Path) -> str:
    """"did you mean A, B? " naming the YAML files whose names are nearest a missing recipe's (in its folder, or in
    the folder whose name is nearest its folder's: `recipe/` for `recipes/`), or "" when none is near."""
    try:
        folder = path.parent
        if not folder.is_dir():
            parent = folder.parent
            near = difflib.get_close_matches(folder.name, [p.name for p in parent.iterdir() if p.is_dir()], n=1)
            if not near:
                return ""
            folder = parent / near[0]
        names = [p.name for p in folder.iterdir() if p.suffix in (".yaml", ".yml")]
    except OSError:  # a folder that cannot be listed: no suggestion, the message stands
        return ""
    near = difflib.get_close_matches(path.name, names, n=3)
    return f"did you mean {', '.join(str(folder / name) for name in near)}? " if near else ""


def recipe_command(yaml_path: str | Path) -> str | None:
    """The command a recipe names in its `command:` key, or None (no key, or not a readable recipe)."""
    try:
        named = read_recipe(yaml_path).get(COMMAND_KEY)
    except ConfigError:
        return None
    return named if isinstance(named, str) else None


def load_config(
    cls: type[T], yaml_path: str | Path | None, overrides: Sequence[str] = (), *, command: str | None = None
) -> T:
    """Read `yaml_path` (optional), apply `a.b.c=value` overrides on top, and build `cls`.

    The YAML's top level maps straight onto the fields of `cls`, except the recipe's `command:` key, which is
    checked against `command` (when given) and not passed on; an empty file means all defaults. Renamed keys are
    read under their new names in the recipe and in the overrides separately, before the overrides apply, so an
    override under a key's new name replaces the recipe's value under the old one.

    Raises:
        ConfigError: the file is missing or is not valid YAML, it is a recipe for another command, an override is
            malformed, or `from_dict` fails.
    """
    data: dict[str, Any] = {}
    named = None
    if yaml_path is not None:
        data = dict(read_recipe(yaml_path))
        named = data.pop(COMMAND_KEY, None)
        data, moved = upgrade_keys(cls, data)
        _warn_renamed(moved, str(yaml_path))
    given, moved = upgrade_keys(cls, parse_overrides(overrides, cls))
    _warn_renamed(moved, "override")
    data = _deep_merge(data, given)
    if named is None or command is None or named == command:
        return from_dict(cls, data)
    # A recipe written for another command is used when its settings fit this command's config too (an SFT
    # recipe is a valid continued pre-training recipe); otherwise the recipe's own command is the likely intent.
    try:
        return from_dict(cls, data)
    except ConfigError as e:
        raise ConfigError(
            f"'{yaml_path}' is a recipe for `tempax {named}` (its {COMMAND_KEY}: key), not `tempax {command}` "
            f"({e}); run: tempax {named} --config {yaml_path}"
        ) from None


def with_overrides(cfg: T, overrides: Sequence[str], *, where: str = "") -> T:
    """A copy of the config `cfg` with `a.b=value` overrides applied (parsed and checked as `load_config` does);
    `where` names the overrides' origin in an error (e.g. "after_sft_overrides")."""
    try:
        given, moved = upgrade_keys(type(cfg), parse_overrides(overrides, type(cfg)))
        _warn_renamed(moved, where or "override")
        return from_dict(type(cfg), _deep_merge(to_dict(cfg), given))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}" if where else str(e)) from None


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


def dump_yaml(cfg: Any, *, command: str | None = None) -> str:
    """The config as YAML text that `load_config` reads back to an equal config; with `command`, a recipe that
    names it in its first key."""
    data = to_dict(cfg)
    if command is not None:
        data = {COMMAND_KEY: command, **data}
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


# --------------------------------------------------------------------------------------------------------------
# describe


def describe(cls: type) -> str:
    """Every dotted key of `cls` with its type, default and help text, one block per key."""
    lines: list[str] = []
    _describe_into(cls, "", lines)
    return "\n".join(lines)


def _describe_into(cls: type, path: str, lines: list[str]) -> None:
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key, tp = _key(path, f.name), hints[f.name]
        help_text = f.metadata.get("help", "")
        sub = _dataclass_arm(tp)
        default = _default_of(f)
        if sub is not None:
            # A nested section: its own fields carry the values; an optional one also shows it defaults to null.
            shown = "= null" if default is None and tp is not sub else ""
            lines.append(f"{key}: {_type_name(tp)} {shown}".rstrip())
            if help_text:
                lines.append(f"    {help_text}")
            _describe_into(sub, key, lines)
            continue
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            shown = "(required)"
        else:
            shown = "= " + _yaml_inline(to_dict(default))
        lines.append(f"{key}: {_type_name(tp)} {shown}")
        if help_text:
            lines.append(f"    {help_text}")


def _yaml_inline(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 30).strip().removesuffix("...").strip()


def help_field(text: str, default: Any = None, **kw: Any) -> Any:
    """A dataclass field documented once: `help` metadata shown by `describe` and `tempax validate`.

    Pass `default_factory=` instead of a default for mutable or nested-dataclass defaults.
    """
    if "default_factory" in kw:
        return dataclasses.field(metadata={"help": text}, **kw)
    return dataclasses.field(default=default, metadata={"help": text})


def import_callable(ref: str, *, key: str) -> Any:
    """The object a config names as `package.module:name` or `path/to/file.py:name`.

    A `.py` path is read relative to the working directory (a user's own file beside their recipe needs no
    package); a dotted module is imported as usual, with the working directory on the search path as a script's
    would be, so `my_rewards:exact` finds `./my_rewards.py` under the `tempax` command too. `__main__:name` is the
    running script's own function (`tempax.train` from Python). `key` is the config key, named in the error.
    """
    import importlib
    import importlib.util
    import os
    import sys

    module_ref, sep, name = ref.rpartition(":")
    if not sep or not module_ref or not name:
        raise ConfigError(f"{key}: {ref!r} is not 'package.module:name' or 'file.py:name'")
    try:
        if module_ref.endswith(".py"):
            path = os.path.abspath(module_ref)
            if not os.path.isfile(path):
                raise ConfigError(f"{key}: {ref!r}: no file {module_ref} (relative to {os.getcwd()})")
            module_name = "tempax_user_" + re.sub(r"\W", "_", os.path.splitext(os.path.relpath(path))[0])
            module = sys.modules.get(module_name)
            if module is None or getattr(module, "__file__", None) != path:
                spec = importlib.util.spec_from_file_location(module_name, path)
                module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
                sys.modules[module_name] = module  # pickle-by-reference and dataclasses need it registered
                spec.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.append(os.getcwd())
            module = importlib.import_module(module_ref)
    except ConfigError:
        raise
    except Exception as e:  # a user's module failing at import: name it with the error, not a traceback
        raise ConfigError(f"{key}: cannot import {ref!r} ({type(e).__name__}: {e})") from None
    try:
        return getattr(module, name)
    except AttributeError:
        found = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise ConfigError(f"{key}: {module_ref!r} has no {name!r}"
                          + (f"; it defines {', '.join(found[:8])}" if found else "")) from None
