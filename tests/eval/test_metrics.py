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
