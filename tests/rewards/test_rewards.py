"""Reward functions: strict format, answer extraction, correctness, and failure-safe combination."""

from __future__ import annotations

import threading
import time

import pytest

from tempax.errors import ConfigError
from tempax.rewards import (
    answer_correctness_reward,
    answers_match,
    combine_rewards,
    extract_answer,
    format_reward,
    format_score,
    is_placeholder,
    safe_reward,
    strict_format_ok,
    tags_in_order,
)

GOOD = "<reasoning>\n23 + 48 = 71\n</reasoning>\n<answer>\n71\n</answer>"


def completion(reasoning: str = "23 + 48 = 71", answer: str = "71") -> str:
    return f"<reasoning>\n{reasoning}\n</reasoning>\n<answer>\n{answer}\n</answer>"


# ---------------------------------------------------------------- strict format


@pytest.mark.parametrize(
    "text",
    [
        GOOD,
        "  \n" + GOOD + "\n\n",  # surrounding whitespace is allowed
        GOOD.replace("\n", "\r\n"),  # Windows newlines are the same text
        completion(reasoning="Step 1: 2 + 2 = 4\nStep 2: 4 * 3 = 12", answer="12"),  # multi-line reasoning
    ],
)
def test_strict_format_accepts(text: str) -> None:
    assert strict_format_ok(text)
    assert format_score(text) == 1.0


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "empty"),
        ("71", "no tags"),
        ("Sure! " + GOOD, "text before the block"),
        (GOOD + " Hope that helps", "text after the block"),
        ("<reasoning>23 + 48 = 71</reasoning><answer>71</answer>", "tags not on their own lines"),
        ("<reasoning>\n23 + 48 = 71\n</reasoning>\n\n<answer>\n71\n</answer>", "blank line between blocks"),
        ("<answer>\n71\n</answer>\n<reasoning>\n23 + 48 = 71\n</reasoning>", "blocks out of order"),
        (GOOD + "\n<answer>\n71\n</answer>", "duplicated answer block"),
        (completion(reasoning="x <answer>\n5\n</answer> y"), "answer nested in reasoning"),
        (completion(reasoning="x <ANSWER> y"), "case variant of a tag nested in reasoning"),
        (completion(answer="<reasoning>\n71\n</reasoning>"), "reasoning nested in answer"),
        (completion(answer="..."), "placeholder answer"),
        (completion(answer="\u2026"), "unicode ellipsis answer"),
        (completion(answer="<number>"), "bracketed placeholder answer"),
        (completion(answer="your answer here"), "placeholder words"),
        (completion(reasoning="..."), "placeholder reasoning"),
        (completion(answer="   "), "blank answer"),
        ("<reasoning>\n\n</reasoning>\n<answer>\n71\n</answer>", "empty reasoning"),
    ],
)
def test_strict_format_rejects(text: str, reason: str) -> None:
    assert not strict_format_ok(text), reason
    assert format_score(text) < 1.0, reason


def test_partial_credit_per_tag() -> None:
    """0.2 per tag that occurs exactly once and in order; never the full 1.0 without the strict form.

    - all four tags once, in order, but on one line: 4 * 0.2 = 0.8
    - only `<answer>` and `</answer>`: 2 * 0.2 = 0.4
    - answer block duplicated: both answer tags occur twice -> only the 2 reasoning tags count: 0.4
    - answer block before reasoning block: `<answer>` precedes `</reasoning>` etc.; no tag is in order: 0.0
    - placeholder answer in the strict layout: tags are fine (0.8) but the content is not
    """
    assert format_score("<reasoning>a</reasoning><answer>1</answer>") == pytest.approx(0.8)
    assert format_score("The answer: <answer>\n71\n</answer>") == pytest.approx(0.4)
    assert format_score(GOOD + "\n<answer>\n71\n</answer>") == pytest.approx(0.4)
    assert format_score("<answer>\n71\n</answer>\n<reasoning>\nx\n</reasoning>") == 0.0
    assert format_score(completion(answer="...")) == pytest.approx(0.8)
    assert format_score("no tags at all") == 0.0


def test_nested_tags_get_little_credit() -> None:
    """`<reasoning><answer>5</answer></reasoning>`: `</reasoning>` comes after both answer tags, so only
    `<reasoning>` is in order relative to the others: 1 tag -> 0.2."""
    text = "<reasoning>\n<answer>\n5\n</answer>\n</reasoning>"
    assert tags_in_order(text) == 1
    assert format_score(text) == pytest.approx(0.2)


def test_format_reward_is_a_reward_function() -> None:
    rewards = format_reward(["p1", "p2", "p3"], [GOOD, "nothing", completion(answer="...")], answer=["1", "2", "3"])
    assert rewards == [1.0, 0.0, pytest.approx(0.8)]


