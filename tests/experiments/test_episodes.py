"""`write_episodes`: a recipe's environment played with a scripted policy on its first task rows, each row as
many times as asked (the command around it: tests/cli/test_data.py, which writes the shipped set)."""

from __future__ import annotations

import json
import os

from tempax.algorithms.registry import load_recipe
from tempax.envs.registry import load_object
from tempax.experiments.episodes import recipe_reply_length, write_episodes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_first_rows_are_played_as_many_times_as_asked(tmp_path, monkeypatch):
    """2 rows x 3 attempts of the scripted price policy: 6 episodes, each the shipped transcript of its row."""
    monkeypatch.chdir(ROOT)
    cfg = load_recipe("grpo", "recipes/grpo_price_tools.yaml")
    policy = load_object("examples/price_tools.py:scripted_reply", "policy")
    out = str(tmp_path / "episodes.jsonl")
    assert write_episodes(cfg, "grpo", out, policy=policy, limit=2, attempts=3) == (6, 6)
    shipped = open("examples/price_episodes.jsonl").read().splitlines()
    assert open(out).read().splitlines() == [shipped[0]] * 3 + [shipped[1]] * 3
    assert all(json.loads(line)["reward"] >= 1.0 for line in shipped[:2])


def test_a_sampled_reply_is_as_long_as_the_recipes_own_sampling():
    """The reply length comes from the knobs section the record names (grpo: `grpo.max_new_tokens`)."""
    cfg = load_recipe("grpo", os.path.join(ROOT, "recipes", "grpo_price_tools.yaml"), ["grpo.max_new_tokens=77"])
    assert recipe_reply_length(cfg, "grpo") == 77
