"""Evaluation metrics: pass@k against hand-computed binomials, accuracies and the summary record."""

from __future__ import annotations

from math import comb

import pytest

from tempax.eval.metrics import EvalSummary, accuracy, mean_pass_at_k, pass_at_k, sample_accuracy, summarize


def test_pass_at_k_hand_values() -> None:
    """pass@k = 1 - C(n-c, k) / C(n, k):
    n=5, c=2, k=1: 1 - C(3,1)/C(5,1) = 1 - 3/5 = 0.4
    n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    n=5, c=2, k=4: n - c = 3 < 4, every 4-subset holds a correct sample -> 1.0
    n=5, c=0, k=3: nothing correct -> 0.0
    n=10, c=10, k=1: 1.0
    n=4, c=1, k=4: 1.0 (n - c = 3 < 4)
    n=10, c=3, k=5: 1 - C(7,5)/C(10,5) = 1 - 21/252 = 0.916666...
    """
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 4) == 1.0
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)


def test_pass_at_k_matches_binomials_and_stays_stable() -> None:
    """The product form equals 1 - C(n-c,k)/C(n,k) with the binomials computed exactly as integers (C(100, 50) is
    about 1e29), and 1 correct of 1000 gives pass@1 = 1/1000."""
    for n, c, k in [(20, 3, 5), (200, 7, 10), (200, 1, 1), (100, 50, 50)]:
        exact = 1 - comb(n - c, k) / comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12, abs=1e-15)
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001)


