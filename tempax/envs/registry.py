"""Which environment a run's episodes play (`EnvironmentSpec`), reachable from a recipe's `env:` block.

    env: {name: single_turn}                                  # the task's prompt, one reply (the default)
    env: {name: calculator, max_turns: 3, max_episode_tokens: 256}
    env: {name: "examples/guess_number_env.py:GuessNumberEnvironment", max_turns: 4,
          options: {wrong_guess_penalty: 0.1}}

A user environment is named `FILE.py:Class` (a path relative to the working directory) or `package.module:Class`;
it is built as `Class(**options)` once per episode, so it may keep the episode's state on itself. Built-in names:
`single_turn` (`SingleTurnEnvironment`) and `calculator` (`ToolEnvironment` with the exact calculator). Both
leave the final answer to the task's reward functions, which the rollout calls once for the whole batch.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from tempax.configlib import help_field
from tempax.envs.calculator import calculator_tool
from tempax.envs.environment import Environment, SingleTurnEnvironment, ToolEnvironment
from tempax.errors import ConfigError
from tempax.models.tokenizer import Tokenizer

BUILTIN_ENVIRONMENTS = ("single_turn", "calculator")
EnvFactory = Callable[[], Environment]


@dataclass(frozen=True)
class EnvironmentSpec:
    """The environment of a run and the bounds on its episodes."""

    name: str = help_field(
        "single_turn (one reply to the task's prompt), calculator (the policy may call an exact calculator in its "
        "chat template's tool-call format), or a user environment FILE.py:Class / package.module:Class.",
        "single_turn",
    )
    max_turns: int = help_field("Most assistant replies in an episode.", 1)
    max_episode_tokens: int | None = help_field(
        "Most tokens after the prompt (replies and environment messages; the batch's completion length); null: "
        "max_new_tokens x max_turns. An episode whose next turn would not fit ends before it (truncated).",
        None,
    )
    options: dict[str, Any] = help_field("Keyword arguments of a user environment's class.", default_factory=dict)

    def validate(self) -> None:
        if self.max_turns < 1:
            raise ConfigError(f"env.max_turns must be >= 1, got {self.max_turns}")
        if self.max_episode_tokens is not None and self.max_episode_tokens < 1:
            raise ConfigError(f"env.max_episode_tokens must be >= 1 or null, got {self.max_episode_tokens}")
        if self.name not in BUILTIN_ENVIRONMENTS and ":" not in self.name:
            raise ConfigError(f"env.name={self.name!r} is neither a built-in environment {BUILTIN_ENVIRONMENTS} "
                              "nor a user environment FILE.py:Class or package.module:Class")
        if self.options and self.name in BUILTIN_ENVIRONMENTS:
            raise ConfigError(f"env.options are for a user environment's class; {self.name} takes none")

    @property
    def single_turn(self) -> bool:
        return self.name == "single_turn"

    def episode_tokens(self, max_new_tokens: int, *, key: str = "max_new_tokens") -> int:
        """The completion length of a batch: the episode budget after the prompt. `key`: the full name of the
        algorithm's per-turn token limit (e.g. `grpo.max_new_tokens`), for the message when the budget is short."""
        budget = self.max_episode_tokens if self.max_episode_tokens is not None else max_new_tokens * self.max_turns
        if budget < max_new_tokens:
            raise ConfigError(f"env.max_episode_tokens={budget} is less than one turn's {key}={max_new_tokens}: "
                              f"raise env.max_episode_tokens or lower {key}")
        return budget

    def build(self, tokenizer: Tokenizer) -> EnvFactory:
        """A function that makes a fresh environment for one episode."""
        self.validate()
        if self.name == "single_turn":
            return lambda: SingleTurnEnvironment(tokenizer)
        if self.name == "calculator":
            tool = calculator_tool()
            return lambda: ToolEnvironment(tokenizer, None, [tool])
        cls = load_environment_class(self.name)
        options = dict(self.options)
        try:
            cls(**options)
        except TypeError as e:
            raise ConfigError(f"env.options do not fit {self.name}: {e}") from None
        return lambda: cls(**options)


def load_environment_class(name: str) -> type:
    """The class `FILE.py:Class` or `package.module:Class` names, checked to have `reset` and `step`."""
    where, _, attr = name.rpartition(":")
    if where.endswith(".py"):
        if not os.path.isfile(where):
            raise ConfigError(f"env.name={name!r}: no file {where!r} (paths are relative to the working directory)")
        spec = importlib.util.spec_from_file_location(f"tempax_user_env_{abs(hash(where))}", where)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise ConfigError(f"env.name={name!r}: cannot import {where!r} ({e})") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise ConfigError(f"env.name={name!r}: {where} defines no {attr!r}")
    if not (callable(getattr(cls, "reset", None)) and callable(getattr(cls, "step", None))):
        raise ConfigError(f"env.name={name!r}: {attr} needs reset(task_row) and step(assistant_message) methods "
                          "(docs/adding-an-environment.md)")
    return cls
