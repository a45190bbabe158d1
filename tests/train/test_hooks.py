"""tempax.train.hooks: when a hook is due, what a step's record holds, and the built-in logging, checkpoint and
evaluation hooks against a stand-in trainer (the loop itself: tests/train/test_loop.py)."""

from __future__ import annotations

import pytest

from tempax.train.hooks import CheckpointHook, EvalHook, Hook, LoggingHook, StepInfo, Stop, every


class FakeTrainer:
    """What the hooks read of the trainer (`TrainerView`): log, write, save_checkpoint, evaluate, step."""

    def __init__(self, step: int = 0):
        self.step = step
        self.logged: list[tuple[int, dict]] = []
        self.written: list[str] = []
        self.saved: list = []
        self.evaluated: list = []

    def log(self, step, metrics):
        self.logged.append((step, dict(metrics)))

    def write(self, text):
        self.written.append(text)

    def save_checkpoint(self, data_state):
        self.saved.append(data_state)

    def evaluate(self, batches, *, max_batches=0):
        self.evaluated.append((list(batches), max_batches))
        return {"loss": 1.25, "token_accuracy": 0.5}


def test_cadence():
    """every=3: due at steps 3, 6, ...; at_end also at the last step; every=0: only at the end."""
    hook = Hook(every=3)
    assert [s for s in range(1, 8) if hook.due(s, is_last=False)] == [3, 6]
    assert hook.due(7, is_last=True) and not Hook(every=3, at_end=False).due(7, is_last=True)
    only_end = Hook(every=0)
    assert not any(only_end.due(s, False) for s in range(1, 5)) and only_end.due(4, True)
    with pytest.raises(ValueError, match="hook cadence must be >= 0"):
        Hook(every=-1)


def test_every_wraps_a_function_whose_result_is_the_hooks():
    seen = []
    hook = every(2, lambda info: seen.append(info.step) or (Stop("enough") if info.step >= 4 else None))
    assert not hook.at_end and hook.due(2, False) and not hook.due(3, True)
    assert hook(StepInfo(step=2, trainer=None, is_last=False)) is None
    assert hook(StepInfo(step=4, trainer=None, is_last=False)) == Stop("enough")
    assert seen == [2, 4]


def test_a_steps_record_holds_the_loss_functions_numbers_and_what_hooks_added():
    """Device metrics are fetched to the host once; added metrics join (and override) them; the data state is
    asked for only when a hook reads it, and once."""
    asked = []
    info = StepInfo(step=5, trainer=None, is_last=False, _device_metrics={"loss": 2.0, "num_tokens": 12},
                    _data_state_fn=lambda: asked.append(1) or {"position": 9})
    info.add_metrics({"perf/generation_s": 0.5, "loss": 1.5})
    assert info.metrics() == {"loss": 1.5, "num_tokens": 12, "perf/generation_s": 0.5}
    assert asked == []
    assert info.data_state == {"position": 9} and info.data_state == {"position": 9} and asked == [1]


def test_logging_reports_tokens_per_second_over_the_interval(monkeypatch):
    """The clock reads 10.0 at the first logged step 2 and 14.0 at step 6: 4 steps in 4 s, 512 tokens a step ->
    512 tokens/s and 1 s a step. The first record has no interval yet."""
    clock = iter([10.0, 14.0])
    monkeypatch.setattr("time.perf_counter", lambda: next(clock))
    trainer, hook = FakeTrainer(), LoggingHook(every=2, tokens_per_step=512)
    hook.start(trainer)
    hook(StepInfo(step=2, trainer=trainer, is_last=False, _device_metrics={"loss": 3.0}))
    hook(StepInfo(step=6, trainer=trainer, is_last=False, _device_metrics={"loss": 2.0}))
    assert trainer.logged[0] == (2, {"loss": 3.0})
    assert trainer.logged[1] == (6, {"loss": 2.0, "tokens_per_s": 512.0, "step_time_s": 1.0})


def test_checkpoint_and_eval_hooks():
    trainer = FakeTrainer(step=0)
    CheckpointHook(every=10)(StepInfo(step=10, trainer=trainer, is_last=False, _data_state_fn=lambda: {"p": 1}))
    assert trainer.saved == [{"p": 1}]
    hook = EvalHook(every=5, batches=lambda: iter([{"x": 1}, {"x": 2}]), max_batches=1, at_start=True)
    hook.start(trainer)  # at_start: the starting weights are evaluated too, at step 0
    hook(StepInfo(step=5, trainer=trainer, is_last=False))
    assert [step for step, _ in hook.history] == [0, 5]
    assert trainer.evaluated[0] == ([{"x": 1}, {"x": 2}], 1)
    assert trainer.logged[-1] == (5, {"eval/loss": 1.25, "eval/token_accuracy": 0.5})
    assert trainer.written[-1] == "step 5: eval loss 1.2500"
