"""The entropy-collapse guard on hand-made metric sequences: when it fires, what it says, what it does."""

from __future__ import annotations

import pytest

from tempax.errors import ConfigError
from tempax.train.guards import CollapseGuard, CollapseGuardConfig
from tempax.train.hooks import StepInfo, Stop


class _Trainer:
    """The members of the trainer view (`tempax.train.view.TrainerView`) the guard reads: the step and `write`."""

    def __init__(self):
        self.lines = []
        self.step = 0

    def write(self, text):
        self.lines.append(text)


def feed(guard, series):
    """Calls the guard on steps 1..n with the given metrics; returns (step, result, info) of each step."""
    trainer = _Trainer()
    guard.start(trainer)
    out = []
    for step, metrics in enumerate(series, start=1):
        info = StepInfo(step, trainer, False)
        info.add_metrics(metrics)
        out.append((step, guard(info), info))
    return out, trainer


ENTROPY = [0.6, 0.5, 0.4, 0.1, 0.05, 0.05, 0.05]


def test_fires_at_the_step_the_entropy_window_falls_below_a_quarter_of_its_baseline():
    """Baseline = mean of steps 1-3 = 0.5; a fall of more than 75% means below 0.125. Window of 2: step 4 mean
    (0.4 + 0.1) / 2 = 0.25 (no), step 5 (0.1 + 0.05) / 2 = 0.075 (fires: 85% down). Cooldown 5: silent at 6, 7."""
    guard = CollapseGuard(CollapseGuardConfig(), advice=lambda: "set grpo.temperature=1.3")
    out, trainer = feed(guard, [{"entropy": e} for e in ENTROPY])
    fired = [step for step, _, info in out if "guard/fired" in info.metrics()]
    assert fired == [5] and [e.step for e in guard.events] == [5]
    m = out[4][2].metrics()
    assert m["guard/entropy_drop"] == pytest.approx(0.85) and m["guard/entropy_drop_threshold"] == 0.75
    assert m["guard/action"] == "warn" and out[4][1] is None
    msg = guard.events[0].message
    assert "entropy collapse" in msg and "fell to 0.075" in msg and "from 0.500" in msg and "85% down" in msg
    assert "set grpo.temperature=1.3" in msg
    assert trainer.lines == [f"collapse guard, step 5: {msg}"]


def test_stop_returns_a_stop_and_adjustments_call_the_algorithm():
    """action stop -> Stop at step 5 naming the step; action raise_temperature -> adjust('raise_temperature') once,
    its description appended to the message; the run goes on."""
    out, _ = feed(CollapseGuard(CollapseGuardConfig(action="stop")), [{"entropy": e} for e in ENTROPY[:5]])
    assert isinstance(out[4][1], Stop) and out[4][1].reason.startswith("collapse guard at step 5: entropy collapse")
    calls = []
    guard = CollapseGuard(CollapseGuardConfig(action="raise_temperature"),
                          adjust=lambda action: calls.append(action) or "temperature 0.5 -> 0.8")
    out, _ = feed(guard, [{"entropy": e} for e in ENTROPY])
    assert calls == ["raise_temperature"] and out[4][1] is None
    assert guard.events[0].change == "temperature 0.5 -> 0.8"
    assert "Adjusted (raise_temperature): temperature 0.5 -> 0.8." in guard.events[0].message
    with pytest.raises(ConfigError, match="adjust"):
        CollapseGuard(CollapseGuardConfig(action="clip_higher"))


def test_zero_spread_duplicates_and_length():
    """Zero-spread fractions 0.5, 1, 1 (window mean of steps 2-3 = 1 > 0.9) fire at step 3 with no baseline
    needed; duplicates likewise; lengths 40, 40, 40, 8, 8 (mean 8 < 25% of 40) fire at step 5. The message says
    what collapsed without calling it an entropy collapse."""
    guard = CollapseGuard(CollapseGuardConfig())
    feed(guard, [{"groups/zero_spread_frac": v, "completion/duplicate_frac": v} for v in (0.5, 1.0, 1.0)])
    assert [e.step for e in guard.events] == [3]
    assert set(guard.events[0].signals) == {"groups/zero_spread_frac", "completion/duplicate_frac"}
    assert guard.events[0].message.startswith("exploration collapse: 100% of groups gave every completion")
    guard = CollapseGuard(CollapseGuardConfig())
    feed(guard, [{"completion/length_mean": v} for v in (40, 40, 40, 8, 8)])
    assert [e.step for e in guard.events] == [5] and "shrank to 8.0 tokens from 40.0" in guard.events[0].message


def test_disabled_or_quiet_runs_never_fire_and_bad_thresholds_are_rejected():
    assert not feed(CollapseGuard(CollapseGuardConfig(enabled=False)), [{"entropy": e} for e in ENTROPY])[0][4][2] \
        .metrics().get("guard/fired")
    steady = CollapseGuard(CollapseGuardConfig())
    feed(steady, [{"entropy": 0.5, "groups/zero_spread_frac": 0.5, "completion/length_mean": 30.0}] * 10)
    assert steady.events == []
    from tempax.configlib import from_dict

    with pytest.raises(ConfigError, match="action"):
        from_dict(CollapseGuardConfig, {"action": "explode"})
    with pytest.raises(ConfigError, match="max_entropy_drop"):
        from_dict(CollapseGuardConfig, {"max_entropy_drop": 0.0})


def test_a_collapse_on_one_turn_fires_although_the_mean_entropy_holds():
    """Multi-turn episodes: the loss's mean entropy stays at 0.5, but turn 2's sampled entropy follows ENTROPY
    (baseline 0.5 over steps 1-3, window (0.1 + 0.05) / 2 = 0.075 at step 5: 85% down), so the guard fires at
    step 5 on `entropy/turn_2` and says which turn; turn 1 (flat 0.8) is not named."""
    guard = CollapseGuard(CollapseGuardConfig())
    series = [{"entropy": 0.5, "entropy/turn_1": 0.8, "entropy/turn_2": e} for e in ENTROPY]
    out, _ = feed(guard, series)
    fired = [step for step, _, info in out if "guard/fired" in info.metrics()]
    assert fired == [5]
    m = out[4][2].metrics()
    assert m["guard/entropy/turn_2_drop"] == pytest.approx(0.85)
    assert "guard/entropy_drop" not in m and "guard/entropy/turn_1_drop" not in m
    msg = guard.events[0].message
    assert "entropy collapse" in msg and "turn 2's sampled entropy fell 85%" in msg and "turn 1" not in msg
