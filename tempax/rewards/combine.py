"""Failure-safe reward calls and weighted combinations of reward functions.

The reward API: a reward function is any callable

    fn(prompts: list[str], completions: list[str], **dataset_columns) -> list[float]

where each dataset column (for example `answer=[...]`) arrives as a list aligned with `completions`. A returned
`None` means "does not apply to this sample" and counts as 0.0. A reward function must never stop or stall a
training run: `safe_reward` wraps one so that a call which raises, returns something malformed or runs past its
timeout gives 0.0 for the affected samples and bumps failure counters the trainer logs (`SafeReward` says how).
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tempax.errors import ConfigError
from tempax.rewards.bounded import shared_pool

DEFAULT_TIMEOUT_S = 5.0


class RewardFn(Protocol):
    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> Sequence[float | None]: ...


def per_completion(fn: RewardFn) -> RewardFn:
    """Marks a module-level reward function to be run one completion at a time under its own deadline, in a
    worker process (`SafeReward`). It must be importable by name and need nothing but its arguments."""
    fn.tempax_per_completion = True  # type: ignore[attr-defined]
    return fn


class RewardTimeout(BaseException):
    """Raised inside a reward call when its time is up (a BaseException so `except Exception` cannot swallow it)."""


class _TimedOut(Exception):
    """Our own timeout fired (as opposed to the alarm of an enclosing `time_limit`, which must propagate)."""


class _MalformedOutput(Exception):
    """A reward function returned something that is not one number (or None) per completion."""


def _can_use_alarm() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[bool]:
    """Raise `RewardTimeout` in the body after `seconds`; yields whether a timeout is actually armed.

    No timeout is armed (the body just runs) for `seconds` None or <= 0, outside the main thread, on platforms
    without `setitimer`, or when an interval timer is already running (ours would cancel it).
    """
    if seconds is None or seconds <= 0 or not _can_use_alarm():
        yield False
        return
    if signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        yield False
        return

    def _on_alarm(signum: int, frame: Any) -> None:
        raise RewardTimeout(f"reward call exceeded {seconds} s")

    previous_handler = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        yield True
    finally:
        # Nested so the handler is restored even if the alarm fires between the body and the cancel.
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, previous_handler)


def _check_lengths(completions: Sequence[str], prompts: Sequence[str], columns: Mapping[str, Sequence[Any]]) -> int:
    n = len(completions)
    if len(prompts) != n:
        raise ValueError(f"{len(prompts)} prompts for {n} completions; reward inputs must be aligned")
    for name, values in columns.items():
        if len(values) != n:
            raise ValueError(f"dataset column {name!r} has {len(values)} entries for {n} completions")
    return n


def _to_rewards(output: Any, n: int) -> list[float]:
    """Validate a reward function's output: n entries, each a finite real number or None (-> 0.0)."""
    try:
        values = list(output)
    except TypeError as err:
        raise _MalformedOutput(f"returned {type(output).__name__}, not a list of floats") from err
    if len(values) != n:
        raise _MalformedOutput(f"returned {len(values)} rewards for {n} completions")
    rewards = []
    for value in values:
        if value is None:
            rewards.append(0.0)
            continue
        try:
            number = float(value)
        except (TypeError, ValueError) as err:
            raise _MalformedOutput(f"returned a non-number {value!r}") from err
        if not math.isfinite(number):
            raise _MalformedOutput(f"returned a non-finite reward {number}")
        rewards.append(number)
    return rewards


