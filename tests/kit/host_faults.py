"""A `tempax` command with its process killed at a chosen point, for the two-host tests (`tests/kit/hosts.py`).

    python -m tests.kit.host_faults FAULT STEP -- sft --config R.yaml ...

FAULT: kill_step (SIGKILL once training step STEP is dispatched and not finished), kill_save (SIGKILL right after
checkpoint STEP's asynchronous write started, while its files are being written). The process kills itself at
that point, exactly, which a kill from outside could only hit by chance; the test then kills whatever else
runs on the host (`Host.kill_all`).
"""

from __future__ import annotations

import os
import signal
import sys

from tempax.cli.main import main
from tempax.train import checkpoint as checkpoint_module
from tempax.train.loop import Trainer


def _die() -> None:
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def inject(fault: str, step: int) -> None:
    if fault == "kill_step":
        dispatch = Trainer.train_step

        def train_step_unwaited(self, batch):
            out = dispatch(self, batch)
            train_step_unwaited.calls += 1
            if train_step_unwaited.calls == step:  # a fresh run: call n is step n, dispatched and not waited for
                _die()
            return out

        train_step_unwaited.calls = 0

        Trainer.train_step = train_step_unwaited
    elif fault == "kill_save":
        save = checkpoint_module.Checkpointer.save

        def killing_save(self, state, **kw):
            out = save(self, state, **kw)
            if out == step:
                _die()
            return out

        checkpoint_module.Checkpointer.save = killing_save
    else:
        raise SystemExit(f"unknown fault {fault}")


if __name__ == "__main__":
    fault, at_step, dash, *command = sys.argv[1:]
    assert dash == "--", "usage: python -m tests.kit.host_faults FAULT STEP -- COMMAND ..."
    inject(fault, int(at_step))
    sys.argv = ["tempax", *command]  # set the process up as the `tempax` command does
    sys.exit(main())
