"""The fault suite: a tiny run (`tests/faults/child.py`: a 64-token table model, 6 steps, a checkpoint every step,
asynchronous saves) is hit by one fault at a time, then resumed; the resumed run's losses must equal the
uninterrupted run's exactly, and nothing the user sees holds a traceback.

Fault classes x injection points: kill -9 (mid-step, mid-async-save, mid-metrics-line), a full disk (at the first
save, at a later one, and with on_save_error=retry), a second process on the run dir (and a run dir that is a
file), a damaged latest checkpoint (a truncated, a bit-flipped, a deleted array file; and one without checksums).
The uninterrupted reference is run once, in this process.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from tempax.train.checkpoint import FILES_RECORD, Checkpointer, DamagedCheckpoint
from tempax.train.hooks import Hook
from tempax.train.metrics import read_metrics
from tempax.train.run_identity import LOCK_FILE, hold_run_dir
from tests.faults.child import STEPS, make_loader, make_trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("xla-cache"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run's losses, steps 1-6."""
    t = make_trainer(str(tmp_path_factory.mktemp("whole")))
    losses = t.fit(make_loader()).losses
    t.close()
    assert len(losses) == STEPS
    return losses


def _env(cache):
    return {**os.environ, "PYTHONPATH": ROOT, "JAX_COMPILATION_CACHE_DIR": cache,
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def _child(run_dir, fault, step, cache):
    return subprocess.run([sys.executable, "-m", "tests.faults.child", str(run_dir), fault, str(step)], cwd=ROOT,
                          env=_env(cache), capture_output=True, text=True, timeout=300)


def _resume(run_dir, reference):
    """Resumes in this process, under the run lock (a killed holder left none); checks losses and metrics.jsonl."""
    said = []
    with hold_run_dir(str(run_dir)):
        t = make_trainer(str(run_dir), log=said.append)
        result = t.fit(make_loader())
        t.close()
    assert result.losses == reference[result.resumed_from:], said
    records = [r for r in read_metrics(str(run_dir)) if "loss" in r]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in records] == reference
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            json.loads(line)  # every line whole
    return result, said


@pytest.mark.heavy
@pytest.mark.parametrize("fault", ["kill_step", "kill_save", "kill_metrics"])
def test_kill_9_then_resume_matches(tmp_path, reference, cache, fault, survived):
    run = tmp_path / "run"
    out = _child(run, fault, 3, cache)
    assert out.returncode == -signal.SIGKILL, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    result, said = _resume(run, reference)
    assert 0 < result.resumed_from <= 3
    if fault == "kill_metrics":
        assert any("removed a last line cut short" in s or "dropped" in s for s in said), said
    assert "Traceback" not in "\n".join(said)
    survived("kill -9", fault.removeprefix("kill_"))


@pytest.mark.parametrize("step", [1, 4])
def test_full_disk_at_a_save_stops_with_one_line_and_resumes(tmp_path, reference, cache, step, survived):
    """RLIMIT_FSIZE from step `step`'s hooks on: the save still being written then (the previous step's, when its
    background write had not finished) or this step's fails; the run stops at the next save with exit status 4, one
    line naming the file, the space needed and free; nothing of the failed step is left and the one before it is
    intact. The resumed run (space back) matches."""
    run = tmp_path / "run"
    out = _child(run, "full_disk", step, cache)
    assert out.returncode == 4, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "orbax" not in out.stderr.lower().replace("orbax-checkpoint-tmp", ""), \
        out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.startswith("child: error:")]
    assert len(lines) == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    line = lines[0]
    failed = int(line.split("checkpoint step ", 1)[1].split(" ", 1)[0])
    assert failed in (step - 1, step) and failed >= 1, line
    assert f"checkpoint step {failed} was not saved" in line and "File too large (errno 27)" in line
    assert "it needs about" in line and "free on the file system" in line and "run the same command again" in line
    checkpoints = run / "checkpoints"
    assert not glob.glob(str(checkpoints / "*tmp*")), os.listdir(checkpoints)
    ckpt = Checkpointer(str(checkpoints))
    assert ckpt.all_steps() == list(range(max(1, failed - 3), failed))  # keep=3; none at all for the first save
    for s in ckpt.all_steps():
        ckpt.verify(s)
    ckpt.close()
    assert ("there is no earlier checkpoint" in line) == (failed == 1)
    result, _ = _resume(run, reference)
    assert result.resumed_from == failed - 1
    survived("full disk", "first save" if step == 1 else "later save")


def test_full_disk_with_retry_keeps_training(tmp_path, reference, cache, survived):
    run = tmp_path / "run"
    out = _child(run, "full_disk_retry", 2, cache)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    warned = [line for line in out.stderr.splitlines() if line.startswith("warning: checkpoint step")]
    assert warned and all("on_save_error=retry: training goes on" in w for w in warned)
    assert json.loads(out.stdout.strip().splitlines()[-1])["losses"] == reference
    ckpt = Checkpointer(str(run / "checkpoints"))
    assert ckpt.latest_step() == STEPS and ckpt.has_checksums(STEPS)
    ckpt.verify(STEPS)
    ckpt.close()
    survived("full disk", "retry at the next interval")


