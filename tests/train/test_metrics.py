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
    bar = ProgressBar(10, enabled=True)
    bar.update(1)
    bar.update(0, {"loss": 1.2345})
    last = capfd.readouterr().err.rsplit("\r", 1)[-1]
    assert "1/10" in last and "loss=1.2345" in last, last
    bar.close()
