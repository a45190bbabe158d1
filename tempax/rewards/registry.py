"""The reward registry: the names a recipe's `rewards.functions` may use and the combined reward they build.

    format, correctness     the built-in text rewards (`tempax.rewards.formatting`, `.correctness`)
    code_tests              the share of a code task row's hidden tests passed, run in the sandbox
                            (`tempax.rewards.code`; `rewards.code` sets all-or-nothing and the sandbox's limits)
    length                  characters / 100, for benchmarks only
    model:RUN_DIR           the score of a trained reward model (`tempax.rewards.reward_model.RewardScorer`)
    package.module:function any importable `fn(prompts, completions, **columns) -> list[float]`

GRPO and PPO read their rewards through `build_rewards`, so both accept the same names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tempax.configlib import help_field, import_callable
from tempax.errors import ConfigError
from tempax.models.reward_model import reward_model_folder
from tempax.rewards.code import CodeRewardConfig, CodeTestsReward
from tempax.rewards.combine import combine_rewards, safe_reward
from tempax.rewards.correctness import answer_correctness_reward
from tempax.rewards.formatting import format_reward
from tempax.rewards.reward_model import reward_model_reward


@dataclass(frozen=True)
class RewardsConfig:
    """Reward functions, summed with weights. Names: format, correctness, length (bench), or module:function."""

    functions: tuple[str, ...] = help_field(
        "Reward functions: 'format' (strict <reasoning>/<answer> form, partial credit per tag), 'correctness' "
        "(the <answer> equals the reference), 'code_tests' (the share of a code task row's hidden tests the "
        "program passes, run in the sandbox: rewards.code), 'length' (characters / 100, for benchmarks), "
        "'model:RUN_DIR' (the "
        "score of a trained reward model: a `tempax reward-model` run dir or its reward_model folder) or a "
        "'package.module:function' or 'file.py:function' taking (prompts, completions, **columns).",
        ("format", "correctness"),
    )
    weights: tuple[float, ...] | None = help_field("One weight per function; null: all 1.", None)
    code: CodeRewardConfig = help_field("The code_tests reward: all-or-nothing or a share, and the sandbox's limits.",
                                        default_factory=CodeRewardConfig)
    timeout_s: float = help_field(
        "Deadline in seconds: the built-in rewards check each completion in a worker process, and one running "
        "longer scores 0 alone (counted as reward/<name>_timeouts); other reward functions get it per call.", 5.0)

    def validate(self) -> None:
        if self.weights is not None and len(self.weights) != len(self.functions):
            raise ConfigError(
                f"rewards.weights has {len(self.weights)} entries for {len(self.functions)} functions"
            )


def length_reward(prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
    """Characters / 100: the benchmark's trivial reward (bench/grpo_step.py); not a training objective."""
    del prompts, columns
    return [len(c) / 100.0 for c in completions]


def builtin_rewards() -> dict[str, Callable[..., Any]]:
    """The built-in names; `code_tests` maps to its class, which `build_rewards` builds with `rewards.code`."""
    return {"format": format_reward, "correctness": answer_correctness_reward, "length": length_reward,
            "code_tests": CodeTestsReward}


REWARD_MODEL_PREFIX = "model:"


def reward_model_function(path: str) -> Any:
    """The `RewardScorer` of a saved reward model: its folder, or the `tempax reward-model` run dir holding it."""
    return reward_model_reward(reward_model_folder(path))


def build_rewards(spec: RewardsConfig) -> Any:
    """A `CombinedReward` of the named functions (built-in names, 'model:RUN_DIR' for a trained reward model's
    score, or 'package.module:function')."""
    if not spec.functions:
        raise ConfigError("rewards.functions is empty; name at least one, e.g. [format, correctness] (a run whose "
                          "environment gives every reward may leave it empty)")
    builtins = builtin_rewards()
    named: dict[str, Callable[..., Any]] = {}
    for name in spec.functions:
        if name == "code_tests":
            # Built with its config; no timeout around the batch: the sandbox bounds each program by its own deadline.
            named[name] = safe_reward(CodeTestsReward(spec.code), name=name, timeout_s=None)
            continue
        if name in builtins:
            named[name] = builtins[name]
            continue
        if name.startswith(REWARD_MODEL_PREFIX):
            # No timeout: the first call of each padded length compiles the reward model.
            named["reward_model"] = safe_reward(reward_model_function(name[len(REWARD_MODEL_PREFIX):]),
                                                name="reward_model", timeout_s=None)
            continue
        if ":" not in name:
            raise ConfigError(
                f"rewards.functions: unknown reward {name!r}; use one of {sorted(builtins)} or 'package.module:function'"
            )
        fn = import_callable(name, key="rewards.functions")
        fn_name = name.rpartition(":")[2]
        named[fn_name.removesuffix("_reward") or fn_name] = fn
    return combine_rewards(named, spec.weights, timeout_s=spec.timeout_s)
