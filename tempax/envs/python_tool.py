"""A Python tool for episodes: the policy writes a program, the sandbox runs it, the policy reads what it printed.

    <tool_call>{"name": "python", "arguments": {"code": "print(sorted([3, 1, 2]))"}}</tool_call>
    -> tool result "exit status 0\\nstdout:\\n[1, 2, 3]\\n"

Every call runs in `tempax.rewards.sandbox` (its own process tree, no network, no writes outside its own
temporary folder, the limits of `SandboxConfig`), never in the trainer's process. The answer the model reads is
the program's exit status (or how it was killed), then its stdout and stderr, each cut to `max_chars` characters
so a long print cannot fill the context. `env.name=python` plays it (`tempax.envs.registry`); the episode's
counters add how its programs ended (`sandbox_timeouts`, `sandbox_killed`, ...) to the tool environment's.
"""

from __future__ import annotations

from typing import Any, Sequence

from tempax.envs.environment import ToolEnvironment
from tempax.envs.tools import Tool
from tempax.models.tokenizer import Tokenizer
from tempax.rewards.sandbox import ProgramResult, Sandbox, SandboxConfig, SandboxCounters

MAX_RESULT_CHARS = 1000


def _cut(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n... ({len(text) - max_chars} more characters not shown)"


def describe_result(result: ProgramResult, max_chars: int = MAX_RESULT_CHARS) -> str:
    """The text the model reads: how the program ended, then its stdout and stderr when not empty."""
    parts = [result.describe()]
    if result.stdout:
        parts.append("stdout:\n" + _cut(result.stdout, max_chars))
    if result.stderr:
        parts.append("stderr:\n" + _cut(result.stderr, max_chars))
    return "\n".join(parts)


def python_tool_of(sandbox: Sandbox, counters: SandboxCounters | None = None,
                   max_chars: int = MAX_RESULT_CHARS) -> Tool:
    """The `python` tool running on `sandbox`; each result is also added to `counters` when given."""

    def python(code: str) -> str:
        """Runs a Python program in a sandbox (no network, no files outside its own temporary folder, a few seconds) and
        returns its exit status, stdout and stderr.

        Args:
          code: the whole program; print what you want to see.
        """
        result = sandbox.run(code)
        if counters is not None:
            counters.add(result)
        return describe_result(result, max_chars)

    return Tool.from_function(python)


def python_tool() -> Tool:
    """The `python` tool on a sandbox with the default limits (for `env.tools` lists)."""
    return python_tool_of(Sandbox(SandboxConfig()))


class PythonToolEnvironment(ToolEnvironment):
    """A `ToolEnvironment` whose tools are the `python` tool (plus `extra_tools`), with the sandbox's counters of
    this episode's programs in `metrics()`."""

    def __init__(self, tokenizer: Tokenizer, reward_fn: Any, sandbox: Sandbox,
                 extra_tools: Sequence[Tool] = ()) -> None:
        self.programs = SandboxCounters()
        super().__init__(tokenizer, reward_fn, [python_tool_of(sandbox, self.programs), *extra_tools])

    def metrics(self) -> dict[str, float]:
        counts = {k.replace("sandbox/", "sandbox_"): v for k, v in self.programs.metrics().items()}
        return {**super().metrics(), **counts}


def python_environment_factory(tokenizer: Tokenizer, config: SandboxConfig) -> Any:
    """A function making a fresh `PythonToolEnvironment` per episode, all on one sandbox; the sandbox is tried
    once here, so a kernel that cannot isolate programs refuses the run before it starts."""
    sandbox = Sandbox(config)
    sandbox.run("pass")
    return lambda: PythonToolEnvironment(tokenizer, None, sandbox)
