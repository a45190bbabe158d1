"""`tempax sft|pretrain|dpo|reward-model|grpo|distill --config RECIPE.yaml key=value ...`: train from a recipe.

Each training command is one row of `ALGORITHMS`: the command name -> (module, config class, main function).
An algorithm plugs in by adding its row; its module exposes a frozen config dataclass (with a `train:
TrainConfig` field) and `main(config)`. This file only parses arguments: the YAML recipe, then `a.b=value`
overrides on top (typed and checked by `tempax.configlib`), then calls `main`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any, Callable

# Exit status of a run that a hook stopped before train.steps (`tempax.train.hooks.Stop`; the reason is in
# <run_dir>/metrics.jsonl as `stop_reason` and in <run_dir>/summary.json; a checkpoint of that step is saved).
STOPPED_EXIT_STATUS = 3

# command -> (module, config class name, main function name). Modules are imported only when the command runs.
ALGORITHMS: dict[str, tuple[str, str, str]] = {
    "sft": ("tempax.algorithms.sft.trainer", "SFTConfig", "main"),
    "pretrain": ("tempax.algorithms.sft.trainer", "PretrainConfig", "main"),
    "dpo": ("tempax.algorithms.preference.trainer", "DPOConfig", "main"),
    "reward-model": ("tempax.algorithms.preference.reward_trainer", "RewardModelConfig", "main"),
    "grpo": ("tempax.algorithms.grpo.trainer", "GRPOConfig", "main"),
    "distill": ("tempax.algorithms.distill.trainer", "DistillConfig", "main"),
}


def resolve(command: str) -> tuple[type, Callable[[Any], Any]]:
    """(config class, main function) of a training command."""
    from tempax.errors import ConfigError

    if command not in ALGORITHMS:
        raise ConfigError(f"'{command}' is not a training command here; available: {', '.join(sorted(ALGORITHMS))}")
    module_name, cls_name, main_name = ALGORITHMS[command]
    module = importlib.import_module(module_name)
    return getattr(module, cls_name), getattr(module, main_name)


def load(command: str, config: str | None, overrides: list[str]) -> Any:
    """The typed config of `command` from a recipe file plus overrides."""
    from tempax.configlib import load_config

    cls, _ = resolve(command)
    return load_config(cls, config, overrides)


def add_arguments(parser: argparse.ArgumentParser, name: str = "sft") -> None:
    parser.add_argument("--config", "-c", metavar="RECIPE", help="YAML recipe (see recipes/); omitted: all defaults")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="override recipe values, e.g. train.steps=20 train.optimizer.learning_rate=1e-4")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    parser.add_argument("--describe", action="store_true", help="list every config key with its type and help")


def run(args: argparse.Namespace) -> int:
    command = args._command
    if args.describe:
        from tempax.configlib import describe

        print(describe(resolve(command)[0]))
        return 0
    cfg = load(command, args.config, list(args.overrides))
    if args.print_config:
        from tempax.configlib import dump_yaml

        sys.stdout.write(dump_yaml(cfg))
        return 0
    _, main = resolve(command)
    reason = stop_reason(main(cfg))
    if reason is not None:
        print(f"tempax {command}: stopped early: {reason}", file=sys.stderr)
        return STOPPED_EXIT_STATUS
    return 0


def stop_reason(result: Any) -> str | None:
    """Why a hook stopped the run that `main` returned (a `TrainResult`, or a run holding one as `.result`)."""
    train_result = getattr(result, "result", result)
    return getattr(train_result, "stop_reason", None)