@dataclass
class SafeReward:
    """A reward function that never raises and never hangs (in the main thread).

    Functions marked `@per_completion` (the built-in format and answer-correctness rewards; any module-level
    function can be) are run one completion at a time in `tempax.rewards.bounded.shared_pool()`, a persistent pool
    of worker processes: each completion has its own `timeout_s` deadline, which works from any thread, and a
    completion past it is scored 0.0 and counted alone while its worker is killed and replaced.

    Other functions (objects such as a reward model, closures) are called in-process on the whole batch; when the
    batch raises, the samples are retried one by one, so one odd completion does not zero its whole GRPO group.
    Their timeout uses `signal.setitimer` (`time_limit`), the only way to interrupt pure-Python code without a
    subprocess: signals can only be handled in the main thread, so elsewhere (or when another interval timer is
    already running, which must not be cancelled) such a call runs without a timeout but stays exception-safe.
    The timeout exception derives from `BaseException` on purpose: reward code (math-verify included) catches
    `Exception` to turn bad input into "wrong", and would otherwise swallow the timeout and keep running.

    Counters are cumulative over the object's life, for logging:
      failed_samples: samples that got 0.0 because their call raised, misbehaved or timed out.
      timed_out_samples: of those, the samples whose call ran past `timeout_s`.
      timeouts: calls (batch, per-sample retry or per-completion call) that ran past `timeout_s`.
      errors: calls that raised or returned malformed output.
      last_error: a one-line description of the most recent failure, for the log.
    """

    fn: RewardFn
    name: str
    timeout_s: float | None = DEFAULT_TIMEOUT_S
    failed_samples: int = 0
    timed_out_samples: int = 0
    timeouts: int = 0
    errors: int = 0
    last_error: str | None = None

    def _call(
        self, prompts: list[str], completions: list[str], columns: dict[str, list[Any]], limit: float | None
    ) -> list[float]:
        armed = False
        try:
            with time_limit(limit) as armed:
                output = self.fn(prompts, completions, **columns)
        except RewardTimeout as err:
            if not armed:
                # Our timer was not armed, so this alarm belongs to an enclosing time_limit (a SafeReward called
                # inside another reward function): let it reach its owner instead of absorbing it.
                raise
            raise _TimedOut(str(err)) from None
        return _to_rewards(output, len(completions))

    def _record(self, kind: str, detail: str) -> None:
        if kind == "timeout":
            self.timeouts += 1
        else:
            self.errors += 1
        self.last_error = f"{self.name}: {detail}"

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns: Sequence[Any]) -> list[float]:
        n = _check_lengths(completions, prompts, columns)
        prompts, completions = list(prompts), list(completions)
        cols = {name: list(values) for name, values in columns.items()}
        if getattr(self.fn, "tempax_per_completion", False) and self.timeout_s is not None and self.timeout_s > 0:
            return self._per_completion(prompts, completions, cols)
        try:
            return self._call(prompts, completions, cols, self.timeout_s)
        except _TimedOut as err:
            # Retrying a batch that already used its whole budget would multiply the stall; zero it instead.
            self._record("timeout", str(err))
            self.failed_samples += n
            self.timed_out_samples += n
            return [0.0] * n
        except Exception as err:  # any bug in a reward function is contained here
            self._record("error", f"{type(err).__name__}: {err}")
        return self._per_sample(prompts, completions, cols)

    def _per_completion(self, prompts: list[str], completions: list[str], cols: dict[str, list[Any]]) -> list[float]:
        """Each completion in the deadline pool with its own `timeout_s`; a failure scores that one 0.0 alone."""
        calls = [(([prompts[i]], [completions[i]]), {name: [v[i]] for name, v in cols.items()})
                 for i in range(len(completions))]
        rewards = []
        for outcome in shared_pool().map(self.fn, calls, timeout_s=self.timeout_s):
            try:
                if outcome.timed_out:
                    raise _TimedOut(f"one completion took more than {self.timeout_s} s")
                if outcome.error is not None:
                    raise RuntimeError(outcome.error)
                rewards.append(_to_rewards(outcome.value, 1)[0])
                continue
            except _TimedOut as err:
                self._record("timeout", str(err))
                self.timed_out_samples += 1
            except Exception as err:
                self._record("error", f"{type(err).__name__}: {err}")
            self.failed_samples += 1
            rewards.append(0.0)
        return rewards

    def _per_sample(self, prompts: list[str], completions: list[str], cols: dict[str, list[Any]]) -> list[float]:
        """Retry one completion at a time, all retries sharing one `timeout_s` budget."""
        no_limit = self.timeout_s is None or self.timeout_s <= 0
        deadline = None if no_limit else time.monotonic() + self.timeout_s
        rewards = []
        for i in range(len(completions)):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                self.failed_samples += 1
                rewards.append(0.0)
                continue
            one = {name: [values[i]] for name, values in cols.items()}
            try:
                rewards.append(self._call([prompts[i]], [completions[i]], one, remaining)[0])
            except _TimedOut as err:
                self._record("timeout", str(err))
                self.failed_samples += 1
                self.timed_out_samples += 1
                rewards.append(0.0)
            except Exception as err:
                self._record("error", f"{type(err).__name__}: {err}")
                self.failed_samples += 1
                rewards.append(0.0)
        return rewards


