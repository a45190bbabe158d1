"""tempax.experiments.tables: the stages' table with Wilson intervals and the paired differences between stages."""

from __future__ import annotations

from tempax.eval.evaluate import Scored, TaskEvaluation
from tempax.experiments.tables import compare_lines, interval_table, outcomes


def evaluation(format_ok: list[bool], correct: list[bool]) -> TaskEvaluation:
    records = [Scored(question=f"q{i}", answer="1", completions=["c"], format_ok=[f], correct=[c], lengths=[3])
               for i, (f, c) in enumerate(zip(format_ok, correct))]
    return TaskEvaluation(greedy=None, sampled=None, greedy_records=records)


BASE = evaluation([True, True, True, True], [True, False, False, False])
TRAINED = evaluation([True, True, True, True], [True, True, False, False])


def test_outcomes_are_the_greedy_verdicts_per_problem():
    assert outcomes(TRAINED, "correct") == [True, True, False, False]
    assert outcomes(BASE, "format_ok") == [True] * 4


def test_the_table_shows_each_stage_with_wilson_intervals():
    """Wilson 95% (z = 1.96, z^2 = 3.8416) for 2 of 4: centre (0.5 + 3.8416/8) / (1 + 3.8416/4) = 0.5, half-width
    1.96 sqrt(0.25/4 + 3.8416/64) / 1.9604 = 0.34997 -> [15.0, 85.0]; for 4 of 4: centre 1.4802 / 1.9604 =
    0.75505, half-width 1.96 sqrt(3.8416/64) / 1.9604 = 0.24495 -> [51.0, 100.0]; for 1 of 4: centre
    (0.25 + 0.4802) / 1.9604 = 0.37237, half-width 1.96 sqrt(0.1875/4 + 0.060025) / 1.9604 = 0.32687 -> [4.6, 69.9].
    The training seconds are shown where given, '-' elsewhere."""
    lines = interval_table([("base", BASE), ("after GRPO", TRAINED)], {"after GRPO": 61.4}).splitlines()
    assert lines[0].split("  ")[0] == "stage" and set(lines[1]) == {"-", " "}
    assert lines[2].split() == ["base", "100.0", "[", "51.0,", "100.0]", "25.0", "[", "4.6,", "69.9]", "4", "-"]
    assert lines[3].split() == ["after", "GRPO", "100.0", "[", "51.0,", "100.0]", "50.0", "[", "15.0,", "85.0]", "4",
                                "61"]


def test_paired_differences_count_the_problems_both_stages_saw():
    """TRAINED minus BASE on answers: right in both 1, TRAINED only 1, BASE only 0, neither 2 -> +25.0 points;
    format: both right on all 4 -> +0.0. A pair naming a stage that was not evaluated is left out."""
    lines, numbers = compare_lines([("base", BASE), ("trained", TRAINED)],
                                   [("trained", "base"), ("trained", "missing")])
    answers = numbers["trained minus base"]["answers"]
    assert answers["difference"] == 0.25 and answers["low"] < 0.25 < answers["high"]
    assert (answers["both"], answers["only_a"], answers["only_b"], answers["neither"]) == (1, 1, 0, 2)
    assert numbers["trained minus base"]["format"]["difference"] == 0.0
    assert list(numbers) == ["trained minus base"] and len(lines) == 2
    assert lines[0].startswith("trained minus base, answers: +25.0 points, 95% CI [")
    assert lines[0].endswith("(paired, Newcombe; right in both 1, first only 1, second only 0, neither 2)")
