"""tempax.rewards.correctness: answers compared with references, numerically first, then by math-verify."""

from __future__ import annotations

import threading

import pytest

from tempax.rewards.correctness import answer_correctness_reward, answers_match
from tests.rewards.texts import GOOD, completion


# ---------------------------------------------------------------- correctness


@pytest.mark.parametrize(
    "prediction, reference",
    [
        ("71", "71"),
        ("1,080", "1080"),  # thousands separator in the prediction
        ("1080", "1,080"),  # ... or in the reference
        ("-3", "-3"),
        ("\u22123", "-3"),  # unicode minus
        ("3.50", "3.5"),
        ("$1,080.00 dollars.", "1080"),  # currency, decimals, unit, trailing period
        ("\\$72", "72"),
        ("71 marbles", "71"),
        ("  71  ", "71"),
        ("71", "Natalia sold 48+24 = 72 clips... \n#### 71"),  # a full GSM8K solution as reference
        ("71", 71),  # a non-string reference
        ("70+2", "72"),  # math-verify: an unevaluated expression covering every number
        ("\\frac{1}{2}", "0.5"),
        ("\\boxed{71}", "71"),
        ("$1{,}080$", "1080"),
    ],
)
def test_answers_match(prediction: str, reference: object) -> None:
    assert answers_match(prediction, reference)


@pytest.mark.parametrize(
    "prediction, reference",
    [
        (None, "71"),
        ("", "71"),
        ("3", "-3"),  # sign matters
        ("-3", "3"),
        ("70", "71"),
        ("...", "71"),
        ("seventy-one", "71"),
        ("5 or 71", "71"),  # hedge: math-verify alone would read the last number
        ("5, 71", "71"),
        ("71, 5", "71"),
        ("5 and 71", "71"),
        ("5 \\boxed{71}", "71"),
        ("$70 \\lor 71$", "71"),
        ("$5 = 71$", "71"),  # math-verify alone compares the right-hand side
        ("70 + 1 = 71", "71"),  # several numbers, not one value
        ("7" * 300, "71"),  # absurdly long answers are wrong without parsing
    ],
)
def test_answers_do_not_match(prediction: str | None, reference: str) -> None:
    assert not answers_match(prediction, reference)


def test_answer_correctness_reward() -> None:
    completions = [GOOD, completion(answer="1,080"), completion(answer="5 or 71"), "71", completion(answer="-3")]
    rewards = answer_correctness_reward(["p"] * 5, completions, answer=["71", "1080", "71", "71", "-3"])
    assert rewards == [1.0, 1.0, 0.0, 0.0, 1.0]  # "71" without tags has nothing to extract


def test_answer_correctness_reward_is_fast(monkeypatch) -> None:
    """1000 plain-number completions (half right, half wrong) are judged on the numeric path alone: math-verify
    (sympy, milliseconds a call) is never called for them."""
    from tempax.rewards import correctness

    calls = []
    monkeypatch.setattr(correctness, "_math_verify_equal", lambda *args: calls.append(args) or False)
    completions = [completion(answer=str(i % 2)) for i in range(1000)]
    rewards = answer_correctness_reward(["p"] * 1000, completions, answer=["1"] * 1000)
    assert sum(rewards) == 500 and calls == []
    assert answers_match("70+2", "72") is False and calls == [("70+2", "72")]  # what does reach it


def test_answer_correctness_works_outside_the_main_thread() -> None:
    """math-verify's signal timeouts are switched off, so a worker thread can call it."""
    result: list[list[float]] = []
    worker = threading.Thread(
        target=lambda: result.append(answer_correctness_reward(["p"], [completion(answer="70+2")], answer=["72"]))
    )
    worker.start()
    worker.join(timeout=30)
    assert result == [[1.0]]
