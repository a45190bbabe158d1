"""Renamed recipe keys: a config class lists its old keys in `RENAMED_KEYS`, and old recipes, `a.b=value`
overrides and the `config.yaml` of old runs are read under the new names, with one warning line per old key."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tempax.configlib.fields import dataclass_arm, dotted_key, field_types, show_value
from tempax.errors import ConfigError

_log = logging.getLogger(__name__)

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
            old_key, new_key = dotted_key(path, old), dotted_key(path, new)
            raise ConfigError(f"config keys '{old_key}' and '{new_key}' are both given, and '{old_key}' is the old "
                              f"name of '{new_key}'; keep only '{new_key}'")
        _put_dotted(out, new, value, path)
        moved.append((dotted_key(path, old), dotted_key(path, new)))
    hints = field_types(cls)
    for f in dataclasses.fields(cls):
        if f.init and f.name in out:
            sub = dataclass_arm(hints[f.name])
            if sub is not None:
                out[f.name], inner = upgrade_keys(sub, out[f.name], path=dotted_key(path, f.name))
                moved.extend(inner)
    return out, moved


def warn_renamed(moved: Sequence[tuple[str, str]], where: str = "") -> None:
    """One warning line per (old, new) key that `upgrade_keys` moved; `where` names their origin (a file)."""
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
            raise ConfigError(f"config key '{dotted_key(path, '.'.join(parents[: i + 1]))}' must be a mapping (it "
                              f"holds '{dotted_key(path, dotted)}'), got {show_value(child)}")
        node = child
    node[leaf] = value
