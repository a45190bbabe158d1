"""Which environment a run's episodes play (`EnvironmentConfig`), reachable from a recipe's `env:` block.

    env: {name: single_turn}                                  # the task's prompt, one reply (the default)
    env: {name: calculator, max_turns: 3, max_episode_tokens: 256}
    env: {name: tools, tools: ["examples/price_tools.py:price_of", "tempax.envs.calculator:calculator_tool"],
          max_turns: 3}
    env: {name: "examples/guess_number_env.py:GuessNumberEnvironment", max_turns: 4, options: {...}}

The built-in names, user environments (`FILE.py:Class`, `package.module:Class`), OpenEnv (`openenv:...`) and
verifiers (`verifiers:...`) environments, and tools named the same way: `EnvironmentConfig`'s fields and
docs/adding-an-environment.md.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import typing
from dataclasses import dataclass
from typing import Any, Callable

from tempax.configlib import help_field
from tempax.envs.calculator import calculator_tool
from tempax.envs.environment import Environment, SingleTurnEnvironment, ToolEnvironment
from tempax.envs.openenv import openenv_factory
from tempax.envs.python_tool import python_environment_factory
from tempax.envs.tools import Tool, ToolDefinitionError
from tempax.errors import ConfigError
from tempax.models.tokenizer import Tokenizer
from tempax.rewards.sandbox import SandboxConfig

BUILTIN_ENVIRONMENTS = ("single_turn", "calculator", "tools", "python")
OPENENV_PREFIX = "openenv:"  # an OpenEnv environment's builder, played through tempax.envs.openenv
VERIFIERS_PREFIX = "verifiers:"  # a verifiers taskset (or its builder), played through tempax.envs.verifiers
ADAPTER_PREFIXES = {OPENENV_PREFIX: "the function that builds the OpenEnv environment, openenv:FILE.py:make_env or "
                                    "openenv:package.module:make_env",
                    VERIFIERS_PREFIX: "the verifiers Taskset class or the function that returns one, "
                                      "verifiers:FILE.py:MyTaskset or verifiers:package.module:make_taskset"}
EnvFactory = Callable[[], Environment]


@dataclass(frozen=True)
class EnvironmentConfig:
    """The environment of a run and the bounds on its episodes."""

    name: str = help_field(
        "single_turn (one reply to the task's prompt), calculator (the policy may call an exact calculator in its "
        "chat template's tool-call format), tools (the policy may call the functions named in env.tools), python "
        "(the policy may run programs in the sandbox, env.sandbox), a user environment FILE.py:Class / "
        "package.module:Class, an OpenEnv environment's builder openenv:FILE.py:make_env (the openenv extra), or a "
        "verifiers taskset verifiers:FILE.py:MyTaskset (the verifiers extra; task rows name its tasks by idx or id).",
        "single_turn",
    )
    tools: tuple[str, ...] = help_field(
        "The tools of env.name=tools, each FILE.py:function or package.module:function: a typed, documented "
        "function (its schema comes from its hints and docstring), a Tool, or a function returning a Tool.",
        (),
    )
    sandbox: SandboxConfig = help_field("Limits of the programs of env.name=python (tempax.rewards.sandbox).",
                                        default_factory=SandboxConfig)
    max_turns: int = help_field("Most assistant replies in an episode.", 1)
    max_episode_tokens: int | None = help_field(
        "Most tokens after the prompt (replies and environment messages; the batch's completion length); null: "
        "max_new_tokens x max_turns. An episode whose next turn would not fit ends before it (truncated).",
        None,
    )
    options: dict[str, Any] = help_field(
        "Keyword arguments of a user environment's class, of an OpenEnv builder, or of a verifiers taskset's config.",
        default_factory=dict)

    def validate(self) -> None:
        if self.max_turns < 1:
            raise ConfigError(f"env.max_turns must be >= 1, got {self.max_turns}")
        if self.max_episode_tokens is not None and self.max_episode_tokens < 1:
            raise ConfigError(f"env.max_episode_tokens must be >= 1 or null, got {self.max_episode_tokens}")
        for prefix, what in ADAPTER_PREFIXES.items():
            if self.name.startswith(prefix) and ":" not in self.name[len(prefix):]:
                raise ConfigError(f"env.name={self.name!r}: name {what}")
        if self.name not in BUILTIN_ENVIRONMENTS and ":" not in self.name:
            raise ConfigError(f"env.name={self.name!r} is neither a built-in environment {BUILTIN_ENVIRONMENTS} "
                              "nor a user environment FILE.py:Class or package.module:Class")
        if self.options and self.name in BUILTIN_ENVIRONMENTS:
            raise ConfigError(f"env.options are for a user environment's class; {self.name} takes none")
        if self.name == "tools" and not self.tools:
            raise ConfigError('env.name=tools needs env.tools, e.g. ["my_tools.py:price_of"] (FILE.py:function)')
        if self.tools and self.name != "tools":
            raise ConfigError(f"env.tools are the tools of env.name=tools; env.name={self.name!r} takes none "
                              "(set env.name=tools)")
        self.load_tools()  # a tool that cannot be found or described is refused when the recipe is read

    def load_tools(self) -> list[Tool]:
        """The tools `env.tools` names, in order."""
        return [load_tool(spec, f"env.tools[{i}]") for i, spec in enumerate(self.tools)]

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
        """A function that makes a fresh environment for one episode. A user environment is built as
        `Class(**options)` once per episode, so it may keep the episode's state on itself, with the run's tokenizer
        as `tokenizer=` when its constructor takes one (so a subclass of `ToolEnvironment` works). The built-in
        environments leave the final answer to the task's reward functions, which the rollout calls once for the
        whole batch."""
        self.validate()
        if self.name == "single_turn":
            return lambda: SingleTurnEnvironment(tokenizer)
        if self.name == "calculator":
            tool = calculator_tool()
            return lambda: ToolEnvironment(tokenizer, None, [tool])
        if self.name == "python":
            return python_environment_factory(tokenizer, self.sandbox)
        if self.name == "tools":
            tools = self.load_tools()
            ToolEnvironment(tokenizer, None, tools)  # refuses duplicate names now, not in the first rollout
            return lambda: ToolEnvironment(tokenizer, None, tools)
        if self.name.startswith(OPENENV_PREFIX):
            target = self.name[len(OPENENV_PREFIX):]
            return openenv_factory(load_object(target, "env.name"), target, self.options)
        if self.name.startswith(VERIFIERS_PREFIX):
            target = self.name[len(VERIFIERS_PREFIX):]
            verifiers_factory = _verifiers_adapter(self.name)  # before the user's file, which imports verifiers too
            return verifiers_factory(load_object(target, "env.name"), target, self.options, tokenizer)
        cls = load_environment_class(self.name)
        options = dict(self.options)
        if "tokenizer" in _parameters(cls):
            options["tokenizer"] = tokenizer
        try:
            cls(**options)
        except TypeError as e:
            raise ConfigError(f"env.options do not fit {self.name}: {e}") from None
        return lambda: cls(**options)


def _verifiers_adapter(name: str) -> Callable[..., EnvFactory]:
    """`tempax.envs.verifiers.verifiers_factory`, imported here and not at the top: the adapter imports the
    optional `verifiers` package, which only recipes naming a verifiers taskset need."""
    try:
        from tempax.envs.verifiers import verifiers_factory
    except ImportError as e:
        if (e.name or "").split(".")[0] not in ("verifiers", "mcp"):
            raise
        raise ConfigError(f"env.name={name!r} needs the verifiers package (0.4): pip install -e \".[verifiers]\" "
                          f"({e.msg})") from None
    return verifiers_factory


def _parameters(cls: type) -> set[str]:
    try:
        return set(inspect.signature(cls).parameters)
    except (TypeError, ValueError):  # a class whose signature Python cannot read (some builtins) takes no tokenizer
        return set()


def load_object(name: str, key: str) -> Any:
    """The object `FILE.py:attr` (a path relative to the working directory) or `package.module:attr` names; `key`
    is the recipe key that named it, for the message when it cannot be found."""
    where, _, attr = name.rpartition(":")
    if not where or not attr:
        raise ConfigError(f"{key}={name!r} is not FILE.py:name or package.module:name")
    if where.endswith(".py"):
        if not os.path.isfile(where):
            raise ConfigError(f"{key}={name!r}: no file {where!r} (paths are relative to the working directory)")
        spec = importlib.util.spec_from_file_location(f"tempax_user_{abs(hash(os.path.abspath(where)))}", where)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise ConfigError(f"{key}={name!r}: cannot import {where!r} ({e})") from None
    found = getattr(module, attr, None)
    if found is None:
        raise ConfigError(f"{key}={name!r}: {where} defines no {attr!r}")
    return found


def load_environment_class(name: str) -> type:
    """The class `FILE.py:Class` or `package.module:Class` names, checked to have `reset` and `step`."""
    cls = load_object(name, "env.name")
    attr = name.rpartition(":")[2]
    if not (callable(getattr(cls, "reset", None)) and callable(getattr(cls, "step", None))):
        raise ConfigError(f"env.name={name!r}: {attr} needs reset(task_row) and step(assistant_message) methods "
                          "(docs/adding-an-environment.md)")
    return cls


def _returns_tool(fn: Callable[..., Any]) -> bool:
    try:
        return typing.get_type_hints(fn).get("return") is Tool
    except Exception:  # hints naming what the module does not define: not a Tool factory
        return False


def load_tool(name: str, key: str = "env.tools") -> Tool:
    """The tool `FILE.py:function` or `package.module:function` names: a plain function with type hints and a
    Google-style docstring becomes a tool (`Tool.from_function`), a `Tool` object is taken as it is, and a function
    annotated `-> Tool` (such as `calculator_tool`) is called with no arguments to make one. A function that
    cannot be described to the model is refused with the reason."""
    found = load_object(name, key)
    try:
        if isinstance(found, Tool):
            return found
        if callable(found) and _returns_tool(found):
            tool = found()
            if isinstance(tool, Tool):
                return tool
            raise ConfigError(f"{key}={name!r} is annotated -> Tool but returned {type(tool).__name__}")
        if inspect.isfunction(found) or inspect.isbuiltin(found) or inspect.ismethod(found):
            return Tool.from_function(found)
    except ToolDefinitionError as e:
        raise ConfigError(f"{key}={name!r}: {e} (docs/adding-an-environment.md, Tools)") from None
    raise ConfigError(f"{key}={name!r} is a {type(found).__name__}, not a function or a Tool")
