"""tempax.rl.throughput: the generation / training split of an on-policy step."""

from __future__ import annotations

import pytest

from tempax.rl.throughput import ThroughputSplit
from tempax.train.hooks import StepInfo


def test_the_split_of_one_step():
    """The batch took 3 s to draw (of which 2.4 s generating) and the step 1 s to train: step 4 s, training 1 s,
    generation 2.4 / 4 = 0.6 of the step."""
    info = StepInfo(step=1, trainer=None, is_last=False, data_s=3.0, train_s=1.0)
    info.add_metrics({"perf/generation_s": 2.4})
    hook = ThroughputSplit()
    assert hook.due(1, False) and hook.due(7, False) and hook.due(7, True)
    hook(info)
    m = info.metrics()
    assert m["perf/train_s"] == 1.0 and m["perf/step_s"] == 4.0
    assert m["perf/generation_frac"] == pytest.approx(0.6)


def test_a_step_without_generation_time_reports_none():
    """An offline batch: no perf/generation_s, so the fraction is 0; a zero-length step does not divide by 0."""
    info = StepInfo(step=2, trainer=None, is_last=True, data_s=0.0, train_s=0.0)
    ThroughputSplit()(info)
    assert info.metrics() == {"perf/train_s": 0.0, "perf/step_s": 0.0, "perf/generation_frac": 0.0}
