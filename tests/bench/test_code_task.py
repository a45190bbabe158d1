"""bench/code_task.py's table from `tempax eval --out` files: per-problem outcomes, paired gains, rows not run."""

from __future__ import annotations

import json

from bench.code_task import outcomes, table, table_rows


def _eval_file(path, greedy: list[bool], sampled: list[list[bool]]) -> None:
    records = {"greedy": [{"correct": [g]} for g in greedy], "sampled": [{"correct": s} for s in sampled]}
    path.write_text(json.dumps({"records": records}))


def test_rows_pair_each_trained_model_with_the_base_on_the_same_problems(tmp_path):
    """4 problems. Base greedy right on #0 only; GRPO right on #0, #1, #2: +2/4 = +50.0 points (f = 2, g = 0).
    Sampled (2 per problem): base passes #3 once -> pass@2 1/4, per sample 1/8; GRPO passes #0 and #3 -> 2/4."""
    _eval_file(tmp_path / "base.json", [True, False, False, False], [[False, False]] * 3 + [[True, False]])
    _eval_file(tmp_path / "grpo_eval.json", [True, True, True, False],
               [[True, False], [False, False], [False, False], [False, True]])
    (tmp_path / "grpo.budget.json").write_text(json.dumps({"wall_s": 120.4, "cpu_s": 200.6, "exit": 0}))
    assert outcomes(str(tmp_path / "base.json"))["sampled_each"] == [False] * 6 + [True, False]
    base, grpo, rft = table_rows(str(tmp_path))
    assert base[2].startswith("25.0% [") and base[4].startswith("25.0% [") and base[6].startswith("12.5% [")
    assert grpo[1] == "120 / 201" and grpo[2].startswith("75.0% [") and grpo[3].startswith("+50.0 [")
    assert grpo[5].startswith("+25.0 [") and grpo[5].endswith("(inside its interval)")
    assert rft == ["RFT", "not run", "-", "-", "-", "-", "-"]
    assert "on 4 held-out code problems" in table(str(tmp_path))


def test_no_base_evaluation_gives_no_rows(tmp_path):
    assert table_rows(str(tmp_path)) == []
