"""Side effects attached to the training loop with a cadence: logging, checkpoints, evaluation, your own.

A hook runs after optimizer step `s` when `s % every == 0`, and after the last step when `at_end` is true. Hooks
never run inside the jitted step, and the step never does side effects: that is how the loop avoids a host sync
per step (metrics are fetched from the device only at steps some hook needs them). `Hook` says how one is
written, in what order hooks run and how one stops the run; for a one-off,
`every(50, lambda info: print(info.step, info.metrics()["loss"]))`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from tempax.parallel.process import host_tree
from tempax.train.metrics import scalars
from tempax.train.view import TrainerView


@dataclass(frozen=True)
class Stop:
    """What a hook returns to end the run after this step: `return Stop("entropy collapsed: ...")`."""

    reason: str


class StopTraining(Exception):
    """What a hook raises to end the run after this step (the same as returning `Stop(reason)`)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class StepInfo:
    """What a hook sees after step `step` (1-based: the number of optimizer updates done).

    Attributes:
      step: updates done so far.
      trainer: the trainer as hooks see it (`TrainerView`: its `model`, `params`, `write`, `log`, `run_dir`...).
      is_last: this is the final step of the run (also when a hook asked to stop at this step: the hooks after
        it in the list then run as at the end, so the stop is logged and checkpointed).
      data_s: seconds `fit` waited for this step's batch (for an on-policy source: sampling, scoring, reference).
      train_s: seconds from dispatching the step until its results were on the host.
      stop_reason: why the run stops after this step (set by a hook's `Stop`, or `Trainer.request_stop`).
    """

    step: int
    trainer: TrainerView
    is_last: bool
    _data_state_fn: Callable[[], dict[str, Any] | None] | None = field(default=None, repr=False)
    _device_metrics: dict[str, Any] | None = field(default=None, repr=False)
    _extra_metrics: dict[str, Any] = field(default_factory=dict, repr=False)
    data_s: float = 0.0
    train_s: float = 0.0
    stop_reason: str | None = None
    _host_metrics: dict[str, Any] | None = field(default=None, repr=False)
    _data_state: Any = field(default=None, repr=False)

    @property
    def data_state(self) -> dict[str, Any] | None:
        """The batch source's `state()` after this step's batch (what a checkpoint must store); read once."""
        if self._data_state is None and self._data_state_fn is not None:
            self._data_state = self._data_state_fn() or {}
        return self._data_state

    def metrics(self) -> dict[str, Any]:
        """This step's metrics on the host: the loss function's scalars (fetched once, on first use), the batch
        source's `batch_metrics()` and whatever earlier hooks added."""
        if self._host_metrics is None:
            self._host_metrics = scalars(host_tree(self._device_metrics or {}))  # arrays may span processes
        return {**self._host_metrics, **self._extra_metrics}

    def add_metrics(self, values: dict[str, Any]) -> None:
        """Adds host metrics to this step's record (hooks run before the logging hook, so they are written)."""
        self._extra_metrics.update(values)


class Hook:
    """Base class: override `__call__` (and optionally `start` / `end`).

        class SampleHook(Hook):
            def __init__(self, every):
                super().__init__(every=every)
            def __call__(self, info):
                model = info.trainer.model          # the current model (merged trainable + frozen state)
                ...                                 # generate, then info.trainer.write(text) or info.add_metrics({...})

    A hook sees the trainer as a `tempax.train.view.TrainerView` (`info.trainer`, and the argument of `start` /
    `end`): the step, the weights, the mesh, a few settings, `write`, `log`, `save_checkpoint` and `evaluate`, and
    nothing else of the loop.

    Order: the hooks passed to `Trainer.fit` run first, in their order, then logging, evaluation and checkpoints,
    so a hook can add numbers to the step's record (`info.add_metrics`) before it is written.

    Stopping: `__call__` returns `Stop(reason)` (or raises `StopTraining(reason)`) to end the run after this step.
    The hooks after it then run as at the last step (the record carries `stop_reason`), `fit` saves a checkpoint of
    the step even when `checkpoint.save_at_end` is off, writes the reason to `<run_dir>/summary.json` and returns
    it in `TrainResult.stop_reason`; the `tempax` training commands then exit with status 3.
    """

    def __init__(self, every: int = 1, *, at_end: bool = True):
        if every < 0:
            raise ValueError(f"hook cadence must be >= 0, got {every}")
        self.every = every
        self.at_end = at_end

    def due(self, step: int, is_last: bool) -> bool:
        return (self.every > 0 and step % self.every == 0) or (is_last and self.at_end)

    def start(self, trainer: TrainerView) -> None:
        """Called once before the first step (after any resume)."""

    def __call__(self, info: StepInfo) -> "Stop | None":
        """Called after each due step."""

    def end(self, trainer: TrainerView) -> None:
        """Called once after the loop, also when it stops with an error."""


