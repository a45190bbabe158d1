"""The pipeline: stages evaluated in order, each evaluation said and written to outcomes.jsonl as it comes, the
table's training seconds taken from the stage each row names, and a budgeted stage trained under a fresh budget
hook and recorded with its steps."""

from __future__ import annotations

import json

from tempax.eval.evaluate import Scored, TaskEvaluation
from tempax.eval.metrics import summarize
from tempax.experiments.budget import Budget, StageBudget
from tempax.experiments.pipeline import OUTCOMES_FILE, Pipeline
from tempax.experiments.tables import compare_lines, interval_table


def evaluation(format_ok: list[bool], correct: list[bool]) -> TaskEvaluation:
    """A greedy evaluation with one completion per problem and the given verdicts."""
    records = [Scored(f"q{i}", "1", ["c"], [f], [c], [3]) for i, (f, c) in enumerate(zip(format_ok, correct))]
    summary = summarize([r.format_ok for r in records], [r.correct for r in records], [r.lengths for r in records])
    return TaskEvaluation(summary, None, records, [], 0.0)


# Four held-out problems (format, answer): the base model has 1 in format and 1 right, the trained one 4 in
# format and 3 right (both right on problem 0).
VERDICTS = {"base": ([True, False, False, False], [True, False, False, False]),
            "trained": ([True, True, True, True], [True, True, True, False])}


def test_stages_are_evaluated_in_order_and_written_as_they_come(tmp_path):
    said: list[str] = []
    pipe = Pipeline(str(tmp_path), evaluate=lambda row, model: evaluation(*VERDICTS[model]),
                    line=lambda row, r, seconds: f"{row}: {r.answer_accuracy:.0%}", say=said.append)
    pipe.evaluate("base model", "base")
    trained = pipe.train("sft", lambda: "trained")
    pipe.evaluate("after SFT", trained, trained="sft")
    assert said == ["base model: 25%", "after SFT: 75%"]
    written = [json.loads(line) for line in (tmp_path / OUTCOMES_FILE).read_text().splitlines()]
    assert [w["stage"] for w in written] == ["base model", "after SFT"]
    assert written[1]["correct"] == [True, True, True, False] and written[1]["format_ok"] == [True] * 4
    assert written[0]["trained_seconds"] == {} and set(written[1]["trained_seconds"]) == {"sft"}
    assert pipe.seconds() == {"after SFT": pipe.watch.wall["sft"]}
    assert pipe.table() == interval_table(pipe.evaluations, pipe.seconds())
    table = pipe.table().splitlines()
    assert table[2].split()[:3] == ["base", "model", "25.0"] and table[2].split()[-1] == "-"
    # Paired: right in both on problem 0, only the trained model on problems 1 and 2: +50 points.
    lines, numbers = pipe.comparisons([("after SFT", "base model"), ("after SFT", "not evaluated")])
    assert lines == compare_lines(pipe.evaluations, [("after SFT", "base model")])[0]
    answers = numbers["after SFT minus base model"]["answers"]
    assert (answers["both"], answers["only_a"], answers["only_b"], answers["neither"]) == (1, 2, 0, 1)
    assert answers["difference"] == 0.5


def test_a_budgeted_stage_trains_under_a_fresh_hook_and_records_its_steps(tmp_path):
    said: list[str] = []
    pipe = Pipeline(str(tmp_path), evaluate=lambda row, model: evaluation(*VERDICTS[model]),
                    line=lambda row, r, seconds: row, say=said.append)
    pipe.train("grpo", lambda: None)
    budget = Budget.of(pipe.watch, "grpo", "cpu", label="GRPO")
    assert budget.seconds == pipe.watch.cpu["grpo"] and budget.spent == "process CPU seconds"
    hooks: list[StageBudget] = []

    def run(hook: StageBudget) -> tuple[str, int]:
        hooks.append(hook)
        return "trained", 7

    pipe.budgeted("(a) SFT again", "scarce sft", budget, run)
    assert hooks[0].seconds == budget.seconds and hooks[0].kind == "cpu"
    assert pipe.budgeted_stages["(a) SFT again"]["steps"] == 7
    assert said[0].startswith("  trained in ") and "(GRPO " in said[0] and said[1] == "(a) SFT again"
    assert pipe.trained_by == {"(a) SFT again": "scarce sft"}
