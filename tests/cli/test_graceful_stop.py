"""SIGTERM / Ctrl-C in the middle of a real `tempax sft` process: the step in flight finishes, a checkpoint of it
is written, the reason is recorded, the exit status is 143 / 130, and the resumed run equals an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tempax.cli.main import main
from tests.cli.test_train_cmds import workspace  # noqa: F401  (the fixture: a tiny LoRA recipe)
from tests.kit.compile_cache import persistent_compile_cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _records(run):
    path = os.path.join(run, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def _interrupt(recipe, run, sig, cache):
    """Starts 2000 steps, sends `sig` once 3 steps are logged; (exit status, stdout, stderr). Compiled steps go to the
    persistent cache `cache`, so the in-process runs after it do not compile them again."""
    argv = [sys.executable, "-m", "tempax.cli.main", "sft", "--config", str(recipe), "train.steps=2000",
            f"train.run_dir={run}", "train.checkpoint.every=0"]
    env = {**os.environ, "PYTHONPATH": ROOT, "TEMPAX_REEXEC": "0", "JAX_COMPILATION_CACHE_DIR": str(cache),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while len(_records(run)) < 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out, err


@pytest.mark.heavy
def test_sigterm_mid_run_saves_the_current_step_and_resume_matches(workspace, tmp_path):  # noqa: F811
    root, recipe, _ = workspace
    run = str(tmp_path / "run")
    code, out, err = _interrupt(recipe, run, signal.SIGTERM, tmp_path / "xla-cache")
    name = "SIGTERM"
    assert code == 143, err[-3000:]
    records = _records(run)
    stopped = records[-1]["step"]
    # The run ends with one stop event, whether the signal came during a step (that step's record carries the
    # reason too) or while its hooks ran (then no further batch is drawn).
    assert 3 <= stopped < 2000 and records[-1]["event"] == "stop" and records[-1]["stop_reason"] == name
    # Every step's record once.
    assert [r["step"] for r in records if "loss" in r] == list(range(1, stopped + 1))
    assert os.listdir(os.path.join(run, "checkpoints")) == [str(stopped)]  # checkpoint.every=0: only the stop's
    assert f"tempax sft: stopped on {name} after step {stopped}; saved checkpoint {run}/checkpoints/{stopped}" in err
    assert "SIGTERM received: finishing this step, saving a checkpoint, then stopping" in out
    assert "Traceback" not in err
    # Resume to two steps past the stop; an uninterrupted run of that length gives the same loss at every step.
    end = stopped + 2
    whole = str(tmp_path / "whole")
    with persistent_compile_cache(tmp_path / "xla-cache"):
        assert main(["sft", "--config", str(recipe), f"train.steps={end}", f"train.run_dir={run}"]) == 0
        assert main(["sft", "--config", str(recipe), f"train.steps={end}", f"train.run_dir={whole}"]) == 0
    resumed, uninterrupted = _records(run), _records(whole)
    assert [r["step"] for r in resumed if "loss" in r] == list(range(1, end + 1))
    assert [r["loss"] for r in resumed if "loss" in r] == [r["loss"] for r in uninterrupted]


def test_first_ctrl_c_in_fit_stops_after_the_step_with_a_checkpoint(tmp_path):
    """In-process: a hook presses Ctrl-C during step 3; fit finishes it, checkpoints step 3, records SIGINT and
    raises RunStopped (exit status 130); the signal handlers are back to what they were."""
    import numpy as np

    from tempax.algorithms.sft.main import make_sft_loss
    from tempax.train.hooks import every
    from tempax.train.loop import Trainer
    from tempax.train.metrics import read_metrics
    from tempax.train.preemption import RunStopped
    from tests.train.helpers import TableLM, tiny_train_config
    from tests.train.test_checkpoint_integrity import _loader

    before = signal.getsignal(signal.SIGINT)  # Python's handler, or SIG_IGN in a job started in the background
    cfg = tiny_train_config(tmp_path, steps=6, batch_size=4, seq_len=16)
    trainer = Trainer(TableLM(np.zeros((16, 16))), make_sft_loss(), cfg)
    press = every(1, lambda info: info.step == 3 and os.kill(os.getpid(), signal.SIGINT))
    with pytest.raises(RunStopped) as info:
        trainer.fit(_loader(), hooks=[press])
    trainer.close()
    stopped = info.value.step  # 3: the press came during step 3's hooks, so no batch 4 was drawn
    assert info.value.exit_status == 130 and stopped == 3
    assert os.listdir(tmp_path / "checkpoints") == [str(stopped)]
    assert read_metrics(str(tmp_path))[-1]["stop_reason"] == "SIGINT"
    assert signal.getsignal(signal.SIGINT) is before
