"""`EnvironmentSpec`: built-in names, a user environment by file and class, and the refusals that name the fix."""

from __future__ import annotations

import os

import pytest

from tempax.envs.environment import SingleTurnEnvironment, ToolEnvironment
from tempax.envs.registry import EnvironmentSpec
from tempax.errors import ConfigError
from tests.kit.tokenizers import tiny_chat_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUESS = os.path.join(ROOT, "examples", "guess_number_env.py") + ":GuessNumberEnvironment"


def test_builtins_and_a_user_environment_build_fresh_environments():
    tok = tiny_chat_tokenizer()
    assert isinstance(EnvironmentSpec().build(tok)(), SingleTurnEnvironment)
    calc = EnvironmentSpec(name="calculator", max_turns=2).build(tok)
    a, b = calc(), calc()
    assert isinstance(a, ToolEnvironment) and a is not b and list(a.tools) == ["calculator"]
    guess = EnvironmentSpec(name=GUESS, options={"wrong_guess_penalty": 0.5}).build(tok)()
    assert guess.wrong_guess_penalty == 0.5


def test_the_episode_budget_defaults_to_max_turns_replies():
    """null budget: 3 turns x 32 tokens = 96; a budget below one reply is refused."""
    assert EnvironmentSpec(max_turns=3).episode_tokens(32) == 96
    assert EnvironmentSpec(max_turns=3, max_episode_tokens=200).episode_tokens(32) == 200
    with pytest.raises(ConfigError, match="less than one turn's grpo.max_new_tokens=32: raise env.max_episode_tokens "
                                          "or lower grpo.max_new_tokens"):
        EnvironmentSpec(max_episode_tokens=16).episode_tokens(32, key="grpo.max_new_tokens")


@pytest.mark.parametrize("spec, message", [
    (EnvironmentSpec(name="gym"), "neither a built-in environment"),
    (EnvironmentSpec(name="nowhere/env.py:Env"), "no file 'nowhere/env.py'"),
    (EnvironmentSpec(name="tempax_no_such_module:Env"), "cannot import 'tempax_no_such_module'"),
    (EnvironmentSpec(name="tempax.errors:TempaxError"), "needs reset\\(task_row\\) and step"),
    (EnvironmentSpec(name="calculator", options={"x": 1}), "calculator takes none"),
    (EnvironmentSpec(name=GUESS, options={"colour": "red"}), "env.options do not fit"),
    (EnvironmentSpec(max_turns=0), "env.max_turns must be >= 1"),
])
def test_bad_environments_are_refused_with_the_fix(spec, message):
    with pytest.raises(ConfigError, match=message):
        spec.build(tiny_chat_tokenizer())
