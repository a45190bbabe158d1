"""`import_callable`: the function a config names as `package.module:name` or `path/to/file.py:name` (a reward
function, a user's environment), with an error naming the config key when it cannot be found."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from typing import Any

from tempax.errors import ConfigError


def import_callable(ref: str, *, key: str) -> Any:
    """The object a config names as `package.module:name` or `path/to/file.py:name`.

    A `.py` path is read relative to the working directory (a user's own file beside their recipe needs no
    package); a dotted module is imported as usual, with the working directory on the search path as a script's
    would be, so `my_rewards:exact` finds `./my_rewards.py` under the `tempax` command too. `__main__:name` is the
    running script's own function (`tempax.train` from Python). `key` is the config key, named in the error.
    """
    module_ref, sep, name = ref.rpartition(":")
    if not sep or not module_ref or not name:
        raise ConfigError(f"{key}: {ref!r} is not 'package.module:name' or 'file.py:name'")
    try:
        module = _import_file(module_ref, key, ref) if module_ref.endswith(".py") else _import_module(module_ref)
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


def _import_file(module_ref: str, key: str, ref: str) -> Any:
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
    return module


def _import_module(module_ref: str) -> Any:
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    return importlib.import_module(module_ref)
