"""Typed configs: frozen dataclasses read from YAML recipes and `a.b.c=value` overrides.

Every recipe and command describes its settings as a frozen dataclass whose fields are documented once
(`help_field`). `load_config` / `from_dict` check every value at parse time and name the dotted key of a typo or
a wrong type; `validate(self)` on a dataclass runs right after it is built; a renamed key is read under its new
name with one warning (`RENAMED_KEYS`). Configs are parsed once and never mutated.

The parts: `yaml_text` (YAML 1.2 floats), `fields` (annotations, defaults, help), `renames`, `build`
(`from_dict` / `to_dict`), `suggest` ("did you mean"), `overrides`, `recipes` (`load_config`, `dump_yaml`),
`help_text` (`describe`) and `callables` (`import_callable`).
"""

from tempax.configlib.build import from_dict, to_dict
from tempax.configlib.callables import import_callable
from tempax.configlib.fields import help_field
from tempax.configlib.help_text import describe
from tempax.configlib.overrides import parse_overrides
from tempax.configlib.recipes import COMMAND_KEY, dump_yaml, load_config, read_recipe, recipe_command, with_overrides
from tempax.configlib.renames import RENAMED_KEYS, renamed_keys, upgrade_keys
from tempax.configlib.yaml_text import read_yaml
from tempax.errors import ConfigError

__all__ = ["COMMAND_KEY", "ConfigError", "RENAMED_KEYS", "describe", "dump_yaml", "from_dict", "help_field",
           "import_callable", "load_config", "parse_overrides", "read_recipe", "read_yaml", "recipe_command",
           "renamed_keys", "to_dict", "upgrade_keys", "with_overrides"]
