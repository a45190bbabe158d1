"""Early stopping on a validation split: the best-scoring weights are kept (a tie keeps the earlier ones), the
run stops after `patience` scores without improvement, and the scoring's seconds go back to the budget."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tempax.errors import ConfigError
from tempax.experiments.budget import StageBudget
from tempax.experiments.validation import BestOnValidation
from tempax.train.hooks import Stop


class FakeParts:
    """`parts.merge(params, rest)` as the trainer's: here a record of what it was given."""

    def merge(self, params, rest):
        return {"params": params, "rest": rest}


def step_info(step: int, weight: float, *, is_last: bool = False):
    """What the hook sees after `step`: a trainer whose model is its weight and whose params hold it."""
    trainer = SimpleNamespace(model=weight, params={"w": np.full(2, weight, np.float32)}, parts=FakeParts(),
                              rest="frozen")
    added: dict = {}
    return SimpleNamespace(step=step, trainer=trainer, is_last=is_last, add_metrics=added.update, added=added)


def test_keeps_the_best_weights_and_stops_after_patience_scores_without_improvement():
    """Scores 0.1, 0.3, 0.3 (a tie: not better), 0.2 with patience 2: the run stops after the fourth score, and
    the kept weights are step 2's (the model's weight is its score here)."""
    lines: list[str] = []
    hook = BestOnValidation(every=1, patience=2, score=lambda model: model, say=lines.append)
    results = [hook(step_info(s, w)) for s, w in ((1, 0.1), (2, 0.3), (3, 0.3))]
    assert results == [None, None, None]
    info = step_info(4, 0.2)
    stop = hook(info)
    assert isinstance(stop, Stop) and "did not improve for 2 evaluations" in stop.reason and "step 2" in stop.reason
    assert hook.history == [(1, 0.1), (2, 0.3), (3, 0.3), (4, 0.2)]
    assert (hook.best_step, hook.best_score) == (2, 0.3)
    best = hook.best_model()
    np.testing.assert_array_equal(np.asarray(best["params"]["w"]), np.float32([0.3, 0.3]))
    assert best["rest"] == "frozen"
    assert info.added == {"validation/score": 0.2, "validation/best": 0.3}
    assert lines[-1] == "  validation at step 4: 20.0% (best 30.0% at step 2)"


def test_the_last_step_is_scored_once_and_never_stops_the_run():
    """At the last step (a cadence step too, so the hook may be called twice for it) the score is taken once, and
    no Stop is returned there: the run ends anyway. Patience 0 never stops early."""
    hook = BestOnValidation(every=2, patience=0, score=lambda model: model)
    assert hook(step_info(2, 0.5)) is None
    assert hook(step_info(4, 0.1)) is None and hook(step_info(6, 0.0)) is None
    assert hook(step_info(6, 0.0, is_last=True)) is None
    assert [s for s, _ in hook.history] == [2, 4, 6]
    assert hook.best_step == 2


def test_the_scoring_seconds_are_handed_back_to_the_budget(monkeypatch):
    """A budget hook given to the validation hook gets each scoring's seconds back on its own clock."""
    budget = StageBudget(100.0, "wall")
    paused: list[tuple[float, float]] = []
    monkeypatch.setattr(budget, "pause", lambda wall, cpu: paused.append((wall, cpu)))
    import time

    hook = BestOnValidation(every=1, patience=0, score=lambda model: time.sleep(0.05) or model, budget=budget)
    hook(step_info(1, 0.5))
    assert len(paused) == 1 and paused[0][0] >= 0.05 and hook.wall_seconds == paused[0][0]
    assert hook.cpu_seconds == paused[0][1]


def test_bad_settings_and_no_score_are_clear_errors():
    with pytest.raises(ConfigError, match="every >= 1"):
        BestOnValidation(every=0, patience=1, score=float)
    with pytest.raises(ConfigError, match="no validation evaluation ran"):
        BestOnValidation(every=1, patience=1, score=float).best_model()
