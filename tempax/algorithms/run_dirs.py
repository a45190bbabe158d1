"""A training run's directory read through the registry: the command that made it and the model it holds.

`start_run` writes a run's command into its config.yaml as a recipe names it (`command: grpo`), so
`tempax grpo --config RUN_DIR/config.yaml` continues the run and every reader knows what it is. The command's record
says where its runs keep the trained model (`Algorithm.model`); `tempax.train.run_model` loads it, told by
`describe` here, since the training core names no algorithm. The commands and the layers above call these:
`load_source`, `load_run`, `shape_source`.

A run saved before config.yaml named its command is recognised here, in this one place (`infer_command`): the
command whose config class has every section of the run's config, preferring a class that reads it back unchanged,
then the one closest to it in shape (fewest sections the run lacks), then the one sharing most of its class's
default values (sft and pretrain have one shape and differ in defaults).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from tempax.algorithms.registry import algorithms, get
from tempax.configlib import COMMAND_KEY, from_dict, to_dict, upgrade_keys
from tempax.errors import ConfigError, TempaxError

if TYPE_CHECKING:
    from tempax.train.run_model import RunKind, TrainedModel

# The training layer (JAX, Orbax) is imported in the functions that load a run: naming a run's command, as the
# model card does, stays light.

__all__ = ["config_command", "describe", "infer_command", "load_run", "load_source", "shape_source"]


def config_command(raw: dict[str, Any]) -> str | None:
    """The command a run's config (its config.yaml as a dict) names in its `command:` key, else the one inferred
    for a run saved before the key (`infer_command`; None when no command's config fits)."""
    named = raw.get(COMMAND_KEY)
    return named if isinstance(named, str) else infer_command(raw)


def infer_command(raw: dict[str, Any]) -> str | None:
    """The training command whose config a run's config (without a `command:` key) is a dump of, by the rule of
    the module docstring; None when no command's config class has all of its sections."""
    sections = set(raw) - {COMMAND_KEY}
    scored = []
    for command, algorithm in algorithms().items():
        try:
            cls = algorithm.config_class()
            current, _ = upgrade_keys(cls, {k: v for k, v in raw.items() if k != COMMAND_KEY})
        except TempaxError:  # a plugin's record that does not import here, or a config it cannot read
            continue
        fields = {f.name for f in dataclasses.fields(cls)}
        if not set(current) <= fields:
            continue
        scored.append((_reads_back(cls, current), -len(fields - sections), _shared_leaves(to_dict(cls()), current),
                       -len(scored), command))
    return max(scored)[-1] if scored else None


def _reads_back(cls: type, data: dict[str, Any]) -> bool:
    try:
        return to_dict(from_dict(cls, data)) == data
    except Exception:  # noqa: BLE001 - any refusal means "not exactly this class"
        return False


def _shared_leaves(a: Any, b: Any) -> int:
    if isinstance(a, dict) and isinstance(b, dict):
        return sum(_shared_leaves(a[k], b[k]) for k in a.keys() & b.keys())
    return int(a == b)


def describe(run_dir: str) -> RunKind:
    """The command that made the run in `run_dir` and where its record says such a run keeps its model.

    Raises:
      ConfigError: its config.yaml names a command not known here, or (an older run) fits no command's config.
    """
    from tempax.models.registry import RUN_CONFIG_FILE
    from tempax.train.run_model import RunKind, run_config

    raw = run_config(run_dir)
    command = config_command(raw)
    path = os.path.join(run_dir, RUN_CONFIG_FILE)
    if command is None:
        raise ConfigError(f"{path} names no command (`{COMMAND_KEY}:`) and no training command's config has its "
                          f"sections ({', '.join(sorted(raw))}); add a line `{COMMAND_KEY}: <the command that "
                          "trained it>` at its top")
    if command not in algorithms():
        raise ConfigError(f"{path} is a run of `tempax {command}`, which is not a training command here; "
                          f"available: {', '.join(sorted(algorithms()))}")
    return RunKind(command, get(command).model)


def load_source(source: str | os.PathLike, **options: Any) -> tuple[Any, Any]:
    """`tempax.train.run_model.load_source` with this module's `describe` (the same keyword options)."""
    from tempax.train import run_model

    return run_model.load_source(source, describe=describe, **options)


def load_run(run_dir: str, **options: Any) -> TrainedModel:
    """`tempax.train.run_model.load_run` with this module's `describe` (the same keyword options)."""
    from tempax.train import run_model

    return run_model.load_run(run_dir, describe=describe, **options)


def shape_source(run_dir: str) -> tuple[str, dict[str, Any]]:
    """`tempax.train.run_model.shape_source` with this module's `describe`."""
    from tempax.train import run_model

    return run_model.shape_source(run_dir, describe=describe)
