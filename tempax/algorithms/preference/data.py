"""Preference data for DPO-family and reward-model runs: the `data:` section of their recipes and what it builds.

Rows are pairs {prompt, chosen, rejected} (text or chat messages), two full conversations {chosen, rejected}, or
Anthropic HH-RLHF dialogues; `tempax.data.preference` parses, renders and length-fits them (over-long pairs lose
prompt tokens from the left; identical pairs are dropped; malformed rows — a missing side, an empty response, a
dialogue without an assistant turn — are skipped). Every outcome is counted in a `DataReport` that runs print and
write to `<run_dir>/data_report.json`, for the training and the held-out split alike.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from tempax.errors import ConfigError, DataError
from tempax.configlib import help_field
from tempax.parallel.process import is_writer


_help = help_field  # one documented-field helper for every config (tempax.configlib)


@dataclass(frozen=True)
class PreferenceDataSpec:
    """Preference pairs for training and a held-out split for evaluation."""

    path: str = _help(
        "Training pairs: a .jsonl/.json/.parquet file (gzip ok), a folder, or a Hub dataset id. Rows: "
        "{prompt, chosen, rejected} as text or messages, {chosen, rejected} conversations, or HH-RLHF dialogues.",
        "../shared/data/hh-rlhf/train.jsonl.gz",
    )
    split: str | None = _help("Split of a folder or Hub dataset.", None)
    eval_path: str | None = _help(
        "Held-out pairs (same kinds as `path`); null: carve `eval_fraction` out of the training rows.",
        "../shared/data/hh-rlhf/test.jsonl.gz",
    )
    eval_split: str | None = _help("Split of `eval_path` when it is a folder or Hub dataset.", None)
    eval_fraction: float = _help("Without eval_path: hold out this fraction of training rows (0: no evaluation).", 0.0)
    max_rows: int | None = _help("Use only the first N training rows (quick runs); null: all.", None)
    max_eval_rows: int | None = _help("Use only the first N held-out rows; null: all.", None)
    overlong: Literal["truncate", "drop"] = _help(
        "Pairs longer than train.seq_len: truncate (prompt from the left, then responses) or drop.", "truncate"
    )
    max_bad_fraction: float = _help("Fail when more than this fraction of training rows is malformed.", 0.1)
    shuffle: bool = _help("Shuffle pairs (seeded by train.seed; a new order every epoch).", True)

    def validate(self) -> None:
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
        for key in ("max_rows", "max_eval_rows"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"{key} must be >= 1 or null, got {value}")
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ConfigError(f"max_bad_fraction must be in [0, 1], got {self.max_bad_fraction}")


@dataclass
class PreferenceData:
    """Tokenised pairs of a run.

    Attributes:
      train: training pairs.
      eval: held-out pairs (empty without evaluation).
      report: what happened to the training rows.
      eval_report: what happened to the held-out rows (None without evaluation).
      rows: the raw training rows kept after `max_rows` (for per-row extras such as margins), by `file:line`.
    """

    train: list[Any]
    eval: list[Any]
    report: Any
    eval_report: Any | None
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)


def build_preference_data(spec: PreferenceDataSpec, tokenizer: Any, *, seq_len: int, seed: int = 0) -> PreferenceData:
    """Reads, splits and tokenises the pairs of `spec` (see the module docstring).

    Raises:
      DataError: a file is missing, too many training rows are malformed, or no pair is left.
    """
    from tempax.data.preference import PreferenceOptions, tokenize_preference_rows
    from tempax.data.sources import holdout_split, read_rows

    rows = read_rows(spec.path, split=spec.split)
    if spec.max_rows is not None:
        rows = rows[: spec.max_rows]
    eval_rows: list[Any] = []
    eval_name = f"{spec.path} (held out)"
    if spec.eval_path is not None:
        eval_rows = read_rows(spec.eval_path, split=spec.eval_split)
        eval_name = spec.eval_path
    elif spec.eval_fraction > 0:
        rows, eval_rows = holdout_split(rows, spec.eval_fraction, seed=seed)
    if spec.max_eval_rows is not None:
        eval_rows = eval_rows[: spec.max_eval_rows]
    options = PreferenceOptions(max_length=seq_len, overlong=spec.overlong, max_bad_fraction=spec.max_bad_fraction)
    train, report = tokenize_preference_rows(rows, tokenizer, options, name=spec.path)
    held: list[Any] = []
    eval_report = None
    if eval_rows:
        # The held-out split is reported but never fails the run: a few bad test rows should not stop training.
        held, eval_report = tokenize_preference_rows(eval_rows, tokenizer, options, name=eval_name, check=False)
    by_where = {r.where: r.data for r in rows if r.data is not None}
    return PreferenceData(train=train, eval=held, report=report, eval_report=eval_report, rows=by_where)


def report_data(data: PreferenceData, run_dir: str, say: Callable[[str], None]) -> None:
    """Prints both reports (with the first bad rows) and writes them to `<run_dir>/data_report.json`."""
    reports = [("train", data.report)] + ([("eval", data.eval_report)] if data.eval_report is not None else [])
    for label, rep in reports:
        say(f"{label} data: {rep.summary()}")
        for where, reason, detail in rep.bad_rows[:5]:
            say(f"  skipped {where}: {reason}" + (f" ({detail})" if detail else ""))
    os.makedirs(run_dir, exist_ok=True)
    if is_writer():
        with open(os.path.join(run_dir, "data_report.json"), "w") as f:
            json.dump({label: rep.to_dict() for label, rep in reports}, f, indent=2)


def pairs_per_batch(rows: int, *, what: str = "train.batch_size") -> int:
    """Pairs in a batch of `rows` rows (each pair is a chosen and a rejected row)."""
    if rows < 2 or rows % 2:
        raise ConfigError(
            f"{what}={rows} counts rows and each preference pair is two rows (chosen + rejected); use an even "
            "number, e.g. 16 for 8 pairs"
        )
    return rows // 2


def check_enough_pairs(pairs: list[Any], per_batch: int, name: str) -> None:
    if len(pairs) < per_batch:
        raise DataError(
            f"{name}: {len(pairs)} usable pairs, fewer than one batch of {per_batch} pairs; lower train.batch_size "
            "or use more rows"
        )