@pytest.mark.parametrize(
    "content", ["...", "\u2026", "", "  ", "<number>", "[answer]", "{answer}", "Answer", "N/A", "---"]
)
def test_is_placeholder(content: str) -> None:
    assert is_placeholder(content)


@pytest.mark.parametrize("content", ["71", "-3", "x = 5", "3.5 apples", "seventy-one"])
def test_is_not_placeholder(content: str) -> None:
    assert not is_placeholder(content)


# ---------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        (GOOD, "71"),
        ("<answer> 5 </answer> and later <answer>\n7\n</answer>", "7"),  # the last one wins
        ("<answer>1<answer>2</answer>", "2"),  # the unclosed first tag is not well-formed
        ("<answer>\n12\n", None),  # never closed
        ("</answer> 3 <answer>", None),  # wrong order
        ("no tags", None),
        ("<answer></answer>", ""),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


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


# ---------------------------------------------------------------- combination and safety


def constant(value: float):
    def reward(prompts, completions, **columns):
        return [value] * len(completions)

    reward.__name__ = f"const{value:g}_reward"
    return reward


def raises_reward(prompts, completions, **columns):
    raise RuntimeError("bug in reward")


# The sleepy rewards that ran to their end: a timeout cuts a call short, so the tests below expect none.
FINISHED: list[str] = []


def sleepy_reward(prompts, completions, **columns):
    time.sleep(10)
    FINISHED.append("sleepy")
    return [1.0] * len(completions)


def test_combine_weighted_total_and_per_function_values() -> None:
    """weights (1.0, 0.5): total = 1.0 * format + 0.5 * correctness.
    GOOD: 1.0 + 0.5 * 1 = 1.5;  wrong answer in strict form: 1.0 + 0.5 * 0 = 1.0;  no tags: 0.0."""
    combined = combine_rewards([format_reward, answer_correctness_reward], [1.0, 0.5])
    out = combined(["p"] * 3, [GOOD, completion(answer="70"), "71"], answer=["71", "71", "71"])
    assert out.total == [1.5, 1.0, 0.0]
    assert out.per_function == {"format": [1.0, 1.0, 0.0], "answer_correctness": [1.0, 0.0, 0.0]}
    assert out.failed_samples == {"format": 0, "answer_correctness": 0}
    metrics = out.metrics()
    assert metrics["reward/total"] == pytest.approx(2.5 / 3)
    assert metrics["reward/format"] == pytest.approx(2 / 3)
    assert metrics["reward/answer_correctness_failures"] == 0.0


def test_raising_reward_gives_zero_and_is_counted() -> None:
    """A function that always raises: batch call fails, then each of the 3 samples fails -> 3 failed samples; the
    other function's values are untouched (total = 1.0 * 2.0 + 1.0 * 0.0 = 2.0)."""
    combined = combine_rewards([constant(2.0), raises_reward])
    out = combined(["p"] * 3, ["a", "b", "c"])
    assert out.total == [2.0, 2.0, 2.0]
    assert out.per_function["raises"] == [0.0, 0.0, 0.0]
    assert out.failed_samples == {"const2": 0, "raises": 3}
    assert combined.failure_counts() == {"const2": 0, "raises": 3}
    combined(["p"], ["d"])
    assert combined.failure_counts()["raises"] == 4  # cumulative across calls


def test_one_bad_sample_does_not_zero_the_batch() -> None:
    """Raises only for the completion "bad": the per-sample retry scores the others."""

    def picky_reward(prompts, completions, **columns):
        if "bad" in completions:
            raise ValueError("cannot score 'bad'")
        return [float(len(c)) for c in completions]

    safe = safe_reward(picky_reward)
    assert safe(["p"] * 3, ["ab", "bad", "abcd"]) == [2.0, 0.0, 4.0]
    assert safe.failed_samples == 1
    assert "cannot score" in safe.last_error


def test_sleeping_reward_times_out_and_is_counted() -> None:
    """A 10 s sleep under a 0.2 s timeout: the call is cut short (it never reaches its end), all 2 samples get 0.0
    and are counted."""
    combined = combine_rewards([constant(1.0), sleepy_reward], timeout_s=0.2)
    FINISHED.clear()
    out = combined(["p", "q"], ["a", "b"])
    assert FINISHED == []
    assert out.per_function["sleepy"] == [0.0, 0.0]
    assert out.total == [1.0, 1.0]
    assert out.failed_samples["sleepy"] == 2
    assert combined.functions[1].timeouts == 1


