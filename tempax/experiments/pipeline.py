"""A pipeline: stages chained on one model in memory and one set of held-out problems, each stage an algorithm
run (or none, for the model as given) followed by its evaluation, timed by one stopwatch.

    pipe = Pipeline(run_dir, evaluate=..., line=..., say=print)
    pipe.evaluate("base model", model)
    warm = pipe.train("sft", lambda: run_sft(model, ...)[0])
    pipe.evaluate("after SFT", warm, trained="sft")
    pipe.budgeted("(a) SFT again", "scarce sft", Budget.of(pipe.watch, "grpo", "cpu"), lambda hook: ...)
    print(pipe.table())

Every evaluation is appended to `outcomes.jsonl` in the run dir as soon as it exists (the stage, its per-problem
format and answer verdicts, its evaluation seconds and the training seconds so far): a pipeline stopped before the
end (a long comparison on a busy machine) still has what the paired intervals need for the stages it finished.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Sequence, TypeVar

from tempax.eval.evaluate import TaskEvaluation
from tempax.experiments.budget import Budget, StageBudget, Stopwatch
from tempax.experiments.tables import Evaluation, compare_lines, interval_table, outcomes

T = TypeVar("T")
OUTCOMES_FILE = "outcomes.jsonl"


class Pipeline:
    """Stages evaluated alike, in order (see the module docstring).

    Args:
      run_dir: where `outcomes.jsonl` is written (the stages' own run dirs are theirs to choose).
      evaluate: `fn(row, model, **options) -> TaskEvaluation` on the pipeline's held-out problems (`options`:
        what `Pipeline.evaluate` was given beyond the model, e.g. the environment a stage plays).
      line: the line said after an evaluation, `fn(row, evaluation, seconds it took)`.
      say: where progress lines go.
      watch: the stopwatch that times the stages (a new one by default; give the caller's to time the whole run,
        loading included, on one).
    """

    def __init__(self, run_dir: str, *, evaluate: Callable[..., TaskEvaluation],
                 line: Callable[[str, TaskEvaluation, float], str], say: Callable[[str], None],
                 watch: Stopwatch | None = None):
        self.run_dir, self._evaluate, self._line, self.say = run_dir, evaluate, line, say
        self.watch = watch or Stopwatch()
        self.evaluations: list[Evaluation] = []
        self.trained_by: dict[str, str] = {}  # a table row -> the stopwatch name of the training it evaluates
        self.training: list[str] = []  # stopwatch names of the training stages, in order
        self.budgeted_stages: dict[str, dict[str, float]] = {}  # a budgeted row -> its seconds, CPU seconds, steps

    def train(self, name: str, run: Callable[[], T]) -> T:
        """`run()` (an algorithm's training) timed as stage `name`."""
        with self.watch(name):
            out = run()
        if name not in self.training:
            self.training.append(name)
        return out

    def evaluate(self, row: str, model: Any, *, trained: str | None = None, **options: Any) -> TaskEvaluation:
        """Evaluates `model` as table row `row` (whose training was the stage named `trained`, if any), says its
        line and appends its outcomes to `outcomes.jsonl`."""
        timer = f"eval {row}"
        with self.watch(timer):
            r = self._evaluate(row, model, **options)
        self.evaluations.append((row, r))
        if trained is not None:
            self.trained_by[row] = trained
        self.say(self._line(row, r, self.watch.wall[timer]))
        with open(os.path.join(self.run_dir, OUTCOMES_FILE), "a") as f:
            f.write(json.dumps({"stage": row, "format_ok": outcomes(r, "format_ok"), "correct": outcomes(r, "correct"),
                                "eval_seconds": self.watch.wall[timer],
                                "trained_seconds": {k: self.watch.wall[k] for k in self.training},
                                "trained_cpu_seconds": {k: self.watch.cpu[k] for k in self.training}}) + "\n")
        return r

    def budgeted(self, row: str, name: str, budget: Budget,
                 run: Callable[[StageBudget], tuple[Any, int]]) -> TaskEvaluation:
        """A stage that trains until `budget` is spent: `run(hook)` trains with the budget's hook (created inside
        the stage's time, so its set-up counts) and returns (the trained model, its steps); the stage is timed as
        `name`, recorded in `budgeted_stages` and evaluated as row `row`."""
        trained, steps = self.train(name, lambda: run(budget.hook()))
        self.budgeted_stages[row] = {"seconds": self.watch.wall[name], "cpu_seconds": self.watch.cpu[name],
                                     "steps": steps}
        m, label = budget.matched, budget.label
        self.say(f"  trained in {self.watch.wall[name]:.0f} s wall ({label} {self.watch.wall[m]:.0f} s), "
                 f"{self.watch.cpu[name]:.0f} s process CPU ({label} {self.watch.cpu[m]:.0f} s)")
        return self.evaluate(row, trained, trained=name)

    def seconds(self) -> dict[str, float]:
        """Training wall seconds per evaluated row that was trained."""
        return {row: self.watch.wall[name] for row, name in self.trained_by.items()}

    def table(self) -> str:
        """Every evaluated row with its Wilson intervals and training seconds (`interval_table`)."""
        return interval_table(self.evaluations, self.seconds())

    def comparisons(self, pairs: Sequence[tuple[str, str]]) -> tuple[list[str], dict[str, Any]]:
        """The paired differences of `pairs` of rows that were evaluated (`compare_lines`)."""
        return compare_lines(self.evaluations, pairs)
