"""Evaluation metrics over per-sample outcomes: accuracy, unbiased pass@k, and a summary record.

Pure functions of booleans and numbers; no model, no generation. Per-problem outcomes are given as a "matrix":
one sequence per problem with one entry per sampled completion (rows may differ in length).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from n samples of which c are correct.

    Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (arXiv:2107.03374), eq. 1:

        pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i)

    The product form avoids the huge binomial coefficients of the first form. When n - c < k every k-subset
    contains a correct sample, so the estimate is exactly 1.
    """
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def _rows(matrix: Iterable[Iterable[object]]) -> list[list[bool]]:
    rows = [[bool(x) for x in row] for row in matrix]
    if not rows:
        raise ValueError("no problems given")
    if any(not row for row in rows):
        raise ValueError("every problem needs at least one sample")
    return rows


def mean_pass_at_k(correct_matrix: Iterable[Iterable[object]], k: int) -> float:
    """Mean over problems of `pass_at_k(n_i, c_i, k)`; row i holds the correctness of problem i's samples."""
    rows = _rows(correct_matrix)
    return sum(pass_at_k(len(row), sum(row), k) for row in rows) / len(rows)


def accuracy(flags: Iterable[object]) -> float:
    """Fraction of truthy entries (each entry one sample)."""
    values = [bool(x) for x in flags]
    if not values:
        raise ValueError("accuracy of an empty set of samples is undefined")
    return sum(values) / len(values)


def sample_accuracy(matrix: Iterable[Iterable[object]]) -> float:
    """Accuracy over all samples of all problems (a problem with more samples weighs more)."""
    return accuracy(x for row in _rows(matrix) for x in row)


def mean(values: Iterable[float]) -> float:
    items = [float(v) for v in values]
    if not items:
        raise ValueError("mean of no values is undefined")
    return sum(items) / len(items)


@dataclass(frozen=True)
class EvalSummary:
    """What an evaluation measured.

    num_problems / num_samples: problems evaluated and completions in total.
    format_accuracy: share of completions in the strict output format.
    answer_accuracy: share of completions whose answer is correct (mean pass@1 when all problems have equally
      many samples).
    pass_at_k: k -> mean unbiased pass@k over problems.
    mean_completion_length: mean completion length, in the unit the caller measured (usually tokens).
    """

    num_problems: int
    num_samples: int
    format_accuracy: float
    answer_accuracy: float
    mean_completion_length: float
    pass_at_k: dict[int, float] = field(default_factory=dict)

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """Flat name -> value dict for a metrics logger."""
        out = {
            f"{prefix}format_accuracy": self.format_accuracy,
            f"{prefix}answer_accuracy": self.answer_accuracy,
            f"{prefix}mean_completion_length": self.mean_completion_length,
            f"{prefix}num_problems": float(self.num_problems),
            f"{prefix}num_samples": float(self.num_samples),
        }
        for k, value in sorted(self.pass_at_k.items()):
            out[f"{prefix}pass@{k}"] = value
        return out


def summarize(
    format_ok: Sequence[Sequence[object]],
    correct: Sequence[Sequence[object]],
    completion_lengths: Sequence[Sequence[float]],
    ks: Sequence[int] = (1,),
) -> EvalSummary:
    """Build an `EvalSummary` from per-problem, per-sample outcomes (three matrices of the same shape)."""
    format_rows, correct_rows = _rows(format_ok), _rows(correct)
    length_rows = [list(row) for row in completion_lengths]
    shapes = [[len(r) for r in m] for m in (format_rows, correct_rows, length_rows)]
    if not shapes[0] == shapes[1] == shapes[2]:
        raise ValueError("format_ok, correct and completion_lengths must have the same per-problem sample counts")
    fewest = min(len(row) for row in correct_rows)
    too_big = [k for k in ks if k > fewest]
    if too_big:
        raise ValueError(f"pass@k for k={too_big} needs at least that many samples per problem; fewest is {fewest}")
    return EvalSummary(
        num_problems=len(correct_rows),
        num_samples=sum(len(row) for row in correct_rows),
        format_accuracy=sample_accuracy(format_rows),
        answer_accuracy=sample_accuracy(correct_rows),
        mean_completion_length=mean(x for row in length_rows for x in row),
        pass_at_k={k: mean_pass_at_k(correct_rows, k) for k in ks},
    )