def _name_of(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return name.removesuffix("_reward") or name


def safe_reward(fn: RewardFn, *, name: str | None = None, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> SafeReward:
    """Wrap `fn` so that raising or running past `timeout_s` gives 0.0 and is counted (see `SafeReward`)."""
    if isinstance(fn, SafeReward):
        return fn
    return SafeReward(fn=fn, name=name or _name_of(fn), timeout_s=timeout_s)


@dataclass(frozen=True)
class RewardBreakdown:
    """One batch's rewards.

    total: weighted sum per completion, sum_i w_i * r_i.                  # [batch]
    per_function: unweighted rewards per function name.                    # name -> [batch]
    failed_samples: samples per function that got 0.0 in this call because the function failed.
    timed_out_samples: of those, the samples per function whose check ran past its deadline.
    """

    total: list[float]
    per_function: dict[str, list[float]]
    failed_samples: dict[str, int] = field(default_factory=dict)
    timed_out_samples: dict[str, int] = field(default_factory=dict)

    def metrics(self, prefix: str = "reward/") -> dict[str, float]:
        """Batch means to log: `reward/total`, `reward/<name>`, and the counts `reward/<name>_failures` and
        `reward/<name>_timeouts` (the failures that were timeouts)."""
        n = max(len(self.total), 1)
        out = {f"{prefix}total": sum(self.total) / n}
        for name, values in self.per_function.items():
            out[f"{prefix}{name}"] = sum(values) / n
            out[f"{prefix}{name}_failures"] = float(self.failed_samples.get(name, 0))
            out[f"{prefix}{name}_timeouts"] = float(self.timed_out_samples.get(name, 0))
        return out


@dataclass
class CombinedReward:
    """Weighted sum of safe reward functions; call it like a reward function to get a `RewardBreakdown`."""

    functions: tuple[SafeReward, ...]
    weights: tuple[float, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.functions)

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns: Sequence[Any]) -> RewardBreakdown:
        n = _check_lengths(completions, prompts, columns)
        total = [0.0] * n
        per_function: dict[str, list[float]] = {}
        failed: dict[str, int] = {}
        timed_out: dict[str, int] = {}
        for fn, weight in zip(self.functions, self.weights):
            before, timed_before = fn.failed_samples, fn.timed_out_samples
            rewards = fn(prompts, completions, **columns)
            failed[fn.name] = fn.failed_samples - before
            timed_out[fn.name] = fn.timed_out_samples - timed_before
            per_function[fn.name] = rewards
            total = [t + weight * r for t, r in zip(total, rewards)]
        return RewardBreakdown(total=total, per_function=per_function, failed_samples=failed,
                               timed_out_samples=timed_out)

    def failure_counts(self) -> dict[str, int]:
        """Cumulative failed samples per function since construction."""
        return {f.name: f.failed_samples for f in self.functions}


def combine_rewards(
    functions: Sequence[RewardFn] | Mapping[str, RewardFn],
    weights: Sequence[float] | None = None,
    *,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> CombinedReward:
    """Combine reward functions into one weighted, failure-safe `CombinedReward`.

    Args:
      functions: reward functions, or a mapping name -> function (names key the per-function logs; by default a
        function's `__name__` without a `_reward` suffix).
      weights: one finite weight per function; all 1.0 when omitted.
      timeout_s: per-call timeout for each function (None: no timeout).
    """
    if isinstance(functions, Mapping):
        named = list(functions.items())
    else:
        named = [(_name_of(fn), fn) for fn in functions]
    if not named:
        raise ConfigError("rewards: no reward functions given; list at least one (for example format, correctness)")
    if weights is None:
        weights = [1.0] * len(named)
    weights = [float(w) for w in weights]
    if len(weights) != len(named):
        raise ConfigError(
            f"rewards: {len(weights)} weights for {len(named)} reward functions; give exactly one weight per function"
        )
    if not all(math.isfinite(w) for w in weights):
        raise ConfigError(f"rewards: weights must be finite numbers, got {weights}")
    # An already-wrapped function keeps its own name and counters.
    wrapped = tuple(
        fn if isinstance(fn, SafeReward) else SafeReward(fn=fn, name=name, timeout_s=timeout_s) for name, fn in named
    )
    names = [fn.name for fn in wrapped]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"rewards: duplicate reward names {duplicates}; pass a mapping name -> function to rename")
    return CombinedReward(functions=wrapped, weights=tuple(weights))