def test_timeout_is_not_swallowed_by_except_exception() -> None:
    """Reward code that catches Exception (as math-verify does) must not swallow the timeout."""

    slept = []

    def stubborn_reward(prompts, completions, **columns):
        out = []
        for _ in completions:
            try:
                time.sleep(10)
                slept.append(True)  # reached only when the timeout did not cut the sleep short
            except Exception:
                pass
            out.append(1.0)
        return out

    safe = safe_reward(stubborn_reward, timeout_s=0.2)
    assert safe(["p"], ["a"]) == [0.0]
    assert slept == [] and safe.timeouts == 1


def test_nested_safe_reward_does_not_absorb_the_outer_timeout() -> None:
    """An inner SafeReward inside an outer one runs without its own timer (the outer owns it); when the outer
    alarm fires during the inner call, the outer call is the one that times out and is counted."""
    inner = safe_reward(sleepy_reward, timeout_s=0.1)

    def outer_reward(prompts, completions, **columns):
        return inner(prompts, completions, **columns)

    outer = safe_reward(outer_reward, timeout_s=0.2)
    FINISHED.clear()
    assert outer(["p"], ["a"]) == [0.0]
    assert FINISHED == []
    assert (outer.timeouts, outer.failed_samples) == (1, 1)
    assert (inner.timeouts, inner.failed_samples) == (0, 0)


def test_malformed_outputs_are_failures() -> None:
    """Wrong length, NaN and non-numbers are failures (0.0, counted); None means "not applicable" (0.0, fine)."""
    wrong_length = safe_reward(lambda p, c, **k: [1.0] * (len(c) + 1), name="wrong_length")
    assert wrong_length(["p", "q"], ["a", "b"]) == [0.0, 0.0]
    assert wrong_length.failed_samples == 2
    nan = safe_reward(lambda p, c, **k: [float("nan")] * len(c), name="nan")
    assert nan(["p"], ["a"]) == [0.0]
    assert nan.failed_samples == 1
    not_applicable = safe_reward(lambda p, c, **k: [None, 0.5], name="none")
    assert not_applicable(["p", "q"], ["a", "b"]) == [0.0, 0.5]
    assert not_applicable.failed_samples == 0


def test_exception_safe_without_timeout_in_a_worker_thread() -> None:
    """Signals only work in the main thread; a worker thread still gets exception safety (and no timeout)."""
    combined = combine_rewards([constant(1.0), raises_reward], timeout_s=0.2)
    result = []
    worker = threading.Thread(target=lambda: result.append(combined(["p"], ["a"])))
    worker.start()
    worker.join(timeout=30)
    assert result[0].total == [1.0]
    assert result[0].failed_samples["raises"] == 1


def test_a_hanging_correctness_check_zeroes_one_completion_from_any_thread():
    """Off the main thread (a loader thread, a notebook worker) a signal alarm arms nothing, and sympy never finishes
    evaluating the power tower 9^9^9^9. With the per-completion deadline (1 s), the tower completion gets 0 for
    correctness, is counted as a timeout, and the other three keep their rewards: correctness [1, 0, 1, 0] (the
    last is wrong), format [1, 1, 1, 1]."""
    combined = combine_rewards([format_reward, answer_correctness_reward], timeout_s=1.0)
    completions = [completion(answer=a) for a in ("71", "9^9^9^9", "71", "12")]
    result = []
    worker = threading.Thread(target=lambda: result.append(combined(["p"] * 4, completions, answer=["71"] * 4)),
                              daemon=True)  # daemon: a hung call must not keep the test process alive
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the reward call hung"
    out = result[0]
    assert out.per_function == {"format": [1.0] * 4, "answer_correctness": [1.0, 0.0, 1.0, 0.0]}
    assert out.failed_samples == {"format": 0, "answer_correctness": 1}
    assert out.timed_out_samples == {"format": 0, "answer_correctness": 1}
    assert out.metrics()["reward/answer_correctness_timeouts"] == 1.0
    assert combined.functions[1].timeouts == 1 and "took more than 1.0 s" in combined.functions[1].last_error


def test_combine_validates_its_arguments() -> None:
    with pytest.raises(ConfigError, match="weights"):
        combine_rewards([format_reward, answer_correctness_reward], [1.0])
    with pytest.raises(ConfigError, match="no reward functions"):
        combine_rewards([])
    with pytest.raises(ConfigError, match="duplicate"):
        combine_rewards([format_reward, format_reward])
    renamed = combine_rewards({"fmt": format_reward, "fmt2": format_reward})
    assert renamed.names == ("fmt", "fmt2")
    with pytest.raises(ValueError, match="answer"):
        combine_rewards([format_reward])(["p", "q"], ["a", "b"], answer=["1"])
