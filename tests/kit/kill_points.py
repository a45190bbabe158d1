"""SIGKILL a training process at an exact point of its run, for the fault tests (`tests/faults/child.py`) and the
two-host tests (`tests/kit/host_faults.py`): a kill from outside could only hit these points by chance."""

from __future__ import annotations

import os
import signal
import sys

from tempax.train import checkpoint as checkpoint_module
from tempax.train.loop import Trainer

KILL_POINTS = ("kill_step", "kill_save")


def die() -> None:
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def install_kill(fault: str, step: int) -> None:
    """kill_step: die once training step `step` is dispatched to the device and not waited for (a fresh run's
    call n is step n). kill_save: die right after checkpoint `step`'s asynchronous write started, while Orbax's
    background threads are writing its files."""
    if fault == "kill_step":
        dispatch = Trainer.train_step

        def train_step_unwaited(self, batch):
            out = dispatch(self, batch)
            train_step_unwaited.calls += 1
            if train_step_unwaited.calls == step:
                die()
            return out

        train_step_unwaited.calls = 0
        Trainer.train_step = train_step_unwaited
    elif fault == "kill_save":
        save = checkpoint_module.Checkpointer.save

        def killing_save(self, state, **kw):
            out = save(self, state, **kw)
            if out == step:
                die()
            return out

        checkpoint_module.Checkpointer.save = killing_save
    else:
        raise ValueError(f"unknown kill point {fault!r}; one of {KILL_POINTS}")