@pytest.mark.heavy
def test_second_process_on_the_run_dir_is_refused_at_once(tmp_path, reference, cache, survived):
    """A run holds its run dir; `tempax sft` on it exits 2 in one line naming the holder's PID and host, before
    loading anything; the first run goes on undisturbed. A run dir that is a file is one line too."""
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-m", "tests.faults.child", str(run), "hold", "2"], cwd=ROOT,
                              env=_env(cache), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        argv = [sys.executable, "-m", "tempax.cli.main", "sft", f"train.run_dir={run}", "train.steps=1"]
        second = subprocess.run(argv, cwd=ROOT, env=_env(cache), capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr[-3000:]
        err = second.stderr.strip().splitlines()
        assert err[-1] == (f"tempax sft: error: {run} is in use by process {holder.pid} on {socket.gethostname()}, "
                           "which is training in it; wait for it to finish (or stop it), or set train.run_dir to "
                           "another folder"), second.stderr
        # At once: nothing was loaded or reported before the refusal, only the line every run without --config
        # prints first (no data report, no model, no memory plan).
        assert len(err) == 2 and err[0].startswith("tempax sft: no --config;"), second.stderr
        afile = tmp_path / "afile"
        afile.write_text("not a folder\n")
        third = subprocess.run([*argv[:4], f"train.run_dir={afile}", "train.steps=1"], cwd=ROOT, env=_env(cache),
                               capture_output=True, text=True, timeout=120)
        assert third.returncode == 2 and "Traceback" not in third.stderr, third.stderr
        assert third.stderr.strip().splitlines()[-1] == (
            f"tempax sft: error: train.run_dir={afile} is an existing file, not a folder; set train.run_dir to a "
            "folder (a new one starts a new run)")
        assert afile.read_text() == "not a folder\n"
    finally:
        (run / "go").touch()
        out, err = holder.communicate(timeout=300)
    assert holder.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["losses"] == reference
    assert os.path.isfile(run / LOCK_FILE)
    survived("second process", "run dir held")


class _Crash(Hook):
    """A crash at step 5, before its checkpoint: checkpoints 2, 3, 4 stay (keep=3)."""

    def __init__(self):
        super().__init__(every=1, at_end=False)

    def __call__(self, info):
        if info.step == 5:
            raise RuntimeError("simulated crash")


def _crashed(run_dir):
    t = make_trainer(str(run_dir))
    with pytest.raises(RuntimeError, match="simulated crash"):
        t.fit(make_loader(), hooks=[_Crash()])
    t.close()


def _data_file(run_dir):
    files = glob.glob(str(run_dir / "checkpoints" / "4" / "params" / "ocdbt.process_0" / "d" / "*"))
    assert files
    return max(files, key=os.path.getsize)  # the arrays' data (the other holds the index)


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _flip(path):
    """One bit of a byte in the middle of the array data; the size stays."""
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0x10]))


@pytest.mark.parametrize("damage, reason", [(_truncate, "is truncated"), (_flip, "changed content since it was saved"),
                                            (os.remove, "is missing")])
def test_damaged_array_file_falls_back_to_the_newest_intact_step(tmp_path, reference, damage, reason, survived):
    _crashed(tmp_path)
    path = _data_file(tmp_path)
    size = os.path.getsize(path)
    damage(path)
    if damage is _flip:
        assert os.path.getsize(path) == size
        ckpt = Checkpointer(str(tmp_path / "checkpoints"))
        with pytest.raises(DamagedCheckpoint, match="changed content"):  # export reads params through this
            ckpt.restore_params({"table": __import__("jax").ShapeDtypeStruct((64, 64), "float32")}, 4)
        ckpt.close()
    result, said = _resume(tmp_path, reference)
    skipped = [s for s in said if s.startswith("skipping checkpoint step 4:")]
    assert len(skipped) == 1 and path in skipped[0] and reason in skipped[0], said
    assert result.resumed_from == 3
    survived("damaged checkpoint", {_truncate: "truncated", _flip: "bit flip", os.remove: "deleted"}[damage])


def test_checkpoint_without_checksums_is_read_in_full_before_it_is_trusted(tmp_path, reference, survived):
    _crashed(tmp_path)
    record = tmp_path / "checkpoints" / "4" / FILES_RECORD
    data = json.loads(record.read_text())
    record.write_text(json.dumps({"files": data["files"]}))  # as an older tempax wrote it: sizes only
    result, said = _resume(tmp_path, reference)
    assert result.resumed_from == 4
    assert said[0] == ("checkpoint step 4 has no content checksums (an older tempax wrote it, or the run stopped "
                       "before its record was written): reading it in full to verify it before it is trusted"), said
    assert "crc32" in json.loads(record.read_text()) or not record.exists()  # verified, then recorded (or resaved)
    survived("damaged checkpoint", "no checksums")
