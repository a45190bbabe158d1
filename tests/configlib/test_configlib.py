"""tempax.configlib (the package): every public name importable from `tempax.configlib` as the callers import
it, each the same object as in the part that defines it."""

from __future__ import annotations

import importlib

import tempax.configlib as configlib
from tempax.errors import ConfigError, TempaxError

PARTS = ("yaml_text", "fields", "renames", "build", "suggest", "overrides", "recipes", "help_text", "callables")


def test_every_public_name_is_the_one_its_part_defines():
    defined = {}
    for part in PARTS:
        module = importlib.import_module(f"tempax.configlib.{part}")
        defined.update({name: getattr(module, name) for name in vars(module) if not name.startswith("_")})
    for name in configlib.__all__:
        value = getattr(configlib, name)
        assert name == "ConfigError" or defined.get(name) is value, name
    assert {"load_config", "from_dict", "to_dict", "dump_yaml", "help_field", "describe"} <= set(configlib.__all__)


def test_config_error_is_a_tempax_error():
    assert configlib.ConfigError is ConfigError and issubclass(ConfigError, TempaxError)
