"""`tempax validate RECIPE [key=value ...] [--command C]`: parse a recipe, build its config and report problems,
training nothing.

The checks are `tempax.algorithms.validate.check_recipe`; this module parses arguments and prints.
"""

from __future__ import annotations

import argparse

from tempax.algorithms.validate import check_recipe
from tempax.configlib import COMMAND_KEY


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
