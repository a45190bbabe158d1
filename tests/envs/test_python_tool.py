"""The Python tool: a scripted episode calls it in the model's format, the program runs in the sandbox, the model
reads its exit status and output, the episode counts how its programs ended, and `env.name=python` builds it."""

from __future__ import annotations

import json

from tempax.envs.environment import run_episode
from tempax.envs.python_tool import PythonToolEnvironment, describe_result, python_tool
from tempax.envs.registry import EnvironmentConfig
from tempax.rewards.sandbox import ProgramResult, Sandbox, SandboxConfig
from tests.kit.tokenizers import tiny_chat_tokenizer

ROW = {"prompt_messages": [{"role": "user", "content": "What is the sum of the squares of 1..10?"}],
       "answer": "385"}


def call(code: str) -> str:
    return f'<tool_call>{json.dumps({"name": "python", "arguments": {"code": code}})}</tool_call>'


def test_the_model_reads_what_its_program_printed():
    """Turn 1 prints sum(i*i for i in 1..10) = 385, turn 2 runs a loop past the 2 s deadline, turn 3 answers."""
    tok = tiny_chat_tokenizer()
    env = PythonToolEnvironment(tok, None, Sandbox(SandboxConfig(timeout_s=2.0)))
    replies = iter([call("print(sum(i * i for i in range(1, 11)))"), call("import time\ntime.sleep(30)"),
                    "<answer>385</answer>"])
    episode = run_episode(env, ROW, lambda messages: next(replies), tokenizer=tok)
    tool_turns = [m for m in episode.messages if m["role"] == "tool"]
    assert tool_turns[0] == {"role": "tool", "name": "python", "content": "exit status 0\nstdout:\n385\n"}
    assert tool_turns[1]["content"] == "killed at the time limit"
    assert '"name": "python"' in episode.messages[0]["content"]  # the tool's schema is in the system message
    m = episode.metrics
    assert (m["tool_calls"], m["sandbox_programs"], m["sandbox_timeouts"], m["turns"]) == (2, 2, 1, 3)


def test_long_output_is_cut_for_the_model():
    result = ProgramResult("x" * 1500, "Traceback\nValueError: bad\n", "exited", exit_code=1)
    text = describe_result(result, max_chars=1000)
    assert text.startswith("exit status 1\nstdout:\n" + "x" * 1000 + "\n... (500 more characters not shown)")
    assert text.endswith("stderr:\nTraceback\nValueError: bad\n")


def test_env_name_python_builds_it_and_the_tool_loads_by_name():
    spec = EnvironmentConfig(name="python", max_turns=3, sandbox=SandboxConfig(timeout_s=1.5))
    env = spec.build(tiny_chat_tokenizer())()
    assert isinstance(env, PythonToolEnvironment) and list(env.tools) == ["python"]
    assert env.tools["python"].fn("print(6 * 7)") == "exit status 0\nstdout:\n42\n"
    assert python_tool().schema["function"]["parameters"]["required"] == ["code"]