class FunctionHook(Hook):
    def __init__(self, every: int, fn: Callable[[StepInfo], Any], *, at_end: bool = False):
        super().__init__(every, at_end=at_end)
        self.fn = fn

    def __call__(self, info: StepInfo) -> "Stop | None":
        return self.fn(info)


def every(n: int, fn: Callable[[StepInfo], Any], *, at_end: bool = False) -> Hook:
    """A hook that calls `fn(info)` every `n` steps (what `fn` returns is the hook's: `Stop(reason)` stops)."""
    return FunctionHook(n, fn, at_end=at_end)


class LoggingHook(Hook):
    """Writes metrics (plus tokens/s over the interval) to metrics.jsonl / TensorBoard and the progress bar."""

    def __init__(self, every: int, *, tokens_per_step: int):
        super().__init__(every, at_end=True)
        self.tokens_per_step = tokens_per_step
        self._last: tuple[int, float] | None = None

    def start(self, trainer: TrainerView) -> None:
        self._last = None

    def __call__(self, info: StepInfo) -> None:
        import time

        metrics = dict(info.metrics())
        now = time.perf_counter()
        if self._last is not None and info.step > self._last[0]:
            steps, seconds = info.step - self._last[0], now - self._last[1]
            metrics["tokens_per_s"] = self.tokens_per_step * steps / max(seconds, 1e-9)
            metrics["step_time_s"] = seconds / steps
        self._last = (info.step, now)
        info.trainer.log(info.step, metrics)  # metrics.jsonl, the trackers and the progress bar

    def reset_clock(self, step: int) -> None:
        """Restart the throughput interval (after compilation or an evaluation)."""
        import time

        self._last = (step, time.perf_counter())


class CheckpointHook(Hook):
    """Saves the train state and data position every N steps (and at the end)."""

    def __init__(self, every: int, *, at_end: bool = True):
        super().__init__(every, at_end=at_end)

    def __call__(self, info: StepInfo) -> None:
        info.trainer.save_checkpoint(info.data_state)


class EvalHook(Hook):
    """Runs the loss function without gradients over held-out batches and logs `eval/<metric>`.

    Args:
      every: cadence in steps (0: only at the end).
      batches: a zero-argument callable returning a fresh iterable of batches (the same ones each time).
      max_batches: evaluate at most this many batches (0: all).
    """

    def __init__(
        self,
        every: int,
        batches: Callable[[], Iterable[dict[str, Any]]],
        *,
        max_batches: int = 0,
        at_start: bool = False,
    ):
        super().__init__(every, at_end=True)
        self.batches = batches
        self.max_batches = max_batches
        self.at_start = at_start
        self.history: list[tuple[int, dict[str, float]]] = []

    def start(self, trainer: TrainerView) -> None:
        if self.at_start:
            self._evaluate(trainer, trainer.step)

    def __call__(self, info: StepInfo) -> None:
        self._evaluate(info.trainer, info.step)

    def _evaluate(self, trainer: TrainerView, step: int) -> None:
        results = trainer.evaluate(self.batches(), max_batches=self.max_batches)
        self.history.append((step, results))
        trainer.log(step, {f"eval/{k}": v for k, v in results.items()})
        if "loss" in results:
            trainer.write(f"step {step}: eval loss {results['loss']:.4f}")
