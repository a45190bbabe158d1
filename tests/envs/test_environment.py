"""The environment protocol: scripted episodes of the tool environment, the one-turn case, the limits, and the
user-written example environment loaded from examples/."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tempax.envs.calculator import calculator_tool
from tempax.envs.environment import (
    EpisodeLimits,
    SingleTurnEnvironment,
    StepResult,
    ToolEnvironment,
    conversation_tokens,
    run_episode,
)
from tempax.envs.lookup import lookup_tool
from tempax.errors import ConfigError, DataError
from tempax.rewards.combine import combine_rewards
from tempax.rewards.registry import RewardsConfig, build_rewards
from tests.kit.tokenizers import tiny_chat_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROW = {"prompt_messages": [{"role": "system", "content": "Answer in <answer> tags."},
                           {"role": "user", "content": "What is 12*34?"}], "answer": "408"}


def exact_answer(prompts, completions, *, answer, **columns):
    """1.0 when the reply holds `<answer>{answer}</answer>`."""
    return [float(f"<answer>{a}</answer>" in c) for c, a in zip(completions, answer)]


def scripted(*replies):
    seen = []

    def reply(messages):
        seen.append(messages)
        return replies[len(seen) - 1]

    return reply, seen


def test_a_two_turn_tool_episode():
    """Turn 1 calls the calculator (12*34 = 408), turn 2 answers; the reward comes on the last turn only."""
    tok = tiny_chat_tokenizer()
    env = ToolEnvironment(tok, combine_rewards({"exact": exact_answer}), [calculator_tool()])
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>'
    reply, seen = scripted(call, "<answer>408</answer>")
    episode = run_episode(env, ROW, reply, tokenizer=tok)
    first = seen[0]
    assert first[0]["role"] == "system" and first[0]["content"].startswith("Answer in <answer> tags.\n\nYou may call")
    assert '"name": "calculator"' in first[0]["content"] and "<tool_call>" in first[0]["content"]
    assert [m["role"] for m in episode.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert episode.messages[3] == {"role": "tool", "name": "calculator", "content": "408"}
    assert seen[1] == episode.messages[:4]
    assert episode.turn_rewards == [{}, {"exact": 1.0}] and episode.rewards == {"exact": 1.0}
    assert episode.turns == 2 and episode.truncated is None
    m = episode.metrics
    assert (m["tool_calls"], m["malformed_calls"], m["tool_errors"], m["turns"]) == (1, 0, 0, 2)
    assert m["tool_seconds"] >= 0 and m["total_tokens"] == conversation_tokens(tok, episode.messages)


def test_bad_calls_are_answered_and_counted():
    """One reply holding a broken call, an unknown tool and a refused division: three error results, one turn;
    the episode goes on and the next reply answers (wrongly: reward 0)."""
    tok = tiny_chat_tokenizer()
    env = ToolEnvironment(tok, combine_rewards({"exact": exact_answer}),
                          [calculator_tool(), lookup_tool({"France": "Paris"})])
    bad = ('<tool_call>{"name": "calculator", "arguments": {</tool_call>'
           '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>'
           '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>')
    reply, _ = scripted(bad, "<answer>7</answer>")
    episode = run_episode(env, {"prompt_messages": ROW["prompt_messages"][1:], "answer": "408"}, reply, tokenizer=tok)
    assert episode.messages[0]["role"] == "system"  # the tool list became the first message
    results = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert results[0].startswith("error: could not read the tool call: invalid JSON")
    assert results[1] == "error: unknown tool 'search'; available tools: ['calculator', 'lookup']"
    assert results[2] == "error: division by zero"
    m = episode.metrics
    assert (m["tool_calls"], m["malformed_calls"], m["tool_errors"]) == (2, 1, 2)
    assert episode.rewards == {"exact": 0.0}


def test_llama_templates_get_json_call_instructions():
    tok = tiny_chat_tokenizer(template="{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
                                      "\n\n{{ m['content'] }}<|eot_id|>{% endfor %}")
    env = ToolEnvironment(tok, combine_rewards({"exact": exact_answer}), [calculator_tool()])
    assert env.tool_format == "llama3"
    reply, _ = scripted('{"name": "calculator", "parameters": {"expression": "12*34"}}', "<answer>408</answer>")
    episode = run_episode(env, ROW, reply, tokenizer=tok)
    assert '"parameters"' in episode.messages[0]["content"] and episode.messages[3]["content"] == "408"
    assert episode.rewards == {"exact": 1.0}


def test_limits_end_an_episode():
    """A policy that only ever calls tools is stopped by max_turns (3 replies), or earlier by max_total_tokens."""
    tok = tiny_chat_tokenizer()
    env = ToolEnvironment(tok, combine_rewards({"exact": exact_answer}), [calculator_tool()])
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'

    def reply(messages):
        return call

    by_turns = run_episode(env, ROW, reply, tokenizer=tok, limits=EpisodeLimits(max_turns=3))
    assert (by_turns.turns, by_turns.truncated, by_turns.rewards) == (3, "max_turns", {})
    after_one = conversation_tokens(tok, by_turns.messages[:4])
    by_tokens = run_episode(env, ROW, reply, tokenizer=tok, limits=EpisodeLimits(max_turns=9,
                                                                                 max_total_tokens=after_one))
    assert (by_tokens.turns, by_tokens.truncated) == (1, "max_total_tokens")
    with pytest.raises(ConfigError, match="max_turns must be at least 1"):
        EpisodeLimits(max_turns=0)


def test_single_turn_tasks_are_one_turn_episodes():
    """An arithmetic task row with the built-in rewards: a correct, well-formatted reply scores format 1 and
    correctness 1 in one turn."""
    tok = tiny_chat_tokenizer()
    env = SingleTurnEnvironment(tok, build_rewards(RewardsConfig(functions=("format", "correctness"))))
    reply, _ = scripted("<reasoning>\n12 * 34 = 408\n</reasoning>\n<answer>\n408\n</answer>")
    episode = run_episode(env, ROW, reply, tokenizer=tok)
    assert episode.turns == 1 and episode.truncated is None
    assert episode.rewards == {"format": 1.0, "correctness": 1.0}
    with pytest.raises(DataError, match="needs a non-empty 'prompt_messages'"):
        env.reset({"question": "2+2?"})


def test_a_single_turn_prompt_given_as_token_ids_needs_no_messages():
    """Without reward functions of its own (the rollout scores the reply), a one-turn environment accepts a row
    with no messages: there is nothing to render after the reply. With reward functions it still needs them, to
    give the functions the prompt."""
    tok = tiny_chat_tokenizer()
    assert SingleTurnEnvironment(tok).reset({}) == []
    with pytest.raises(DataError, match="needs a non-empty 'prompt_messages'"):
        SingleTurnEnvironment(tok).reset({"prompt_messages": []})


def test_the_example_environment_loads_and_plays():
    """examples/guess_number_env.py: guesses 50 (too low), 75 (too high), 62 (right): two wrong guesses at
    -0.1 each, then found = 1.0."""
    spec = importlib.util.spec_from_file_location("guess_number_env", os.path.join(ROOT, "examples",
                                                                                   "guess_number_env.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tok = tiny_chat_tokenizer()
    reply, _ = scripted("50", "I guess 75", "62")
    episode = run_episode(module.GuessNumberEnvironment(), {"secret": 62}, reply, tokenizer=tok)
    assert [m["content"] for m in episode.messages if m["role"] == "user"][1:] == ["No, higher.", "No, lower."]
    assert episode.turn_rewards == [{"turn": -0.1}, {"turn": -0.1}, {"found": 1.0}]
    assert episode.rewards == pytest.approx({"turn": -0.2, "found": 1.0})
    assert isinstance(module.GuessNumberEnvironment().step("x"), StepResult)
