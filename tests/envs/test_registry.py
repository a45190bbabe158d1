"""`EnvironmentConfig`: built-in names, a user environment by file and class, and the refusals that name the fix."""

from __future__ import annotations

import os

import pytest

from tempax.envs.environment import SingleTurnEnvironment, ToolEnvironment
from tempax.envs.registry import EnvironmentConfig
from tempax.errors import ConfigError
from tests.kit.tokenizers import tiny_chat_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUESS = os.path.join(ROOT, "examples", "guess_number_env.py") + ":GuessNumberEnvironment"


def test_builtins_and_a_user_environment_build_fresh_environments():
    tok = tiny_chat_tokenizer()
    assert isinstance(EnvironmentConfig().build(tok)(), SingleTurnEnvironment)
    calc = EnvironmentConfig(name="calculator", max_turns=2).build(tok)
    a, b = calc(), calc()
    assert isinstance(a, ToolEnvironment) and a is not b and list(a.tools) == ["calculator"]
    guess = EnvironmentConfig(name=GUESS, options={"wrong_guess_penalty": 0.5}).build(tok)()
    assert guess.wrong_guess_penalty == 0.5


def test_the_episode_budget_defaults_to_max_turns_replies():
    """null budget: 3 turns x 32 tokens = 96; a budget below one reply is refused."""
    assert EnvironmentConfig(max_turns=3).episode_tokens(32) == 96
    assert EnvironmentConfig(max_turns=3, max_episode_tokens=200).episode_tokens(32) == 200
    with pytest.raises(ConfigError, match="less than one turn's grpo.max_new_tokens=32: raise env.max_episode_tokens "
                                          "or lower grpo.max_new_tokens"):
        EnvironmentConfig(max_episode_tokens=16).episode_tokens(32, key="grpo.max_new_tokens")


@pytest.mark.parametrize("spec, message", [
    (EnvironmentConfig(name="gym"), "neither a built-in environment"),
    (EnvironmentConfig(name="nowhere/env.py:Env"), "no file 'nowhere/env.py'"),
    (EnvironmentConfig(name="tempax_no_such_module:Env"), "cannot import 'tempax_no_such_module'"),
    (EnvironmentConfig(name="tempax.errors:TempaxError"), "needs reset\\(task_row\\) and step"),
    (EnvironmentConfig(name="calculator", options={"x": 1}), "calculator takes none"),
    (EnvironmentConfig(name=GUESS, options={"colour": "red"}), "env.options do not fit"),
    (EnvironmentConfig(max_turns=0), "env.max_turns must be >= 1"),
])
def test_bad_environments_are_refused_with_the_fix(spec, message):
    with pytest.raises(ConfigError, match=message):
        spec.build(tiny_chat_tokenizer())


PRICE_TOOLS = ("examples/price_tools.py:price_of", "tempax.envs.calculator:calculator_tool")


def test_tools_named_in_a_recipe_build_a_tool_environment(monkeypatch):
    """env: {name: tools, tools: [examples/price_tools.py:price_of, tempax.envs.calculator:calculator_tool]}: the
    plain function becomes a tool with its schema from its hints and docstring, the `-> Tool` factory is called;
    a hermes call to each is answered (price_of("apple") is 45 cents; 2 * 45 + 1 = 91)."""
    monkeypatch.chdir(ROOT)  # the recipe's paths are relative to the repository root
    env = EnvironmentConfig(name="tools", tools=PRICE_TOOLS, max_turns=3).build(tiny_chat_tokenizer())()
    assert isinstance(env, ToolEnvironment) and list(env.tools) == ["price_of", "calculator"]
    assert env.tools["price_of"].schema["function"]["parameters"] == {
        "type": "object", "required": ["item"],
        "properties": {"item": {"type": "string", "description": 'the item\'s name, e.g. "apple".'}}}
    env.reset({"prompt_messages": [{"role": "user", "content": "What do 2 apples cost, plus one cent?"}]})
    result = env.step('<tool_call>{"name": "price_of", "arguments": {"item": "apples"}}</tool_call>'
                      '<tool_call>{"name": "calculator", "arguments": {"expression": "2 * 45 + 1"}}</tool_call>')
    assert [m["content"] for m in result.messages] == ["45", "91"] and not result.done


USER_ENV = '''
from tempax.envs.environment import ToolEnvironment
from tempax.envs.tools import Tool


def price_of(item: str) -> str:
    """The price of an item in cents.

    Args:
      item: the item's name.
    """
    return {"apple": "45"}.get(item, "unknown")


class PriceEnvironment(ToolEnvironment):
    def __init__(self, tokenizer=None, markup: int = 0):
        super().__init__(tokenizer, None, [Tool.from_function(price_of)], tool_format="hermes")
        self.markup = markup
'''


def test_a_user_environment_taking_a_tokenizer_gets_the_runs_tokenizer(tmp_path):
    """A ToolEnvironment subclass whose constructor takes `tokenizer` is built with the run's tokenizer beside its
    options (built as Class(**options) alone, its reset failed on a None tokenizer with an AttributeError)."""
    path = tmp_path / "price_env.py"
    path.write_text(USER_ENV)
    tok = tiny_chat_tokenizer()
    env = EnvironmentConfig(name=f"{path}:PriceEnvironment", max_turns=2, options={"markup": 5}).build(tok)()
    assert env.task.tokenizer is tok and env.markup == 5
    first = env.reset({"prompt_messages": [{"role": "user", "content": "price of an apple?"}]})
    assert first[0]["role"] == "system" and '"name": "price_of"' in first[0]["content"]
    assert env.task.prompt_text.endswith("<|im_start|>assistant\n")


def test_bad_tool_specs_are_refused_when_the_recipe_is_read(tmp_path, monkeypatch):
    """Each wrong tool spec is one ConfigError naming the spec and the fix, raised by validate() (so by
    load_config, before any model is loaded)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "untyped.py").write_text('def price_of(item):\n    """Price.\n\n    Args:\n      item: name.\n    """\n')
    cases = [
        (("nowhere.py:price_of",), r"env.tools\[0\]='nowhere.py:price_of': no file 'nowhere.py'"),
        (("untyped.py:cost_of",), r"untyped.py defines no 'cost_of'"),
        (("untyped.py:price_of",), r"parameter 'item' has no type hint \(docs/adding-an-environment.md, Tools\)"),
        (("tempax.envs.tools:ToolResult",), r"is a type, not a function or a Tool"),
        ((), r"env.name=tools needs env.tools"),
    ]
    for tools, message in cases:
        with pytest.raises(ConfigError, match=message):
            EnvironmentConfig(name="tools", tools=tools).validate()
    with pytest.raises(ConfigError, match="set env.name=tools"):
        EnvironmentConfig(name="calculator", tools=("untyped.py:price_of",)).validate()
