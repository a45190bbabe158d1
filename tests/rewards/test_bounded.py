"""Deadlines per completion: the worker-process pool, answer checks and the rewards built on them.

The slow inputs are real ones for math-verify and sympy: `9^9^9^9` (a power tower sympy tries to evaluate) and
`(10^10000-1)^10000` (the 10,000-digit number 99...9 raised to the 10,000th power, a 100-million-digit result).
Without a deadline neither check returns within minutes.
Deadlines here are short (1 s) to keep the suite fast; the pool's start-up (spawning Python and importing
sympy) is paid once and never counts against a deadline.
"""

from __future__ import annotations

import os

from tempax.rewards import answer_correctness_reward, answers_match, check_completions, combine_rewards
from tempax.rewards.bounded import DeadlinePool, shared_pool

TOWER = "9^9^9^9"
HUGE_POWER = "(10^10000-1)^10000"


def completion(answer: str) -> str:
    return f"<reasoning>\nworked it out\n</reasoning>\n<answer>\n{answer}\n</answer>"


def crash(code: int) -> None:
    os._exit(code)


def test_pool_times_out_each_call_alone_and_survives_crashes():
    """Four calls, 1 s each: the tower and the power of a 10,000-digit number time out (cut at their deadline:
    each would run for minutes, and each cut worker is replaced), the others answer; a worker that dies mid-call
    fails that call alone; a later call reuses the (replaced) workers."""
    pool = DeadlinePool(workers=2)
    try:
        out = pool.map(answers_match, [(("72", "72"), {}), ((TOWER, "5"), {}), ((HUGE_POWER, "5"), {}),
                                       (("70+2", "72"), {})], timeout_s=1.0)
        assert [(o.value, o.timed_out) for o in out] == [(True, False), (None, True), (None, True), (True, False)]
        assert pool.replaced == 2
        crashed = pool.map(crash, [((3,), {})], timeout_s=5.0)[0]
        assert crashed.error and "died" in crashed.error and not crashed.timed_out
        assert pool.map(answers_match, [(("8", "8"), {})], timeout_s=1.0)[0].value is True
    finally:
        pool.close()


def test_check_completions_bounds_each_completion():
    """The tower's check alone runs out of time; the numeric and math-verify answers around it are judged."""
    checks = check_completions([completion("71"), completion(TOWER), completion("70+1"), "no tags"],
                               ["71", "71", "71", "71"], timeout_s=1.0)
    assert [tuple(c) for c in checks] == [(True, True, False), (False, False, True), (True, True, False),
                                          (False, False, False)]


def test_the_pool_is_started_once():
    """Reward calls reuse one pool: the second call starts no process (same worker pids)."""
    combined = combine_rewards([answer_correctness_reward], timeout_s=5.0)
    combined(["p"], [completion("1")], answer=["1"])  # starts the pool if no test before did
    pids = sorted(w.proc.pid for w in shared_pool()._workers)
    combined(["p"] * 3, [completion("2")] * 3, answer=["2"] * 3)
    assert sorted(w.proc.pid for w in shared_pool()._workers) == pids
