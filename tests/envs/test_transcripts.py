"""Tool-calling transcripts from played episodes: the user's price tool played by its scripted policy, written in
the common layout, scored, filtered, and trained back in the model's own call format."""

from __future__ import annotations

import json
import os

import pytest

from tempax.data.formats import tokenize_rows
from tempax.envs.environment import EpisodeLimits
from tempax.envs.registry import EnvironmentConfig, load_object
from tempax.envs.transcripts import play_transcript, reply_as_text, transcript_messages, write_transcripts
from tempax.errors import ConfigError
from tempax.rewards import combine_rewards
from tests.kit.tokenizers import tiny_chat_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = ("examples/price_tools.py:price_of", "tempax.envs.calculator:calculator_tool")
ROW = {"prompt_messages": [{"role": "user", "content": "What do 2 apple and 1 pear cost?"}],
       "items": [["apple", 2], ["pear", 1]], "answer": "150"}


def answer_is_right(prompts, completions, answer, **columns):
    return [float(f"<answer>\n{a}\n</answer>" == c) for c, a in zip(completions, answer)]


@pytest.fixture()
def played(monkeypatch):
    monkeypatch.chdir(ROOT)
    tok = tiny_chat_tokenizer()
    env = EnvironmentConfig(name="tools", tools=TOOLS, max_turns=3).build(tok)()
    policy = load_object("examples/price_tools.py:scripted_reply", "--policy")
    return tok, play_transcript(env, ROW, policy, tokenizer=tok, limits=EpisodeLimits(max_turns=3),
                                reward_fn=combine_rewards({"right": answer_is_right}))


def test_the_scripted_policy_plays_a_correct_episode_written_in_the_common_layout(played):
    """Turn 1 looks up apple (45) and pear (60), turn 2 asks the calculator for 2 * 45 + 1 * 60 = 150, turn 3
    answers 150: three calls with ids call_0..call_2, each tool result carrying its call's id; the final reply
    scores 1 with the task's reward."""
    _, t = played
    roles = [m["role"] for m in t.messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant", "tool", "assistant"]
    calls = [c["function"] for m in t.messages if m.get("tool_calls") for c in m["tool_calls"]]
    assert calls == [{"name": "price_of", "arguments": {"item": "apple"}},
                     {"name": "price_of", "arguments": {"item": "pear"}},
                     {"name": "calculator", "arguments": {"expression": "2 * 45 + 1 * 60"}}]
    tools = [(m["tool_call_id"], m["content"]) for m in t.messages if m["role"] == "tool"]
    assert tools == [("call_0", "45"), ("call_1", "60"), ("call_2", "150")]
    assert t.messages[-1]["content"] == "<answer>\n150\n</answer>" and t.rewards == {"right": 1.0}


def test_a_transcript_trains_its_replies_and_never_its_tool_results(played):
    tok, t = played
    (example,), _ = tokenize_rows([t.row()], tok)
    trained = tok.decode(example.tokens[example.loss_mask], skip_special_tokens=False)
    assert '"arguments": {"item": "pear"}}\n</tool_call>' in trained and "<answer>\n150\n</answer>" in trained
    assert "<|im_start|>tool" not in trained and "60<|im_end|>" not in trained


def test_replies_are_written_in_the_format_and_unreadable_calls_stay_as_written():
    """A scripted reply's calls become llama3 JSON for a Llama model; a reply with an unreadable call is kept
    as text, and the tool message after it takes no call id."""
    reply = {"content": "", "tool_calls": [{"name": "price_of", "arguments": {"item": "tea"}}]}
    assert reply_as_text(reply, "llama3") == '{"name": "price_of", "parameters": {"item": "tea"}}'
    with pytest.raises(ConfigError, match="needs a \"name\" string"):
        reply_as_text({"tool_calls": [{"arguments": {}}]}, "hermes")
    broken = [{"role": "assistant", "content": "<tool_call>{oops</tool_call>"},
              {"role": "tool", "name": "unknown", "content": "error: could not read the tool call"}]
    assert transcript_messages(broken, "hermes") == broken


def test_min_reward_keeps_only_the_episodes_that_reach_it(played, tmp_path):
    _, t = played
    wrong = type(t)(t.messages, {"right": 0.0}, t.episode)
    path = str(tmp_path / "out.jsonl")
    assert write_transcripts(path, [t, wrong, t], min_reward=1.0) == (2, 3)
    assert [json.loads(line)["reward"] for line in open(path)] == [1.0, 1.0]
