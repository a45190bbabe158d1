"""The tool demo's demonstrations: the calculator expression of an arithmetic row and the transcript its scripted
policy plays with the calculator environment."""

from __future__ import annotations

import json

import pytest

from tempax.experiments.tool_demo import STAGES, ToolDemoConfig, calculator_expression, calculator_policy, main
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


@pytest.mark.slow
def test_the_five_stages_run_end_to_end_on_a_tiny_model(tmp_path):
    """The two arms on a random-init tiny model (4 demonstrations, 1 SFT step, 1 GRPO step of 2 episodes, 2
    held-out problems): the five rows in stage order, each written to outcomes.jsonl as it was evaluated, both
    RL arms' episode counters, and results.json holding what `main` returns."""
    from tempax.algorithms.common import ModelSourceConfig
    from tempax.configlib import from_dict

    tok_dir = tmp_path / "tokenizer"
    tiny_chat_tokenizer().hf.save_pretrained(str(tok_dir))
    spec = ModelSourceConfig(source="preset:tiny-llama", tokenizer=str(tok_dir),
                             overrides={"vocab_size": 400, "max_position_embeddings": 4096})
    lora = {"rank": 2, "alpha": 4.0}
    cfg = from_dict(ToolDemoConfig, {
        "model": spec, "run_dir": str(tmp_path / "run"), "demonstrations": 4, "eval_problems": 2,
        "eval_batch_size": 2,
        "sft": {"lora": lora, "train": {"steps": 1, "batch_size": 1, "seq_len": 2048}},
        "grpo": {"lora": lora, "task": {"num_train_problems": 16}, "grpo": {"group_size": 2, "max_new_tokens": 8, "max_prompt_len": 2048},
                 "env": {"max_episode_tokens": 24}, "train": {"steps": 1}},
    })
    lines: list[str] = []
    out = main(cfg, say=lines.append)
    assert list(out["accuracy"]) == list(STAGES)
    with open(tmp_path / "run" / "outcomes.jsonl") as f:
        assert [json.loads(line)["stage"] for line in f] == list(STAGES)
    assert set(out["seconds"]) == {"tool_demos", "grpo_tools", "plain_demos", "grpo_plain"}
    assert set(out["episode_metrics"]) == {"grpo_tools", "grpo_plain"}
    with open(tmp_path / "run" / "results.json") as f:
        assert json.load(f)["accuracy"] == out["accuracy"]
    assert [line for line in lines if line.startswith("[")] == [
        "[1/5] base model, no tools", "[2/5] warm-start on 4 tool-use episodes", "[3/5] GRPO with the calculator",
        "[4/5] warm-start on the same 4 problems' worked answers, no tools",
        "[5/5] GRPO without tools, same steps and samples"]
