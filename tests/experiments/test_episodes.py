"""`write_episodes`: a recipe's environment played with a scripted policy on its first task rows, each row as
many times as asked (the command around it: tests/cli/test_data.py, which writes the shipped set)."""

from __future__ import annotations

import json
import os

from tempax.algorithms.registry import load_recipe
from tempax.envs.registry import load_object
from tempax.experiments.episodes import recipe_reply_length, reply_limit_warning, write_episodes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_first_rows_are_played_as_many_times_as_asked(tmp_path, monkeypatch):
    """2 rows x 3 attempts of the scripted price policy: 6 episodes, each the shipped transcript of its row."""
    monkeypatch.chdir(ROOT)
    cfg = load_recipe("grpo", "recipes/grpo_price_tools.yaml")
    policy = load_object("examples/price_tools.py:scripted_reply", "policy")
    out = str(tmp_path / "episodes.jsonl")
    recorded = write_episodes(cfg, "grpo", out, policy=policy, limit=2, attempts=3)
    assert (recorded.written, recorded.played) == (6, 6)
    shipped = open("examples/price_episodes.jsonl").read().splitlines()
    assert open(out).read().splitlines() == [shipped[0]] * 3 + [shipped[1]] * 3
    assert all(json.loads(line)["reward"] >= 1.0 for line in shipped[:2])


def test_a_sampled_reply_is_as_long_as_the_recipes_own_sampling():
    """The reply length comes from the knobs section the record names (grpo: `grpo.max_new_tokens`)."""
    cfg = load_recipe("grpo", os.path.join(ROOT, "recipes", "grpo_price_tools.yaml"), ["grpo.max_new_tokens=77"])
    assert recipe_reply_length(cfg, "grpo") == 77


def test_a_reply_longer_than_the_recipes_turn_limit_is_said_with_the_fix(tmp_path, monkeypatch):
    """The shop's second row has three items, so its first reply is three price_of calls in SmolLM2's hermes
    format, each `<tool_call>\n{"name": "price_of", "arguments": {"item": ...}}\n</tool_call>`: more than 64 tokens
    and fewer than 96. With grpo.max_new_tokens=64 (the recipe before it was measured) every three-item episode
    was cut in its first reply; the line says so and names the setting."""
    monkeypatch.chdir(ROOT)
    policy = load_object("examples/price_tools.py:scripted_reply", "policy")
    short = load_recipe("grpo", "recipes/grpo_price_tools.yaml", ["grpo.max_new_tokens=64"])
    recorded = write_episodes(short, "grpo", str(tmp_path / "e.jsonl"), policy=policy, limit=2)
    assert 64 < recorded.longest_reply_tokens < 96
    warning = reply_limit_warning(recorded, short, "grpo")
    assert warning is not None and f"set it to {recorded.longest_reply_tokens} or more" in warning
    shipped = load_recipe("grpo", "recipes/grpo_price_tools.yaml")
    assert reply_limit_warning(recorded, shipped, "grpo") is None
    two_items = write_episodes(shipped, "grpo", str(tmp_path / "f.jsonl"), policy=policy, limit=1)
    assert two_items.longest_reply_tokens < recorded.longest_reply_tokens  # two calls are shorter than three


def test_a_last_reply_starting_too_late_for_the_episode_budget_is_said_with_the_fix(tmp_path, monkeypatch):
    """An RL episode starts a turn only when a whole turn's tokens fit. The three-item episode's answer starts after
    three calls, their results, the calculator call and its result (well over 128 tokens), so with 128 tokens a
    turn a 256-token episode ends before the answer: every episode would lose its answer (what the recipe did
    with grpo.max_new_tokens=128, env.max_episode_tokens=256)."""
    monkeypatch.chdir(ROOT)
    policy = load_object("examples/price_tools.py:scripted_reply", "policy")
    cfg = load_recipe("grpo", "recipes/grpo_price_tools.yaml",
                      ["grpo.max_new_tokens=128", "env.max_episode_tokens=256"])
    recorded = write_episodes(cfg, "grpo", str(tmp_path / "e.jsonl"), policy=policy, limit=2)
    assert recorded.latest_reply_start > 128 and recorded.longest_reply_tokens <= 128
    warning = reply_limit_warning(recorded, cfg, "grpo")
    assert warning is not None and "max_new_tokens=128 more fit" in warning
    assert f"set env.max_episode_tokens to {recorded.latest_reply_start + 128} or more (now 256)" in warning
    roomy = load_recipe("grpo", "recipes/grpo_price_tools.yaml",
                        ["grpo.max_new_tokens=128", f"env.max_episode_tokens={recorded.latest_reply_start + 128}"])
    assert reply_limit_warning(recorded, roomy, "grpo") is None
