"""`tempax validate RECIPE [key=value ...]`: parse a recipe, build its config and report problems, training nothing.

The training command is read from the recipe's `command:` key (`tempax.configlib.recipe_command`), or given with
`--command`. Checks: the YAML parses; every key exists and has the right type (unknown keys name their nearest
neighbours); cross-field rules; the optimizer builds; the dataset path exists; the model source resolves (nothing
is downloaded or loaded).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from tempax.algorithms.registry import algorithms
from tempax.cli.train_cmds import load
from tempax.configlib import COMMAND_KEY, recipe_command
from tempax.errors import ConfigError, TempaxError


def check_recipe(path: str, overrides: list[str] | None = None, command: str | None = None) -> tuple[str, Any, list[str]]:
    """(command, config, warnings). Raises `TempaxError` for problems that stop a run."""
    if not os.path.isfile(path):
        raise ConfigError(f"recipe '{path}' does not exist")
    command = command or recipe_command(path)
    if command is None:
        raise ConfigError(
            f"{path}: cannot tell which command runs this recipe; name it in a top-level key like "
            f"'{COMMAND_KEY}: sft' or pass --command ({', '.join(sorted(algorithms()))})"
        )
    cfg = load(command, path, list(overrides or []))
    warnings: list[str] = []
    train = getattr(cfg, "train", None)
    if train is not None:
        train.optimizer.build(train.steps)
        warnings += train.warnings()
    data = getattr(cfg, "data", None)
    data_path = getattr(data, "path", None)
    if isinstance(data_path, str) and not os.path.exists(os.path.expanduser(data_path)):
        looks_local = data_path.startswith((".", "/", "~")) or data_path.count("/") > 1 or data_path.endswith(
            (".jsonl", ".json", ".parquet", ".gz"))
        if looks_local:
            raise ConfigError(f"data.path: dataset file not found: {data_path} (relative to {os.getcwd()})")
        warnings.append(f"data.path {data_path!r} is not local; it will be read from the Hugging Face Hub")
    for section in ("model", "teacher", "student"):  # distillation names two models
        model = getattr(cfg, section, None)
        for key in ("source", "tokenizer"):
            source = getattr(model, key, None)
            if isinstance(source, str) and not (section == "student" and source == "teacher"):
                from tempax.models.registry import resolve_source

                try:
                    resolved = resolve_source(source)
                except TempaxError as e:
                    raise ConfigError(f"{section}.{key}: {e}") from None
                if resolved.kind == "hub":
                    warnings.append(f"{section}.{key} {source!r} is a Hub repo; it needs network on first use")
    return command, cfg, warnings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", metavar="RECIPE", help="YAML recipe to check")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides to check along with it")
    # dest must not be "command": the top-level parser keeps the sub-command's name there.
    parser.add_argument("--command", dest="recipe_command",
                        help=f"training command of the recipe (default: its `{COMMAND_KEY}:` key)")


def run(args: argparse.Namespace) -> int:
    command, cfg, warnings = check_recipe(args.recipe, list(args.overrides), args.recipe_command)
    for w in warnings:
        print(f"warning: {w}")
    train = getattr(cfg, "train", None)
    summary = ""
    if train is not None:
        summary = (f": {train.steps} steps, batch {train.batch_size} x {train.seq_len} tokens, "
                   f"lr {train.optimizer.learning_rate:g} ({train.optimizer.schedule}), run_dir {train.run_dir}")
    print(f"ok: {args.recipe} is a valid `tempax {command}` recipe{summary}")
    return 0
