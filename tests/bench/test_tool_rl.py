"""bench/tool_rl.py: disjoint basket sets from the user's example, and the table from a run's outcome files."""

from __future__ import annotations

import json
import os

import pytest

from bench.tool_rl import REPO, STAGES, basket_key, new_baskets, table, table_rows


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # the example's file is named relative to the repository root, as in the recipe


def test_new_baskets_avoid_the_taken_ones_and_each_other(in_repo):
    taken = {(("apple", 1), ("orange", 2))}
    first = new_baskets(300, seed=1, taken=taken)
    second = new_baskets(200, seed=2, taken=taken)
    keys = [basket_key(r) for r in first + second]
    assert len(set(keys)) == 500 and (("apple", 1), ("orange", 2)) not in keys
    assert len(taken) == 501  # the set grew by every basket handed out
    assert all(2 <= len(r["items"]) <= 3 and all(1 <= n <= 4 for _, n in r["items"]) for r in first)
    assert new_baskets(5, seed=1, taken=set()) == first[:5]  # the same seed, the same baskets


def test_a_basket_row_carries_its_total(in_repo):
    """2 cheese at 560 + 3 tea at 410 = 1120 + 1230 = 2350 cents."""
    from tempax.envs.registry import load_object
    row = load_object("examples/price_tools.py:basket_row", "test")([["cheese", 2], ["tea", 3]])
    assert row["answer"] == "2350" and "2 cheese and 3 tea" in row["prompt_messages"][0]["content"]


def _outcomes(out, stage: str, correct: list[bool]) -> None:
    with open(os.path.join(out, "outcomes.jsonl"), "a") as f:
        f.write(json.dumps({"stage": stage, "format_ok": correct, "correct": correct}) + "\n")


def test_rows_pair_grpo_with_each_other_stage_on_the_same_baskets(tmp_path):
    """4 baskets. Warm-start right on #0; GRPO right on #0, #1, #2: +2/4 = +50.0 points (f = 2, g = 0).
    More SFT was not evaluated: "not run"."""
    _outcomes(tmp_path, STAGES[0], [True, False, False, False])
    _outcomes(tmp_path, STAGES[1], [True, True, True, False])
    (tmp_path / "stages.json").write_text(json.dumps({
        STAGES[0]: {"wall_s": 100.2, "cpu_s": 170.6, "steps": 12},
        STAGES[1]: {"wall_s": 700.4, "cpu_s": 1200.0, "steps": 20}}))
    warm, grpo, more = table_rows(str(tmp_path))
    assert warm[:3] == [STAGES[0], "12", "100 / 171"] and warm[3].startswith("25.0% [")
    assert warm[4].startswith("+50.0 [") and warm[4].endswith("(inside its interval)")
    assert grpo[1] == "20" and grpo[2] == "700 / 1200" and grpo[3].startswith("75.0% [") and grpo[4] == "-"
    assert more == [STAGES[2], "not run", "-", "-", "-"]
    assert table(str(tmp_path)).count("\n") == 4  # header, rule, three rows


def test_a_stage_evaluated_twice_counts_its_last_evaluation(tmp_path):
    _outcomes(tmp_path, STAGES[0], [False, False])
    _outcomes(tmp_path, STAGES[0], [True, False])
    assert table_rows(str(tmp_path))[0][3].startswith("50.0% [")
