"""`tempax validate RECIPE [key=value ...] [--command C] [--memory-gib N]`: parse a recipe, build its config and
report problems, training nothing; with `--memory-gib`, also the memory plan for a device of N GiB (which
`train.memory` setting a run would take, and whether and how it fits), without loading a weight or compiling.

The checks are `tempax.algorithms.validate.check_recipe`, the plan `tempax.algorithms.recipe_memory`; this module
parses arguments and prints. A plan that does not fit is a problem a run would refuse: exit status 2.
"""

from __future__ import annotations

import argparse

from tempax.algorithms.validate import check_recipe
from tempax.configlib import COMMAND_KEY
from tempax.errors import ConfigError

GiB = 2**30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", metavar="RECIPE", help="YAML recipe to check")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides to check along with it")
    # dest must not be "command": the top-level parser keeps the sub-command's name there.
    parser.add_argument("--command", dest="recipe_command",
                        help=f"training command of the recipe (default: its `{COMMAND_KEY}:` key)")
    parser.add_argument("--memory-gib", type=float, metavar="N",
                        help="also print the memory plan for one device of N GiB (e.g. 15.75 for a TPU v5e chip's "
                             "usable memory) and say whether and how the step fits; no weight is loaded, nothing "
                             "is compiled")
    parser.add_argument("--backend", choices=("cpu", "tpu", "gpu"),
                        help="whose ops size the activations in that plan (default: this machine's)")


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
    if args.memory_gib is None:
        return 0
    if args.memory_gib <= 0:
        raise ConfigError(f"--memory-gib must be a positive number of GiB, got {args.memory_gib:g}")
    from tempax.algorithms.recipe_memory import recipe_memory  # loads JAX and the model code: only when asked

    report = recipe_memory(cfg, command, int(args.memory_gib * GiB), backend=args.backend)
    print("\n".join(report.lines()))
    return 0 if report.fits else 2
