"""Recipes: a YAML file whose top level maps onto a command's config class, with `a.b=value` overrides on top and
a `command:` key naming the command that runs it; and a config written back out as a recipe."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tempax.configlib.build import deep_merge, from_dict, to_dict
from tempax.configlib.fields import show_value
from tempax.configlib.overrides import parse_overrides
from tempax.configlib.renames import upgrade_keys, warn_renamed
from tempax.configlib.suggest import nearest_recipes
from tempax.configlib.yaml_text import dump_yaml_text, load_yaml_text
from tempax.errors import ConfigError

T = TypeVar("T")

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
        raise ConfigError(f"config file '{path}' does not exist; {nearest_recipes(path)}pass the path of a YAML recipe")
    try:
        loaded = load_yaml_text(path.read_text())
    except yaml.YAMLError as exc:
        where = ""
        if getattr(exc, "problem_mark", None) is not None:
            where = f" at line {exc.problem_mark.line + 1}"
        problem = getattr(exc, "problem", exc)
        raise ConfigError(f"config file '{path}' is not valid YAML{where}: {problem}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of keys to values, got {show_value(loaded)}")
    return loaded or {}


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
        warn_renamed(moved, str(yaml_path))
    given, moved = upgrade_keys(cls, parse_overrides(overrides, cls))
    warn_renamed(moved, "override")
    data = deep_merge(data, given)
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
        warn_renamed(moved, where or "override")
        return from_dict(type(cfg), deep_merge(to_dict(cfg), given))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}" if where else str(e)) from None


def dump_yaml(cfg: Any, *, command: str | None = None) -> str:
    """The config as YAML text that `load_config` reads back to an equal config; with `command`, a recipe that
    names it in its first key."""
    data = to_dict(cfg)
    if command is not None:
        data = {COMMAND_KEY: command, **data}
    return dump_yaml_text(data)
