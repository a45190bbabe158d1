"""`tempax COMMAND --config RECIPE.yaml key=value ...`: train from a recipe, for every training command.

Each training command is an `Algorithm` record of `tempax.algorithms.registry` (`tempax --help` lists them). This
file only parses arguments: the YAML recipe, then `a.b=value` overrides on top (typed and checked by
`tempax.configlib`), then calls `main`, whose `RunResult` gives the last line and the exit status.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from tempax.algorithms.registry import get, load_recipe, recipes_for, resolve
from tempax.configlib import describe, dump_yaml
from tempax.errors import ConfigError

if TYPE_CHECKING:
    from tempax.train.loop import TrainResult

# Modules that load JAX are imported in the functions using them: `tempax COMMAND --help` stays light.

# Exit status of a run that a hook stopped before train.steps (`tempax.train.hooks.Stop`; the reason is in
# <run_dir>/metrics.jsonl as `stop_reason` and in <run_dir>/summary.json; a checkpoint of that step is saved).
STOPPED_EXIT_STATUS = 3


def defaults_summary(command: str, cfg: Any) -> str:
    """One line of what a config trains: its models (the record's `models` sections), full or LoRA,
    steps x batch x seq_len, data, run dir."""
    t = cfg.train
    model = ", ".join(f"{section} {getattr(cfg, section).source}" for section in get(command).models)
    parts = [model, "full fine-tuning" if getattr(cfg, "lora", None) is None else "LoRA",
             f"{t.steps} steps of {t.batch_size} x {t.seq_len} tokens"]
    data = getattr(getattr(cfg, "data", None), "path", None) or getattr(getattr(cfg, "task", None), "name", None)
    if data:
        parts.append(f"data {data}")
    parts.append(f"run_dir {t.run_dir}")
    return ", ".join(parts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", metavar="RECIPE",
                        help="YAML recipe (see recipes/); omitted: the defaults, which need at least one KEY=VALUE")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="override recipe values, e.g. train.steps=20 train.optimizer.learning_rate=1e-4")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    parser.add_argument("--describe", action="store_true", help="list every config key with its type and help")


def run(args: argparse.Namespace) -> int:
    command = args._command
    if args.describe:
        print(describe(resolve(command)[0]))
        return 0
    if args.config is None and not args.overrides and not args.print_config:
        raise ConfigError(
            f"tempax {command} needs a recipe: --config RECIPE ({', '.join(recipes_for(command)) or 'see recipes/'}). "
            f"Without one every key keeps its default ({defaults_summary(command, load_recipe(command))}); to train "
            f"on those, say so with at least one override, e.g. tempax {command} train.run_dir=runs/{command}-defaults"
        )
    cfg = load_recipe(command, args.config, list(args.overrides))
    if args.config is None and not args.print_config:
        print(f"tempax {command}: no --config; every key not overridden keeps its default: "
              f"{defaults_summary(command, cfg)}", file=sys.stderr)
    if args.print_config:
        sys.stdout.write(dump_yaml(cfg, command=command))
        return 0
    _, main = resolve(command)
    from tempax.algorithms.run import hold_run
    from tempax.train.run_identity import clean_failed_start

    with clean_failed_start(cfg.train.run_dir):  # a start that fails before training leaves no run dir behind
        with hold_run(cfg):  # one run per run dir, taken before anything is loaded
            outcome = main(cfg)
    from tempax.parallel.process import is_writer

    if is_writer():
        print(done_line(cfg, outcome), file=sys.stderr)
    if outcome.stop_reason is not None:
        print(f"tempax {command}: stopped early: {outcome.stop_reason}", file=sys.stderr)
        return STOPPED_EXIT_STATUS
    return 0


def done_line(cfg: Any, result: TrainResult) -> str:
    """The last line of every training command, the same for all: the step reached, its loss, the run dir
    (`result`: what every `main` returns, a `tempax.algorithms.run.RunResult`)."""
    run_dir, history = cfg.train.run_dir, result.history
    if history:
        step, metrics = history[-1]
        loss = metrics.get("loss")
        head = f"done: step {step}" + (f", loss {loss:.4f}" if loss is not None else "")
    elif result.resumed_from >= cfg.train.steps:
        head = f"done: nothing to train, the run was at step {result.resumed_from} of {cfg.train.steps} already"
    else:
        head = f"done: step {cfg.train.steps}"
    return f"{head}; run dir {run_dir} (curves: tempax plot {run_dir})"
