"""A training run in a child process with one fault injected, for the fault suite (`tests/faults`).

    python -m tests.faults.child RUN_DIR FAULT STEP

FAULT: none, kill_step (SIGKILL with step STEP dispatched and not finished), kill_save (SIGKILL right after
checkpoint STEP's asynchronous write started), kill_metrics (SIGKILL halfway through writing step STEP's
metrics line), full_disk (from step STEP's hooks on, files may grow only 4 KiB past metrics.jsonl's size:
`RLIMIT_FSIZE`, with SIGXFSZ ignored so writes fail with EFBIG as on a full disk), full_disk_retry (the same
with train.checkpoint.on_save_error=retry, the limit lifted two steps later), hold (hold the run dir's lock
and wait at step STEP until RUN_DIR/go exists). The run holds its run dir's lock as `tempax` commands do, reports
a `TempaxError` in one line with its exit status like the command line, and prints the losses as JSON last.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time

import numpy as np

from tempax.algorithms.sft.main import make_sft_loss
from tempax.data.loader import sft_loader
from tempax.errors import TempaxError
from tempax.train import metrics as metrics_module
from tempax.train.config import CheckpointConfig, OptimizerConfig
from tempax.train.hooks import Hook
from tempax.train.loop import Trainer
from tempax.train.run_identity import hold_run_dir
from tests.kit.kill_points import KILL_POINTS, die, install_kill
from tests.train.helpers import TableLM, random_examples, tiny_train_config

VOCAB = 64  # a random 64 x 64 table: 16 KiB of incompressible float32 per array, far above the 4 KiB headroom
STEPS = 6


def make_trainer(run_dir: str, log=None, on_save_error: str = "stop") -> Trainer:
    cfg = tiny_train_config(
        run_dir, steps=STEPS, batch_size=4, seq_len=16,
        optimizer=OptimizerConfig(learning_rate=0.1, schedule="cosine", warmup_steps=2),
        checkpoint=CheckpointConfig(every=1, keep=3, save_at_end=True, async_save=True, on_save_error=on_save_error),
    )
    table = np.random.RandomState(0).randn(VOCAB, VOCAB).astype(np.float32)
    return Trainer(TableLM(table), make_sft_loss(), cfg, log=log)


def make_loader():
    return sft_loader(random_examples(40, vocab=VOCAB, seed=3), batch_size=4, seq_len=16, pad_id=0, seed=7)


class _AtStep(Hook):
    """Runs `action(info)` at step `step`, before the checkpoint hook."""

    def __init__(self, step, action):
        super().__init__(every=1, at_end=False)
        self.step, self.action = step, action

    def __call__(self, info):
        if info.step == self.step:
            self.action(info)


def inject(fault: str, step: int, run_dir: str) -> list[Hook]:
    if fault in KILL_POINTS:
        install_kill(fault, step)
    elif fault == "kill_metrics":
        append = metrics_module.MetricsWriter._append

        def torn_append(self, line):
            if json.loads(line).get("step") == step and b'"loss"' in line:
                os.write(self._fd, line[: len(line) // 2])
                die()
            append(self, line)

        metrics_module.MetricsWriter._append = torn_append
    elif fault in ("full_disk", "full_disk_retry"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]

        def fill(info):
            metrics = os.path.join(run_dir, "metrics.jsonl")
            size = os.path.getsize(metrics) if os.path.isfile(metrics) else 0  # step 1: logged after this hook
            resource.setrlimit(resource.RLIMIT_FSIZE, (size + 4096, hard))

        def free(info):  # with retry: space comes back two steps later
            resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))

        return [_AtStep(step, fill)] + ([_AtStep(step + 2, free)] if fault == "full_disk_retry" else [])
    elif fault == "hold":
        def wait(info):
            print("holding", flush=True)
            while not os.path.exists(os.path.join(run_dir, "go")):
                time.sleep(0.05)

        return [_AtStep(step, wait)]
    elif fault != "none":
        raise SystemExit(f"unknown fault {fault}")
    return []


def main(argv: list[str]) -> int:
    run_dir, fault, step = argv[0], argv[1], int(argv[2])
    try:
        with hold_run_dir(run_dir):
            trainer = make_trainer(run_dir, log=lambda text: print(text, file=sys.stderr),
                                   on_save_error="retry" if fault == "full_disk_retry" else "stop")
            hooks = inject(fault, step, run_dir)
            try:
                result = trainer.fit(make_loader(), hooks=hooks)
            finally:
                trainer.close()
    except TempaxError as e:
        print(f"child: error: {e}", file=sys.stderr)
        return getattr(e, "exit_status", 2)
    print(json.dumps({"resumed_from": result.resumed_from, "losses": result.losses}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
