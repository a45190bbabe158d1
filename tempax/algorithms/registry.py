"""The training commands: command name -> (module, config class name, main function name).

Modules are imported only when a command runs (`resolve`), so listing the commands imports neither JAX nor an
algorithm. An algorithm's module exposes a frozen config dataclass (with a `train: TrainConfig` field) and
`main(config)`; `tempax <command>` (`tempax.cli.train_cmds`), `tempax validate` and the recommend command read
this table.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from tempax.errors import ConfigError

ALGORITHMS: dict[str, tuple[str, str, str]] = {
    "sft": ("tempax.algorithms.sft.trainer", "SFTConfig", "main"),
    "pretrain": ("tempax.algorithms.sft.trainer", "PretrainConfig", "main"),
    "dpo": ("tempax.algorithms.preference.trainer", "DPOConfig", "main"),
    "kto": ("tempax.algorithms.preference.kto", "KTOConfig", "main"),
    "reward-model": ("tempax.algorithms.preference.reward_trainer", "RewardModelConfig", "main"),
    "grpo": ("tempax.algorithms.grpo.trainer", "GRPOConfig", "main"),
    "ppo": ("tempax.algorithms.ppo.trainer", "PPOConfig", "main"),
    "distill": ("tempax.algorithms.distill.trainer", "DistillConfig", "main"),
}


def resolve(command: str) -> tuple[type, Callable[[Any], Any]]:
    """(config class, main function) of a training command."""
    if command not in ALGORITHMS:
        raise ConfigError(f"'{command}' is not a training command here; available: {', '.join(sorted(ALGORITHMS))}")
    module_name, cls_name, main_name = ALGORITHMS[command]
    module = importlib.import_module(module_name)
    return getattr(module, cls_name), getattr(module, main_name)
