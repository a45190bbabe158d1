"""metrics.jsonl after a resume reads as one clean curve; nothing is created before the first record."""

from __future__ import annotations

import json
import os

from tempax.train.metrics import MetricsWriter, ProgressBar, read_metrics, truncate_after
from tests.train.test_checkpoint_integrity import _crashed_run, _remove_params_metadata, _resume


def _steps(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line)["step"] for line in f]


def test_resumed_run_leaves_each_step_once_in_the_file(tmp_path):
    """Steps 1-4 logged, checkpoint 4 damaged: the resume from 3 drops row 4 and writes 4, 5, 6 again, so the raw
    file holds steps 1..6 once each (not 1, 2, 3, 4, 4, 5, 6)."""
    _crashed_run(str(tmp_path))
    _remove_params_metadata(str(tmp_path))
    assert _steps(str(tmp_path)) == [1, 2, 3, 4]
    result, said = _resume(str(tmp_path))
    assert result.resumed_from == 3
    assert _steps(str(tmp_path)) == [1, 2, 3, 4, 5, 6]
    assert "metrics.jsonl: dropped 1 row of steps after 3 (they are run again from the checkpoint)" in said
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2, 3, 4, 5, 6]


def test_truncate_after_keeps_steps_up_to_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}, {"step": 2, "eval/loss": 2.5},
            {"step": 3, "loss": 1.0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "lo')  # a row cut by a kill
    assert truncate_after(str(path), 2) == 2  # step 3 and the cut row
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows[:3]
    assert truncate_after(str(path), 0) == 3 and path.read_text() == ""  # a fresh start keeps nothing


def test_nothing_is_written_before_the_first_record(tmp_path):
    writer = MetricsWriter(str(tmp_path / "run"), report_to=("tensorboard",), resume_step=0)
    writer.close()
    assert not (tmp_path / "run").exists()
    writer = MetricsWriter(str(tmp_path / "run"), report_to=("tensorboard",), resume_step=0)
    writer.write(1, {"loss": 1.5})
    writer.event(1, "stopped", reason="SIGTERM")
    writer.close()
    records = read_metrics(str(tmp_path / "run"))
    assert [(r["step"], r.get("loss"), r.get("event")) for r in records] == [(1, 1.5, None), (1, None, "stopped")]
    assert os.listdir(tmp_path / "run" / "tb")


def test_progress_bar_shows_the_step_it_just_logged(capfd):
    """The bar is drawn again when the step's metrics arrive, so its last line pairs step 1 with step 1's loss
    (before, the loss appeared only with the next step's redraw)."""
    bar = ProgressBar(10, enabled=True, terminal=True)
    bar.update(1)
    bar.update(0, {"loss": 1.2345})
    last = capfd.readouterr().err.rsplit("\r", 1)[-1]
    assert "1/10" in last and "loss=1.2345" in last, last
    bar.close()


def test_off_a_terminal_progress_is_plain_lines_without_carriage_returns(capfd):
    """stderr to a file (capfd's is one): no tqdm frames, one line per logged step with its figures."""
    bar = ProgressBar(10, initial=2, enabled=True)
    bar.update(1)
    bar.update(0, {"loss": 1.2345, "lr": 1e-3, "tokens_per_s": 1712.4, "grad_norm": 0.5})
    bar.update(7, {"loss": 0.5})
    bar.close()
    err = capfd.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("train step 3/10: loss 1.2345, lr 1.00e-03, tok/s 1712, ") and lines[0].endswith(" left")
    assert lines[1] == "train step 10/10: loss 0.5000"


def test_a_torn_last_line_is_removed_before_the_next_record(tmp_path):
    """A line cut short (the machine died mid-write) would glue the next record onto it; the writer cuts it off
    first, says so, and every line is whole JSON afterwards."""
    from tempax.train.metrics import MetricsWriter

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "lo')
    said = []
    writer = MetricsWriter(str(tmp_path), report_to=(), say=said.append)
    writer.write(2, {"loss": 2.25})
    writer.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert said == ["metrics.jsonl: removed a last line cut short by an earlier run (15 bytes)"]  # len('{"step": 2, "lo')


def test_a_failed_metrics_write_leaves_no_partial_line(tmp_path):
    """A real EFBIG in a child process (RLIMIT_FSIZE below the next line's end, SIGXFSZ ignored): one line naming the
    file and the limit, and the file ends with its last whole record."""
    import subprocess
    import sys

    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "from tempax.train.metrics import MetricsWriter\n"
        "from tempax.train.storage import StorageError\n"
        f"w = MetricsWriter({str(tmp_path)!r}, report_to=())\n"
        "w.write(1, {'loss': 1.0})\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (60, resource.RLIM_INFINITY))\n"
        "try:\n    w.write(2, {'loss': 0.5, 'grad_norm': 0.25})\n"
        "except StorageError as e:\n    print(e)\n    sys.exit(e.exit_status)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 4, out.stderr
    assert "metrics.jsonl record: writing" in out.stdout and "File too large (errno 27)" in out.stdout
    assert "at most 60 bytes (ulimit -f)" in out.stdout and "Traceback" not in out.stderr
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 1 and json.loads(lines[0])["step"] == 1 and lines[0].endswith("\n")
