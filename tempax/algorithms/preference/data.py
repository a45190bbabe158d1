"""Preference data for DPO-family, KTO and reward-model runs: the `data:` section of their recipes and what it builds,
and the `eval:` section of what is done with the held-out pairs.

Rows are pairs {prompt, chosen, rejected} (text or chat messages), two full conversations {chosen, rejected}, or
Anthropic HH-RLHF dialogues; `tempax.data.preference` parses, renders and length-fits them (over-long pairs lose
prompt tokens from the left; identical pairs are dropped; malformed rows — a missing side, an empty response, a
dialogue without an assistant turn — are skipped). Every outcome is counted in a `DataReport` that runs print and
write to `<run_dir>/data_report.json`, for the training and the held-out split alike. KTO's `UnpairedDataConfig` reads
unpaired {prompt, completion, label} rows (`tempax.data.unpaired`) or splits such pairs into them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from tempax.errors import ConfigError, DataError
from tempax.configlib import help_field
from tempax.parallel.process import is_writer
from tempax.data.preference import PreferenceOptions, tokenize_preference_rows
from tempax.data.sources import holdout_split, read_rows
from tempax.data.unpaired import tokenize_unpaired_rows


@dataclass(frozen=True)
class PreferenceDataConfig:
    """Preference pairs for training and a held-out split for evaluation."""

    path: str | None = help_field(
        "Training pairs (required): a .jsonl/.json/.parquet file (gzip ok), a folder, or a Hub dataset id (e.g. "
        "Anthropic/hh-rlhf). Rows: {prompt, chosen, rejected} as text or messages, {chosen, rejected} "
        "conversations, or HH-RLHF dialogues.",
        None,
    )
    split: str | None = help_field("Split of a folder or Hub dataset.", None)
    eval_path: str | None = help_field(
        "Held-out pairs (same kinds as `path`; e.g. Anthropic/hh-rlhf with eval_split=test); null: carve "
        "`eval_fraction` out of the training rows.",
        None,
    )
    eval_split: str | None = help_field("Split of `eval_path` when it is a folder or Hub dataset.", None)
    eval_fraction: float = help_field("Without eval_path: hold out this fraction of training rows (0: no evaluation).", 0.0)
    max_rows: int | None = help_field("Use only the first N training rows (quick runs); null: all.", None)
    max_eval_rows: int | None = help_field("Use only the first N held-out rows; null: all.", None)
    overlong: Literal["truncate", "drop"] = help_field(
        "Pairs longer than train.seq_len: truncate (prompt from the left, then responses) or drop.", "truncate"
    )
    max_bad_fraction: float = help_field("Fail when more than this fraction of training rows is malformed.", 0.1)
    shuffle: bool = help_field("Shuffle pairs (seeded by train.seed; a new order every epoch).", True)

    def validate(self) -> None:
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
        for key in ("max_rows", "max_eval_rows"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"{key} must be >= 1 or null, got {value}")
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ConfigError(f"max_bad_fraction must be in [0, 1], got {self.max_bad_fraction}")


@dataclass(frozen=True)
class PreferenceEvalConfig:
    """What a preference run does with its held-out pairs (`data.eval_path` or `data.eval_fraction`): the loss's
    metrics on them at the end, every `train.eval_every` steps, and before the first step when asked."""

    before: bool = help_field("Evaluate the held-out pairs before the first step and print a before/after table.",
                              True)


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


def _read_splits(spec: PreferenceDataConfig, seed: int) -> tuple[list[Any], list[Any], str]:
    """(training rows, held-out rows, the held-out split's name) per `spec` (path, eval_path or eval_fraction)."""
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
    return rows, eval_rows, eval_name


def _options(spec: PreferenceDataConfig, seq_len: int) -> Any:
    return PreferenceOptions(max_length=seq_len, overlong=spec.overlong, max_bad_fraction=spec.max_bad_fraction)


def _held_out_pairs(eval_rows: list[Any], tokenizer: Any, options: Any, name: str) -> tuple[list[Any], Any]:
    """Tokenised held-out pairs; reported but never failing the run (a few bad test rows should not stop it)."""
    if not eval_rows:
        return [], None
    return tokenize_preference_rows(eval_rows, tokenizer, options, name=name, check=False)


def build_preference_data(spec: PreferenceDataConfig, tokenizer: Any, *, seq_len: int, seed: int = 0) -> PreferenceData:
    """Reads, splits and tokenises the pairs of `spec` (see the module docstring).

    Raises:
      DataError: a file is missing, too many training rows are malformed, or no pair is left.
    """
    rows, eval_rows, eval_name = _read_splits(spec, seed)
    options = _options(spec, seq_len)
    train, report = tokenize_preference_rows(rows, tokenizer, options, name=spec.path)
    held, eval_report = _held_out_pairs(eval_rows, tokenizer, options, eval_name)
    by_where = {r.where: r.data for r in rows if r.data is not None}
    return PreferenceData(train=train, eval=held, report=report, eval_report=eval_report, rows=by_where)


@dataclass(frozen=True)
class UnpairedDataConfig(PreferenceDataConfig):
    """Unpaired feedback for KTO (or preference pairs split into it) and held-out preference pairs."""

    convert_pairs: bool = help_field(
        "true: `path` holds preference pairs (like dpo's data), each split into a desirable row (prompt, chosen) "
        "and an undesirable row (prompt, rejected); false: rows are unpaired {prompt, completion, label: "
        "true|false}, text or messages. Held-out rows (eval_path, eval_fraction) are preference pairs either way: "
        "the evaluation compares the implicit rewards of the two replies.",
        True,
    )

    def validate(self) -> None:
        super().validate()
        if self.eval_fraction > 0 and not self.convert_pairs:
            raise ConfigError(
                "data.eval_fraction carves held-out preference pairs out of the training rows, but with "
                "data.convert_pairs=false they are unpaired; set data.eval_path to a file of preference pairs "
                "or data.eval_fraction=0"
            )


def build_unpaired_data(spec: UnpairedDataConfig, tokenizer: Any, *, seq_len: int, seed: int = 0) -> PreferenceData:
    """The training rows of `spec` as `tempax.data.unpaired.UnpairedExample`s (each with its mismatched partner),
    the held-out rows as preference pairs.

    Raises:
      DataError: a file is missing, too many training rows are malformed, or no example is left.
    """
    rows, eval_rows, eval_name = _read_splits(spec, seed)
    options = _options(spec, seq_len)
    train, report = tokenize_unpaired_rows(rows, tokenizer, options, convert_pairs=spec.convert_pairs, seed=seed,
                                           name=spec.path)
    held, eval_report = _held_out_pairs(eval_rows, tokenizer, options, eval_name)
    return PreferenceData(train=train, eval=held, report=report, eval_report=eval_report)


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
