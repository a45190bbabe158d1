"""The tool demo's demonstrations: the calculator expression of an arithmetic row and the transcript its scripted
policy plays with the calculator environment."""

from __future__ import annotations

from tempax.experiments.tool_demo import ToolDemoConfig, calculator_expression, calculator_policy
from tempax.configlib import load_config
from tempax.data.formats import encode_chat
from tempax.data.tasks.common import format_target
from tempax.envs.calculator import calculator
from tempax.envs.environment import EpisodeLimits
from tempax.envs.registry import EnvironmentConfig
from tempax.envs.transcripts import play_transcript
from tests.kit.tokenizers import tiny_chat_tokenizer


def test_the_expression_chains_the_working_lines():
    """37 * 48 = 1776, then 1776 + 120 = 1896, then 1896 - 6 = 1890 -> "37 * 48 + 120 - 6", which the
    calculator evaluates left to right (the product first) to 1890."""
    target = format_target("37 * 48 = 1776\n1776 + 120 = 1896\n1896 - 6 = 1890", "1890")
    assert calculator_expression(target) == "37 * 48 + 120 - 6"
    assert calculator(calculator_expression(target)) == "1890"
    assert calculator_expression(format_target("912 - 15 = 897", "897")) == "912 - 15"


def test_a_demonstration_is_a_correct_call_its_result_and_the_worked_answer():
    """Played with the calculator environment: the call (37 * 48 + 120), the calculator's 1896, the worked
    answer; rendered for SFT, the call is the hermes text the rollout parses, and only the two replies train."""
    tok = tiny_chat_tokenizer()
    row = {"prompt_messages": [{"role": "user", "content": "q"}], "answer": "1896",
           "target": format_target("37 * 48 = 1776\n1776 + 120 = 1896", "1896")}
    env = EnvironmentConfig(name="calculator", max_turns=2).build(tok)()
    t = play_transcript(env, row, calculator_policy, tokenizer=tok, limits=EpisodeLimits(max_turns=2))
    messages = t.messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[2]["tool_calls"] == [{"id": "call_0", "type": "function", "function": {
        "name": "calculator", "arguments": {"expression": "37 * 48 + 120"}}}]
    assert messages[3] == {"role": "tool", "name": "calculator", "content": "1896", "tool_call_id": "call_0"}
    assert messages[4]["content"] == "<reasoning>\n37 * 48 + 120 = 1896\n</reasoning>\n<answer>\n1896\n</answer>"
    tokens, mask = encode_chat(tok, messages)
    trained = tok.decode(tokens[mask], skip_special_tokens=False)
    assert trained == ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "37 * 48 + 120"}}\n'
                       '</tool_call><|im_end|>' + messages[4]["content"] + "<|im_end|>")


def test_the_config_parses_with_overrides():
    cfg = load_config(ToolDemoConfig, None, ["grpo.train.steps=3", "eval_problems=200"])
    assert cfg.grpo.train.steps == 3 and cfg.grpo.env.name == "calculator" and cfg.eval_problems == 200
