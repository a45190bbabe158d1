"""tempax.rewards.combine: weighted combinations of reward functions, and reward calls that never raise or hang."""

from __future__ import annotations

import threading
import time

import pytest

from tempax.errors import ConfigError
from tempax.rewards.combine import combine_rewards, safe_reward
from tempax.rewards.correctness import answer_correctness_reward
from tempax.rewards.formatting import format_reward
from tests.rewards.texts import GOOD, completion


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
