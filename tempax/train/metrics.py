"""Where metrics go: `<run_dir>/metrics.jsonl`, the trackers of `train.report_to` (TensorBoard events in
`<run_dir>/tb` by default; Weights & Biases, MLflow: `tempax.train.trackers`), and the console's progress (a bar
on a terminal, plain lines elsewhere: `ProgressBar`).

`metrics.jsonl` holds one JSON object per logged step, e.g.
    {"step": 10, "loss": 2.31, "grad_norm": 0.8, "lr": 1e-05, "tokens_per_s": 1712.4, "time": 1732900000.1}
evaluation results as {"step": 10, "eval/loss": 2.5, ...}, and events as {"step": 7, "event": "stop",
"stop_reason": "SIGTERM"}. A resumed run continues the same file as one clean curve: before its first write it
drops the rows of steps after the checkpoint it resumed from (they are about to be run again), and TensorBoard is
told to purge its events from that step on. Nothing is created until the first record is written, so a run that
fails before its first step leaves no empty metrics file, event files or tracker run behind.

The file is append-only and never holds a torn line: each record is one `write` of a whole line to a file opened
with O_APPEND; a write that fails (a full disk) is cut back to the last whole line and raises `StorageError`; and
a last line cut short anyway (the machine lost power mid-write) is removed before the next record is appended.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Callable, Iterable, Sequence

from tempax.progress import on_terminal
from tempax.train.storage import StorageError, describe_write_failure, write_atomic
from tempax.train.trackers import Tracker, finite_scalars, open_trackers
from tempax.errors import ConfigError

METRICS_FILE = "metrics.jsonl"


def _jsonable(value: Any) -> Any:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return value if isinstance(value, (str, bool, type(None))) else str(value)
    if math.isnan(f) or math.isinf(f):
        return str(f)  # JSON has no NaN; keep it visible instead of writing invalid JSON
    if float(f).is_integer() and isinstance(value, int):
        return int(value)
    return f


def _kind(record: dict[str, Any]) -> str:
    if "event" in record:
        return "event"
    return "eval" if any(k.startswith("eval/") for k in record) else "train"


def truncate_after(path: str, step: int) -> int:
    """Drops the records of steps after `step` from a metrics file (all of them for step 0, a fresh start);
    returns how many. Rewritten through a temporary file, so a kill mid-way leaves the old file intact."""
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    kept = []
    for line in lines:
        try:
            record_step = int(json.loads(line).get("step", 0))
        except (json.JSONDecodeError, TypeError, ValueError, AttributeError):
            continue  # a line cut short by a killed run
        if step > 0 and record_step <= step:
            kept.append(line if line.endswith("\n") else line + "\n")
    if len(kept) == len(lines):
        return 0
    write_atomic(path, "".join(kept), what=METRICS_FILE)
    return len(lines) - len(kept)


def repair_torn_tail(path: str) -> int:
    """Cuts a last line without its newline (a write cut short) off `path`; returns the bytes removed."""
    if not os.path.isfile(path):
        return 0
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        keep, pos = 0, size
        while pos > 0:  # back to the last newline, a block at a time
            start = max(0, pos - 65536)
            f.seek(start)
            block = f.read(pos - start)
            cut = block.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            pos = start
        f.truncate(keep)
        return size - keep


class MetricsWriter:
    """Appends metric records to metrics.jsonl and sends their numbers to the trackers of `report_to`.

    Args:
      run_dir: where `metrics.jsonl`, `tb/` and the trackers' local files go (created at the first write).
      report_to: tracker names (`tempax.train.trackers.TRACKERS`); () for metrics.jsonl alone.
      resume_step: the step the run continues from (0: a fresh start); records of later steps already in the
        file are dropped at the first write. None: append to whatever is there.
      say: where the one line about dropped rows goes (default: nowhere).
      config: the run's config for the trackers when `<run_dir>/config.yaml` does not exist.
      run_name: the trackers' name of the run (None: the run_dir's folder name).
    """

    def __init__(self, run_dir: str, *, report_to: Sequence[str] = ("tensorboard",), resume_step: int | None = None,
                 say: Callable[[str], None] | None = None, config: dict[str, Any] | None = None,
                 run_name: str | None = None):
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, METRICS_FILE)
        self.report_to = tuple(report_to)
        self.resume_step = resume_step
        self.dropped = 0  # rows of re-run steps removed at the first write
        self._say = say
        self._config = config
        self._run_name = run_name
        self._fd: int | None = None
        self._trackers: list[Tracker] = []

    def _open(self) -> None:
        os.makedirs(self.run_dir, exist_ok=True)
        if self.resume_step is not None:
            self.dropped = truncate_after(self.path, self.resume_step)
            if self.dropped and self._say is not None:
                rows = "row" if self.dropped == 1 else "rows"
                self._say(f"{METRICS_FILE}: dropped {self.dropped} {rows} of steps after {self.resume_step} "
                          "(they are run again from the checkpoint)")
        torn = repair_torn_tail(self.path)
        if torn and self._say is not None:
            self._say(f"{METRICS_FILE}: removed a last line cut short by an earlier run ({torn} bytes)")
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise StorageError(describe_write_failure(METRICS_FILE, e, directory=self.run_dir)) from None
        self._trackers = open_trackers(self.report_to, self.run_dir, config=self._config, run_name=self._run_name,
                                       resume_step=self.resume_step)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if self._fd is None:
            self._open()
        record = {"step": int(step), **{k: _jsonable(v) for k, v in metrics.items()}, "time": round(time.time(), 3)}
        self._append((json.dumps(record) + "\n").encode())
        numbers = finite_scalars(metrics)
        if numbers:
            for tracker in self._trackers:
                tracker.log(int(step), numbers)

    def _append(self, line: bytes) -> None:
        """One whole line, or (on a failed write) none of it: the file is cut back to where it was."""
        start = os.fstat(self._fd).st_size
        try:
            done = 0
            while done < len(line):
                done += os.write(self._fd, line[done:])
        except OSError as e:
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass
            raise StorageError(
                describe_write_failure(f"{METRICS_FILE} record", e, directory=self.run_dir, needed=len(line),
                                       file=self.path)
                + ". The records written so far are intact; free some space and run the same command again to "
                "resume from the newest checkpoint."
            ) from None

    def event(self, step: int, event: str, **fields: Any) -> None:
        """An event record (no metric values), e.g. `event(7, "stop", stop_reason="SIGTERM")`."""
        self.write(step, {"event": event, **fields})

    def flush(self) -> None:
        for tracker in self._trackers:  # metrics.jsonl is unbuffered: every record is in the file once written
            tracker.flush()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for tracker in self._trackers:
            tracker.close()
        self._trackers = []


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    """The records of `<run_dir>/metrics.jsonl`, one per step and kind (train, eval, event; the latest write wins),
    by step."""
    path = os.path.join(run_dir, METRICS_FILE) if os.path.isdir(run_dir) else run_dir
    if not os.path.isfile(path):
        raise ConfigError(f"no metrics file at {path}; pass the run_dir of a training run")
    latest: dict[tuple[int, str], dict[str, Any]] = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a killed run
            latest[(int(record.get("step", 0)), _kind(record))] = record
    order = {"train": 0, "eval": 1, "event": 2}
    return [latest[k] for k in sorted(latest, key=lambda k: (k[0], order[k[1]]))]


class ProgressBar:
    """Training progress on stderr: on a terminal, a tqdm bar showing loss, learning rate, tokens/s and (tqdm's)
    ETA; elsewhere (a log file, a pipe, a job's output), where carriage-return frames would pile up as noise, one
    plain line per logged step with the same figures. Silent when disabled.

    Args:
      total: the last step; initial: the step it starts from (a resumed run).
      enabled: False prints nothing; terminal: True draws the bar, False writes lines, None (the default) decides
        by whether stderr is a terminal.
    """

    def __init__(self, total: int, initial: int = 0, *, enabled: bool = True, desc: str = "train",
                 terminal: bool | None = None):
        self._bar = None
        self._lines = False
        self._total, self._step, self._desc = total, initial, desc
        self._first, self._started = initial, time.monotonic()
        if not enabled:
            return
        if terminal if terminal is not None else on_terminal():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, smoothing=0.1)
        else:
            self._lines = True

    def update(self, n: int, metrics: dict[str, Any] | None = None) -> None:
        self._step += n
        if self._bar is None and not self._lines:
            return
        if self._bar is not None:
            self._bar.update(n)
        shown = {}
        for key, label, fmt in (("loss", "loss", "{:.4f}"), ("lr", "lr", "{:.2e}"),
                                ("tokens_per_s", "tok/s", "{:.0f}")):
            if key in (metrics or {}):
                shown[label] = fmt.format(float(metrics[key]))
        if self._bar is not None:
            if shown:
                self._bar.set_postfix(shown, refresh=True)  # the bar then shows this step's values, not the last
        elif shown:  # a line per logged step, not per step: a log grows with what would be worth reading
            print(self._line(shown), file=sys.stderr, flush=True)

    def _line(self, shown: dict[str, str]) -> str:
        done = self._step - self._first
        left = ""
        if done > 0 and self._step < self._total:
            seconds = (time.monotonic() - self._started) / done * (self._total - self._step)
            left = f", {int(seconds) // 60}:{int(seconds) % 60:02d} left"
        figures = ", ".join(f"{k} {v}" for k, v in shown.items())
        return f"{self._desc} step {self._step}/{self._total}: {figures}{left}"

    def write(self, text: str) -> None:
        if self._bar is None:
            print(text)
        else:
            self._bar.write(text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The scalar entries of a host-side metrics dict as Python floats."""
    out = {}
    for k, v in metrics.items():
        shape = getattr(v, "shape", ())
        if shape == () or shape is None:
            out[k] = float(v)
    return out


def summarize(records: Iterable[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) pairs of one metric, skipping records without it or with a non-numeric value."""
    out = []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append((int(r["step"]), float(v)))
    return out
