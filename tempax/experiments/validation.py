"""Early stopping on a validation split: evaluate the model being trained every few steps, keep the weights of
its best evaluation, and stop when the score has not improved for a while.

What a user does when more training of the same data may over-fit (SFT repeated on a few demonstrations): the
checkpoint to keep is chosen on problems the run never trains on and the reported figures never use, so the test
problems stay untouched until the chosen model is evaluated once (as TRL's `load_best_model_at_end` with an
early-stopping callback, the selection metric here being task accuracy rather than loss: a lower loss on the
demonstrations need not give more right answers).

    best = BestOnValidation(every=8, patience=2, score=lambda model: accuracy(model, validation_rows))
    trainer.fit(..., hooks=(budget, best))      # after the budget hook: it then also scores the step the budget ends
    model = best.best_model()                   # the weights of the best evaluation (the last, if none was better)

The evaluation's own seconds are not training compute: given a `StageBudget` (`pause`), the hook hands them back
to it, so a budgeted run trains for as many seconds as the stage it is matched to, evaluations aside. Placed after
the budget hook, it runs as at the last step when the budget stops the run, so the final weights are scored too.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax

from tempax.errors import ConfigError
from tempax.experiments.budget import StageBudget
from tempax.train.hooks import Hook, Stop, StepInfo


class BestOnValidation(Hook):
    """Scores the model every `every` steps (and at the last), keeps the best-scoring weights, and stops the run
    after `patience` evaluations in a row that did not beat the best (a tie is not an improvement: with equal
    scores the earlier, less-trained weights are kept).

    Args:
      every: steps between evaluations.
      patience: evaluations without improvement before stopping (0: never stop early, only keep the best).
      score: `fn(model) -> float`, higher is better (e.g. answer accuracy on validation problems).
      budget: a `StageBudget` whose clock does not count the evaluations (None: they count wherever they run).
      say: where one line per evaluation goes (None: nowhere).

    Attributes:
      history: (step, score) of every evaluation, in order.
      best_step, best_score: the evaluation whose weights `best_model` returns.
      wall_seconds, cpu_seconds: what the evaluations took in all (process CPU: every thread).
    """

    def __init__(self, *, every: int, patience: int, score: Callable[[Any], float],
                 budget: StageBudget | None = None, say: Callable[[str], None] | None = None):
        super().__init__(every=every, at_end=True)
        if every < 1 or patience < 0:
            raise ConfigError(f"validation needs every >= 1 and patience >= 0, got every={every}, patience={patience}")
        self.patience, self.score, self.budget, self.say = patience, score, budget, say
        self.history: list[tuple[int, float]] = []
        self.best_step, self.best_score = 0, float("-inf")
        self._best_params: dict[str, Any] | None = None
        self._parts: Any = None
        self._rest: Any = None
        self._stale = 0
        self.wall_seconds = self.cpu_seconds = 0.0

    def __call__(self, info: StepInfo) -> Stop | None:
        if self.history and self.history[-1][0] == info.step:
            return None  # the last step was also a cadence step: scored already
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        trainer = info.trainer
        value = float(self.score(trainer.model))
        self.history.append((info.step, value))
        if value > self.best_score:
            self.best_step, self.best_score, self._stale = info.step, value, 0
            # Host copies: the step donates the trainable arrays, so the device ones are gone after the next step.
            self._best_params = jax.device_get(dict(trainer.params))
            self._parts, self._rest = trainer.parts, trainer.rest
        else:
            self._stale += 1
        wall, cpu = time.perf_counter() - start_wall, time.process_time() - start_cpu
        self.wall_seconds += wall
        self.cpu_seconds += cpu
        if self.budget is not None:
            self.budget.pause(wall, cpu)
        info.add_metrics({"validation/score": value, "validation/best": self.best_score})
        if self.say is not None:
            self.say(f"  validation at step {info.step}: {value:.1%} (best {self.best_score:.1%} at step "
                     f"{self.best_step})")
        if self.patience and self._stale >= self.patience and not info.is_last:
            return Stop(f"validation score did not improve for {self._stale} evaluations (best {self.best_score:.4g} "
                        f"at step {self.best_step})")
        return None

    def best_model(self) -> Any:
        """The model with the trainable weights of the best evaluation (the frozen ones as trained with)."""
        if self._best_params is None:
            raise ConfigError("no validation evaluation ran (the run made no step): there is no best model")
        return self._parts.merge(jax.device_put(self._best_params), self._rest)
