"""What a stage costs and how much it may spend: a stopwatch of wall and process-CPU seconds per named stage, and
a training hook that ends a run when its seconds reach another stage's (`StageBudget`).

A comparison between methods is fair only at equal compute. Wall time is what a user waits, but on a shared
machine it hands more compute to whichever stage ran while the others' load was low; process CPU seconds
(`time.process_time`: user + system of every thread of this process) count the work itself. Both are recorded
for every stage, and a budget is stated in one of them (`BUDGET_CLOCKS`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from tempax.errors import ConfigError
from tempax.train.hooks import Hook, Stop

# The clocks a budget can be stated in: "wall" (what a user waits) or "cpu" (the compute the stage got).
BUDGET_CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def check_clock(clock: str, what: str = "budget clock") -> None:
    """Refuses a clock name that is not one of `BUDGET_CLOCKS`, naming them."""
    if clock not in BUDGET_CLOCKS:
        raise ConfigError(f"{what} must be one of {sorted(BUDGET_CLOCKS)}, got {clock!r}")


class Stopwatch:
    """Wall and process-CPU seconds per named stage (`with watch("sft"): ...`).

    On a shared machine wall time over-states what a quiet one needs; the CPU time says how much work it was.
    """

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.wall[name] = time.perf_counter() - wall
            self.cpu[name] = time.process_time() - cpu

    def seconds(self, name: str, clock: str) -> float:
        """The seconds stage `name` took on `clock` ("wall" or "cpu")."""
        return self.wall[name] if clock == "wall" else self.cpu[name]


class StageBudget(Hook):
    """Ends a run when the seconds of `clock` it used reach `seconds`, counted from this hook's creation (so
    building the trainer and compiling count, as they do for the stage it is matched to). After each step it stops
    when finishing one more step would overshoot the budget by more than this step falls short of it, i.e. when
    used + (last step's seconds) / 2 >= seconds.

    `clock` is one of `BUDGET_CLOCKS`: "wall" (`time.perf_counter`, what a user waits) or "cpu"
    (`time.process_time`: user + system seconds of every thread of this process, i.e. the compute the stage got,
    whatever else the machine was running)."""

    def __init__(self, seconds: float, clock: str = "wall"):
        super().__init__(every=1, at_end=False)
        check_clock(clock)
        self.seconds, self.kind, self.clock = seconds, clock, BUDGET_CLOCKS[clock]
        self.started = self.last = self.clock()

    def __call__(self, info: Any) -> Stop | None:
        now = self.clock()
        step_s, self.last = now - self.last, now
        if now - self.started + step_s / 2 >= self.seconds:
            return Stop(f"{'wall-time' if self.kind == 'wall' else 'CPU-time'} budget of {self.seconds:.0f} s spent")
        return None

    def pause(self, wall_seconds: float, cpu_seconds: float) -> None:
        """Leaves out of the budget work done between two steps that is not training (a validation evaluation):
        the seconds of this hook's clock are added back, to the budget and to the step being timed."""
        spent = wall_seconds if self.kind == "wall" else cpu_seconds
        self.started += spent
        self.last += spent


@dataclass(frozen=True)
class Budget:
    """The compute each budgeted stage of a pipeline gets: the seconds that stage `matched` (its stopwatch name,
    e.g. "grpo"; `label` in printed lines) took on `clock`, which a fresh `StageBudget` hook enforces on each."""

    matched: str
    label: str
    clock: str
    seconds: float

    @classmethod
    def of(cls, watch: Stopwatch, matched: str, clock: str, *, label: str) -> "Budget":
        check_clock(clock)
        return cls(matched, label, clock, watch.seconds(matched, clock))

    def hook(self) -> StageBudget:
        """A new hook, started now: the stage's own set-up counts against it."""
        return StageBudget(self.seconds, self.clock)

    @property
    def spent(self) -> str:
        """What the budget counts, in words."""
        return "wall time" if self.clock == "wall" else "process CPU seconds"
