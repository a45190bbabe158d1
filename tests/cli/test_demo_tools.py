"""The tool demo's demonstrations: the calculator expression of an arithmetic row and the episode written for it."""

from __future__ import annotations

from tempax.cli.demo_tools import ToolDemoConfig, calculator_expression, tool_demonstration
from tempax.configlib import load_config
from tempax.data.tasks.common import format_target
from tempax.envs.calculator import calculator
from tempax.envs.tool_calls import parse_tool_calls


def test_the_expression_chains_the_working_lines():
    """37 * 48 = 1776, then 1776 + 120 = 1896, then 1896 - 6 = 1890 -> "37 * 48 + 120 - 6", which the
    calculator evaluates left to right (the product first) to 1890."""
    target = format_target("37 * 48 = 1776\n1776 + 120 = 1896\n1896 - 6 = 1890", "1890")
    assert calculator_expression(target) == "37 * 48 + 120 - 6"
    assert calculator(calculator_expression(target)) == "1890"
    assert calculator_expression(format_target("912 - 15 = 897", "897")) == "912 - 15"


def test_a_demonstration_is_a_correct_call_its_result_and_the_worked_answer():
    row = {"answer": "1896", "target": format_target("37 * 48 = 1776\n1776 + 120 = 1896", "1896")}
    first = [{"role": "system", "content": "tools..."}, {"role": "user", "content": "q"}]
    messages = tool_demonstration(first, row, "hermes")
    assert messages[:2] == first and [m["role"] for m in messages[2:]] == ["assistant", "tool", "assistant"]
    call = parse_tool_calls(messages[2]["content"], "hermes").calls[0]
    assert call.name == "calculator" and call.arguments == {"expression": "37 * 48 + 120"}
    assert messages[3]["content"] == "1896"
    assert messages[4]["content"] == "<reasoning>\n37 * 48 + 120 = 1896\n</reasoning>\n<answer>\n1896\n</answer>"


def test_the_config_parses_with_overrides():
    cfg = load_config(ToolDemoConfig, None, ["grpo.train.steps=3", "eval_problems=200"])
    assert cfg.grpo.train.steps == 3 and cfg.grpo.env.name == "calculator" and cfg.eval_problems == 200
