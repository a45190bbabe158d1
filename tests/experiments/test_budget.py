"""The stage budget: the hook stops at the step whose midpoint passes the budget on either clock, and the CPU
clock counts this process's threads and not its sleep."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("kind", ["wall", "cpu"])
def test_stage_budget_stops_at_the_step_whose_midpoint_passes_the_budget(monkeypatch, kind):
    """A 10 s budget on a fake clock: created at 100, steps end at 103, 106, 108.5, 111.5 (3, 3, 2.5, 3 s).
    After step 2 used = 6, 6 + 3/2 = 7.5 < 10: go on; after step 3 used = 8.5, 8.5 + 2.5/2 = 9.75 < 10: go on;
    after step 4 used = 11.5 >= 10: stop. A 9.5 s budget stops after step 3 (9.75 >= 9.5)."""
    from tempax.experiments import budget
    from tempax.train.hooks import Stop

    for seconds, stop_after in ((10.0, 4), (9.5, 3)):
        ticks = iter([100.0, 103.0, 106.0, 108.5, 111.5])
        monkeypatch.setitem(budget.BUDGET_CLOCKS, kind, lambda: next(ticks))
        hook = budget.StageBudget(seconds, kind)
        results = [hook(None) for _ in range(stop_after)]
        assert results[:-1] == [None] * (stop_after - 1)
        assert isinstance(results[-1], Stop) and f"budget of {seconds:.0f} s spent" in results[-1].reason
        assert ("CPU-time" in results[-1].reason) == (kind == "cpu")


def test_cpu_budget_counts_this_process_threads_and_not_sleep():
    """The cpu clock is the process's CPU time: another thread's 0.2 s of CPU advances it, a sleep does not."""
    import threading
    import time

    from tempax.experiments.budget import BUDGET_CLOCKS

    cpu = BUDGET_CLOCKS["cpu"]
    t0 = cpu()
    time.sleep(0.3)
    assert cpu() - t0 < 0.1

    def spin() -> None:  # until this thread alone has used 0.2 s of CPU, however loaded the machine is
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass

    worker = threading.Thread(target=spin)
    t1 = cpu()
    worker.start()
    worker.join()
    assert cpu() - t1 >= 0.2


@pytest.mark.parametrize("kind", ["wall", "cpu"])
def test_a_paused_interval_is_left_out_of_the_budget_and_of_the_step(monkeypatch, kind):
    """A 12 s budget created at 100; steps end at 103 and 106, then 5 s of validation (paused: the pause of the
    hook's own clock counts, the other clock's seconds are ignored) until 111, and the next steps end at 114 and
    117. Without the pause step 3 would stop the run (used 14 s). With it, after step 3 used = 14 - 5 = 9 and the
    step took 3 s (not 8): 9 + 1.5 < 12, go on; after step 4 used = 12: stop."""
    from tempax.experiments import budget
    from tempax.train.hooks import Stop

    ticks = iter([100.0, 103.0, 106.0, 114.0, 117.0])
    monkeypatch.setitem(budget.BUDGET_CLOCKS, kind, lambda: next(ticks))
    hook = budget.StageBudget(12.0, kind)
    assert hook(None) is None and hook(None) is None
    hook.pause(5.0 if kind == "wall" else 99.0, 5.0 if kind == "cpu" else 99.0)
    assert (hook.started, hook.last) == (105.0, 111.0)
    assert hook(None) is None
    assert isinstance(hook(None), Stop)