@pytest.mark.parametrize("n, c, k", [(0, 0, 1), (5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_pass_at_k_rejects_impossible_inputs(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_pass_at_k() -> None:
    """Problem A: 2 of 5 correct, problem B: 0 of 5, problem C: 5 of 5.
    pass@1 = (0.4 + 0 + 1) / 3 = 0.4666...; pass@2 = (0.7 + 0 + 1) / 3 = 0.5666..."""
    matrix = [[1, 0, 1, 0, 0], [0, 0, 0, 0, 0], [True] * 5]
    assert mean_pass_at_k(matrix, 1) == pytest.approx(1.4 / 3)
    assert mean_pass_at_k(matrix, 2) == pytest.approx(1.7 / 3)
    with pytest.raises(ValueError):
        mean_pass_at_k([], 1)


def test_accuracies() -> None:
    """accuracy([T, F, T, T]) = 3/4; sample accuracy of ragged rows [[1], [0, 0, 1]] = 2/4."""
    assert accuracy([True, False, True, True]) == 0.75
    assert sample_accuracy([[1], [0, 0, 1]]) == 0.5
    with pytest.raises(ValueError):
        accuracy([])


def test_summarize() -> None:
    """2 problems x 2 samples.
    format ok: [[T, T], [T, F]] -> 3/4 = 0.75
    correct:   [[T, F], [F, F]] -> 1/4 = 0.25; pass@1 = (0.5 + 0) / 2 = 0.25; pass@2 = (1 + 0) / 2 = 0.5
    lengths:   [[10, 20], [30, 40]] -> 25.0
    """
    summary = summarize(
        format_ok=[[True, True], [True, False]],
        correct=[[True, False], [False, False]],
        completion_lengths=[[10, 20], [30, 40]],
        ks=(1, 2),
    )
    assert summary == EvalSummary(
        num_problems=2,
        num_samples=4,
        format_accuracy=0.75,
        answer_accuracy=0.25,
        mean_completion_length=25.0,
        pass_at_k={1: 0.25, 2: 0.5},
    )
    metrics = summary.metrics()
    assert metrics["eval/pass@2"] == 0.5
    assert metrics["eval/format_accuracy"] == 0.75
    with pytest.raises(ValueError, match="pass@k"):
        summarize([[1]], [[1]], [[5]], ks=(2,))
    with pytest.raises(ValueError, match="same"):
        summarize([[1, 1]], [[1]], [[5]])


def test_wilson_interval_hand_values() -> None:
    """Wilson: centre = (p + z^2/2n) / (1 + z^2/n), half = z / (1 + z^2/n) * sqrt(p(1-p)/n + z^2/4n^2), z = 1.96.

    k=120, n=200: p = 0.6, z^2 = 3.8415, z^2/n = 0.019207, denominator 1.019207;
      centre = (0.6 + 0.0096037) / 1.019207 = 0.598115
      half = 1.923026 * sqrt(0.0012 + 0.00002401) = 1.923026 * 0.0349859 = 0.067279
      -> [0.530836, 0.665394]
    k=0, n=10: p = 0, z^2/n = 0.3841459, denominator 1.3841459; centre = 0.1920729 / 1.3841459 = 0.138767,
      half = (1.959964 / 1.3841459) * sqrt(0 + z^2/400) = 1.416014 * 0.0979982 = 0.138766 -> [0, 0.277533]
    k=81, n=263: Newcombe's (1998) worked example of the score interval: 0.2553 to 0.3662.
    """
    from tempax.eval.metrics import wilson_interval

    assert wilson_interval(120, 200) == pytest.approx((0.530836, 0.665394), abs=2e-6)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.277533), abs=2e-6)
    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    lo, hi = wilson_interval(10, 10)
    assert hi == pytest.approx(1.0) and lo == pytest.approx(1 - 0.277533, abs=2e-6)  # symmetric in k <-> n - k
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(3, 2)


def test_paired_difference_interval_hand_values() -> None:
    """Newcombe's paired interval (method 10) on 20 problems: both right e=8, only A f=2, only B g=1, neither h=9.

    p_a = 10/20 = 0.5, p_b = 9/20 = 0.45, D = 0.05; z = 1.959964, z^2 = 3.841459, 1 + z^2/20 = 1.192073,
    z / 1.192073 = 1.644164, z^2 / 4n^2 = 0.0024009.
    Wilson(10, 20): centre 0.5, half = 1.644164 * sqrt(0.0125 + 0.0024009) = 0.200702 -> [0.299298, 0.700702]
    Wilson(9, 20): centre = (0.45 + 0.096036) / 1.192073 = 0.458056, half = 1.644164 * sqrt(0.012375 + 0.0024009)
      = 0.199858 -> [0.258198, 0.657915]; so p_a - l_a = u_a - p_a = 0.200702, u_b - p_b = 0.207915,
      p_b - l_b = 0.191802.
    eh - fg = 72 - 2 = 70 > n/2 = 10 -> C = 60; (e+f)(g+h)(e+g)(f+h) = 10*10*9*11 = 9900; phi = 60 / 99.4987
      = 0.603023
    low  = 0.05 - sqrt(0.040281 - 2*0.603023*0.200702*0.207915 + 0.043229) = 0.05 - sqrt(0.033183) = -0.132162
    high = 0.05 + sqrt(0.040281 - 2*0.603023*0.200702*0.191802 + 0.036788) = 0.05 + sqrt(0.030642) = 0.225049
    """
    from tempax.eval.metrics import paired_difference_interval

    a = [1] * 8 + [1] * 2 + [0] * 1 + [0] * 9
    b = [1] * 8 + [0] * 2 + [1] * 1 + [0] * 9
    d = paired_difference_interval(a, b)
    assert (d.both, d.only_a, d.only_b, d.neither) == (8, 2, 1, 9)
    assert d.difference == pytest.approx(0.05)
    assert d.low == pytest.approx(-0.132162, abs=5e-6) and d.high == pytest.approx(0.225049, abs=5e-6)
    # Swapping the two models mirrors the interval.
    r = paired_difference_interval(b, a)
    assert (r.difference, r.low, r.high) == pytest.approx((-d.difference, -d.high, -d.low))
    # Identical outcomes, e = h = 10: C = 100 - 10 = 90, phi = 90 / sqrt(10^4) = 0.9, half-width
    # sqrt(2 * 0.200702^2 * (1 - 0.9)) = 0.089757 (independent samples, phi = 0: 0.283836).
    same = paired_difference_interval(a, a)
    assert same.difference == 0 and (same.low, same.high) == pytest.approx((-0.089757, 0.089757), abs=5e-6)


def test_paired_interval_is_narrower_than_independent_and_near_mcnemar_wald_for_large_n() -> None:
    """On 2000 problems (e=800, f=200, g=100, h=900) the score interval is close to the Wald interval for paired
    proportions, D +- 1.96 sqrt(f + g - (f - g)^2 / n) / n = 0.05 +- 1.96 * sqrt(300 - 5) / 2000 = 0.05 +- 0.016832,
    and much narrower than treating the runs as independent (phi = 0): 0.05 +- about 0.031."""
    from tempax.eval.metrics import paired_difference_interval, wilson_interval

    a = [1] * 800 + [1] * 200 + [0] * 100 + [0] * 900
    b = [1] * 800 + [0] * 200 + [1] * 100 + [0] * 900
    d = paired_difference_interval(a, b)
    assert d.low == pytest.approx(0.05 - 0.016832, abs=1.5e-3) and d.high == pytest.approx(0.05 + 0.016832, abs=1.5e-3)
    la, ua = wilson_interval(1000, 2000)
    lb, ub = wilson_interval(900, 2000)
    independent_low = 0.05 - ((0.5 - la) ** 2 + (ub - 0.45) ** 2) ** 0.5
    assert 0.05 - independent_low > 1.7 * (0.05 - d.low)
    with pytest.raises(ValueError, match="same problems"):
        paired_difference_interval([1, 0], [1])


def test_difference_interval_reproduces_newcombes_published_examples():
    """Newcombe (1998, Stat. Med. 17:873), Table II, method 10: 56/70 - 48/80 = 0.2000 with 95% interval
    [0.0524, 0.3339], and 5/56 - 0/29 = 0.0893 with [-0.0381, 0.1926] (the paper's figures, to 4 decimals)."""
    from tempax.eval.metrics import difference_interval

    d, low, high = difference_interval(56, 70, 48, 80)
    assert (round(d, 4), round(low, 4), round(high, 4)) == (0.2, 0.0524, 0.3339)
    d, low, high = difference_interval(5, 56, 0, 29)
    assert (round(d, 4), round(low, 4), round(high, 4)) == (0.0893, -0.0381, 0.1926)


def test_pass_at_k_interval_hand_values() -> None:
    """One greedy sample per problem, 1 of 10 solved: Wilson's interval of 1/10, p = 0.1, z^2/n = 0.384146,
    denominator 1.384146: centre = (0.1 + 0.192073) / 1.384146 = 0.211013, half = 1.416014 * sqrt(0.009 +
    0.0096037) = 1.416014 * 0.136396 = 0.193137 -> [0.017876, 0.404150].

    Two samples each, [[1, 0], [1, 1]], k = 1: per-problem pass@1 0.5 and 1.0, m = 0.75, s^2 = (0.0625 + 0.0625) / 1
    = 0.125, s = 0.353553, half = 1.959964 * 0.353553 / sqrt(2) = 0.489991 -> [0.260009, 1.239991 clipped to 1].
    """
    from tempax.eval.metrics import pass_at_k_interval

    assert pass_at_k_interval([[1]] + [[0]] * 9, 1) == pytest.approx((0.1, 0.017876, 0.404150), abs=2e-6)
    assert pass_at_k_interval([[1, 0], [1, 1]], 1) == pytest.approx((0.75, 0.260009, 1.0), abs=2e-6)
    assert pass_at_k_interval([[True, False]], 2) == (1.0, 0.0, 1.0)  # one problem: no spread to measure


def test_paired_mean_difference_interval_hand_values() -> None:
    """Four items, a = [2.0, 1.5, 3.0, 2.5], b = [1.8, 1.6, 2.7, 2.1]: d = [0.2, -0.1, 0.3, 0.4], mean 0.2;
    squared deviations 0 + 0.09 + 0.01 + 0.04 = 0.14, s^2 = 0.14 / 3 = 0.046667, s = 0.216025; Student's t with
    3 degrees of freedom, 97.5% quantile 3.182446; half-width 3.182446 * 0.216025 / sqrt(4) = 0.343744, so
    [-0.143744, 0.543744]: the difference is inside its interval on four items."""
    from tempax.eval.metrics import paired_mean_difference_interval

    d = paired_mean_difference_interval([2.0, 1.5, 3.0, 2.5], [1.8, 1.6, 2.7, 2.1])
    assert d.n == 4 and d.difference == pytest.approx(0.2)
    assert (d.low, d.high) == pytest.approx((-0.143744, 0.543744), abs=5e-6)
    swapped = paired_mean_difference_interval([1.8, 1.6, 2.7, 2.1], [2.0, 1.5, 3.0, 2.5])
    assert (swapped.difference, swapped.low, swapped.high) == pytest.approx((-0.2, -0.543744, 0.143744), abs=5e-6)
    with pytest.raises(ValueError, match="same items"):
        paired_mean_difference_interval([1.0, 2.0], [1.0])
