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


Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile: two-sided 95% intervals


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval (Wilson 1927, "Probable inference, the law of succession, and statistical
    inference", JASA 22:209) for a binomial proportion p from `successes` out of `n` trials:

        p^ = k / n
        centre = (p^ + z^2 / (2n)) / (1 + z^2 / n)
        half   = z / (1 + z^2 / n) * sqrt(p^ (1 - p^) / n + z^2 / (4 n^2))
        interval = [centre - half, centre + half]

    Unlike the Wald interval p^ +- z sqrt(p^(1-p^)/n) it stays inside [0, 1] and does not collapse to a point at
    k = 0 or k = n. z = 1.96 gives the two-sided 95% interval.
    """
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval needs n >= 1 and 0 <= successes <= n, got successes={successes}, n={n}")
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z / denom * (p * (1.0 - p) / n + z2 / (4.0 * n * n)) ** 0.5
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_at_k_interval(correct_matrix: Iterable[Iterable[object]], k: int, z: float = Z_95) -> tuple[float, float, float]:
    """(mean pass@k, low, high) over problems, with a 95% interval that treats the problems as the sample.

    With one sample per problem and k = 1 each problem is solved or not, and the interval is Wilson's
    (`wilson_interval`) of the solved count. Otherwise the per-problem estimates x_i = pass_at_k(n_i, c_i, k)
    (Chen et al. 2021, eq. 1) lie in [0, 1] and the interval is the normal one of their mean, clipped to [0, 1]:

        m = mean(x_i),  s^2 = sum (x_i - m)^2 / (P - 1),  [m - z s / sqrt(P), m + z s / sqrt(P)]

    It counts the spread between problems only, not the sampling noise within a problem's n_i samples, which the
    unbiased estimator averages out as n_i grows.
    """
    rows = _rows(correct_matrix)
    if all(len(row) == 1 for row in rows) and k == 1:
        solved = sum(row[0] for row in rows)
        low, high = wilson_interval(solved, len(rows), z)
        return solved / len(rows), low, high
    values = [pass_at_k(len(row), sum(row), k) for row in rows]
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, 0.0, 1.0
    sd = (sum((v - m) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    half = z * sd / len(values) ** 0.5
    return m, max(0.0, m - half), min(1.0, m + half)


@dataclass(frozen=True)
class PairedDifference:
    """A - B on the same problems: the difference of the two proportions, its interval and the 2x2 counts
    (both: solved by both; only_a / only_b: by one of them; neither)."""

    difference: float
    low: float
    high: float
    both: int
    only_a: int
    only_b: int
    neither: int


def paired_difference_interval(a: Sequence[object], b: Sequence[object], z: float = Z_95) -> PairedDifference:
    """Interval for p_a - p_b when a[i] and b[i] are two models' outcomes on the same problem i: Newcombe's
    hybrid score interval for paired proportions (Newcombe 1998, "Improved confidence intervals for the
    difference between binomial proportions based on paired data", Stat. Med. 17:2635, method 10).

    With the 2x2 counts e = both right, f = only a right, g = only b right, h = both wrong, n = e + f + g + h:

        p_a = (e + f) / n,  p_b = (e + g) / n,  D = p_a - p_b = (f - g) / n
        [l_a, u_a], [l_b, u_b] = Wilson intervals of p_a and p_b
        phi = C / sqrt((e+f)(g+h)(e+g)(f+h)),  C = eh - fg - n/2 if eh - fg > n/2;  0 if 0 <= eh - fg <= n/2;
              eh - fg if eh - fg < 0;  phi = 0 when the square root is 0
        low  = D - sqrt((p_a - l_a)^2 - 2 phi (p_a - l_a)(u_b - p_b) + (u_b - p_b)^2)
        high = D + sqrt((u_a - p_a)^2 - 2 phi (u_a - p_a)(p_b - l_b) + (p_b - l_b)^2)

    Pairing matters: two models evaluated on the same problems agree on most of them (easy ones both solve, hard
    ones both miss), the positive phi shrinks the interval, and only the f + g discordant problems carry
    information about the difference. Treating the two runs as independent samples (Newcombe's interval for
    independent proportions, phi = 0 above) would overstate the uncertainty.
    """
    if len(a) != len(b):
        raise ValueError(f"paired outcomes need the same problems: {len(a)} vs {len(b)} outcomes")
    if not a:
        raise ValueError("paired_difference_interval of no problems is undefined")
    pairs = [(bool(x), bool(y)) for x, y in zip(a, b)]
    e = sum(x and y for x, y in pairs)
    f = sum(x and not y for x, y in pairs)
    g = sum(y and not x for x, y in pairs)
    h = len(pairs) - e - f - g
    n = len(pairs)
    pa, pb = (e + f) / n, (e + g) / n
    la, ua = wilson_interval(e + f, n, z)
    lb, ub = wilson_interval(e + g, n, z)
    cross = e * h - f * g
    c = cross - n / 2 if cross > n / 2 else (0.0 if cross >= 0 else float(cross))
    margins = (e + f) * (g + h) * (e + g) * (f + h)
    phi = c / margins ** 0.5 if margins > 0 else 0.0
    d = pa - pb
    low = d - max(0.0, (pa - la) ** 2 - 2 * phi * (pa - la) * (ub - pb) + (ub - pb) ** 2) ** 0.5
    high = d + max(0.0, (ua - pa) ** 2 - 2 * phi * (ua - pa) * (pb - lb) + (pb - lb) ** 2) ** 0.5
    return PairedDifference(difference=d, low=low, high=high, both=e, only_a=f, only_b=g, neither=h)


def difference_interval(successes_a: int, n_a: int, successes_b: int, n_b: int,
                        z: float = Z_95) -> tuple[float, float, float]:
    """(p_a - p_b, low, high) for two independent proportions: Newcombe's hybrid score interval (Newcombe 1998,
    "Interval estimation for the difference between independent proportions", Stat. Med. 17:873, method 10):

        D = p_a - p_b,   [l_a, u_a], [l_b, u_b] = Wilson intervals
        low  = D - sqrt((p_a - l_a)^2 + (u_b - p_b)^2)
        high = D + sqrt((u_a - p_a)^2 + (p_b - l_b)^2)

    When both proportions come from the same problems and the per-problem outcomes are known, the paired interval
    (`paired_difference_interval`) is narrower; this one needs only the counts, so it is conservative there.
    """
    pa, pb = successes_a / n_a, successes_b / n_b
    la, ua = wilson_interval(successes_a, n_a, z)
    lb, ub = wilson_interval(successes_b, n_b, z)
    d = pa - pb
    return d, d - ((pa - la) ** 2 + (ub - pb) ** 2) ** 0.5, d + ((ua - pa) ** 2 + (pb - lb) ** 2) ** 0.5


@dataclass(frozen=True)
class PairedMeanDifference:
    """mean(a - b) over the same items, its 95% interval, and the items and degrees of freedom behind it."""

    difference: float
    low: float
    high: float
    n: int


def paired_mean_difference_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> PairedMeanDifference:
    """Student's t interval for the mean of d_i = a_i - b_i, two measurements of the same item i (the paired t
    interval; e.g. one held-out example's mean token loss under two models):

        d = mean(d_i),  s^2 = sum (d_i - d)^2 / (n - 1),  [d - t s / sqrt(n), d + t s / sqrt(n)]

    t is the (1 + level) / 2 quantile of Student's t with n - 1 degrees of freedom (2.262 for n = 10, 1.972 for
    n = 200; the normal's 1.960 in the limit). Pairing removes what the items share (an example that is hard for
    one model is hard for the other), so the interval is far narrower than one for two independent means.
    """
    if len(a) != len(b):
        raise ValueError(f"paired values need the same items: {len(a)} vs {len(b)} values")
    if len(a) < 2:
        raise ValueError(f"a paired t interval needs at least 2 items, got {len(a)}")
    # Imported here: scipy (a dependency of JAX) takes a while to import, and only this interval needs it.
    from scipy.stats import t as student_t

    d = [float(x) - float(y) for x, y in zip(a, b)]
    n = len(d)
    m = sum(d) / n
    sd = (sum((x - m) ** 2 for x in d) / (n - 1)) ** 0.5
    half = float(student_t.ppf((1 + level) / 2, n - 1)) * sd / n ** 0.5
    return PairedMeanDifference(difference=m, low=m - half, high=m + half, n=n)
