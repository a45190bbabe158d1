"""Where metrics go: `<run_dir>/metrics.jsonl`, TensorBoard events in `<run_dir>/tb`, and a console progress bar.

`metrics.jsonl` holds one JSON object per logged step, e.g.
    {"step": 10, "loss": 2.31, "grad_norm": 0.8, "lr": 1e-05, "tokens_per_s": 1712.4, "time": 1732900000.1}
and evaluation results as {"step": 10, "eval/loss": 2.5, ...}. A resumed run appends to the same file; when it
re-runs steps that were logged after its last checkpoint, `read_metrics` keeps the latest record of each step.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Iterable

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


class MetricsWriter:
    """Appends metric records to metrics.jsonl and (optionally) TensorBoard."""

    def __init__(self, run_dir: str, *, tensorboard: bool = True):
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, METRICS_FILE)
        self._file = open(self.path, "a", buffering=1)
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(run_dir, "tb"))

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": int(step), **{k: _jsonable(v) for k, v in metrics.items()}, "time": round(time.time(), 3)}
        self._file.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(float(value)):
                    self._tb.add_scalar(key, float(value), int(step))

    def flush(self) -> None:
        self._file.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    """The records of `<run_dir>/metrics.jsonl`, one per step and kind (the latest write wins), by step."""
    path = os.path.join(run_dir, METRICS_FILE) if os.path.isdir(run_dir) else run_dir
    if not os.path.isfile(path):
        from tempax.errors import ConfigError

        raise ConfigError(f"no metrics file at {path}; pass the run_dir of a training run")
    latest: dict[tuple[int, bool], dict[str, Any]] = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a killed run
            is_eval = any(k.startswith("eval/") for k in record)
            latest[(int(record.get("step", 0)), is_eval)] = record
    return [latest[k] for k in sorted(latest)]


class ProgressBar:
    """A tqdm bar showing loss, learning rate, tokens/s and (tqdm's) ETA; silent when disabled."""

    def __init__(self, total: int, initial: int = 0, *, enabled: bool = True, desc: str = "train"):
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, smoothing=0.1)

    def update(self, n: int, metrics: dict[str, Any] | None = None) -> None:
        if self._bar is None:
            return
        self._bar.update(n)
        if metrics:
            shown = {}
            for key, fmt in (("loss", "{:.4f}"), ("lr", "{:.2e}"), ("tokens_per_s", "{:.0f}")):
                if key in metrics:
                    shown["tok/s" if key == "tokens_per_s" else key] = fmt.format(float(metrics[key]))
            self._bar.set_postfix(shown, refresh=False)

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
