"""What happened to every row of a dataset: kept, skipped (malformed), dropped (by policy) or truncated.

Real datasets hold a few broken rows. Failing a whole run on the first one wastes a job; silently ignoring them
hides a broken export. So the pipeline skips bad rows, counts them by reason with their file and line, and
raises `DataError` only when the bad fraction passes a threshold (`DataReport.check`).

Outcomes, each counted by reason (the reasons are `tempax.data.reasons`, the vocabulary of every data report):
  skipped   — the row is malformed (bad JSON, missing field, wrong type, empty content, no assistant turn, a row
              of a kind the command does not train on). Only these count towards the bad fraction.
  dropped   — the row is well formed but a policy removed it (too long with `overlong="drop"`, identical chosen
              and rejected, nothing left to train on after truncation).
  truncated — the row was kept but cut to fit the sequence length.
  notes     — kept rows worth knowing about (e.g. a preference pair whose reply holds several turns).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tempax.data import reasons
from tempax.errors import DataError

# How many bad rows a report keeps verbatim; the counters hold the full tallies.
_MAX_EXAMPLES = 20

# The config key that changes the outcome of each length-related drop reason, for the "no usable rows" message.
DROP_FIXES = {
    "too_long": "raise train.seq_len, or set data.overlong=truncate to keep the start of long rows",
    "no_target_after_truncation": "cutting the rows to train.seq_len left no trained token; raise train.seq_len",
}


@dataclass
class DataReport:
    """Counts of what the pipeline did with each row, by reason.

    Attributes:
      name: what the report is about (a path or a dataset name), used in messages.
      total: rows seen.
      kept: rows that produced at least one training example.
      skipped: malformed rows by reason.
      dropped: well-formed rows removed by a policy, by reason.
      truncated: kept rows cut to length, by reason.
      notes: kept rows with a quirk worth reporting, by reason.
      bad_rows: the first few skipped rows as (where, reason, detail); `where` is `file:line`.
    """

    name: str = "<rows>"
    total: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)
    truncated: Counter = field(default_factory=Counter)
    notes: Counter = field(default_factory=Counter)
    bad_rows: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())

    @property
    def num_dropped(self) -> int:
        return sum(self.dropped.values())

    @property
    def num_truncated(self) -> int:
        return sum(self.truncated.values())

    @property
    def bad_fraction(self) -> float:
        return self.num_skipped / self.total if self.total else 0.0

    def skip(self, where: str, reason: str, detail: str = "") -> None:
        self.skipped[reasons.check(reason, reasons.MALFORMED)] += 1
        if len(self.bad_rows) < _MAX_EXAMPLES:
            self.bad_rows.append((where, reason, detail))

    def drop(self, reason: str) -> None:
        self.dropped[reasons.check(reason, reasons.DROPPED)] += 1

    def truncate(self, reason: str = "too_long") -> None:
        self.truncated[reasons.check(reason, reasons.TRUNCATED)] += 1

    def note(self, reason: str) -> None:
        self.notes[reasons.check(reason, reasons.NOTES)] += 1

    def merge(self, other: "DataReport") -> "DataReport":
        """Adds `other`'s rows to this report (the held-out rows of the same file, so its totals are the file's)."""
        self.total += other.total
        self.kept += other.kept
        for mine, theirs in ((self.skipped, other.skipped), (self.dropped, other.dropped),
                             (self.truncated, other.truncated), (self.notes, other.notes)):
            mine.update(theirs)
        self.bad_rows = sorted(self.bad_rows + other.bad_rows, key=_file_order)[:_MAX_EXAMPLES]
        return self

    def check(self, max_bad_fraction: float = 0.1, key: str = "data.max_bad_fraction") -> None:
        """Raises `DataError` when too many rows were malformed, when the data holds no rows, or when nothing was kept.

        Args:
          max_bad_fraction: the largest tolerated fraction of skipped (malformed) rows, in [0, 1].
          key: the config key that sets it, named in the message as the thing to raise.
        """
        if self.total and self.bad_fraction > max_bad_fraction:
            raise DataError(
                f"{self.name}: {self.num_skipped} of {self.total} rows are malformed "
                f"({self.bad_fraction:.1%} > {key}={max_bad_fraction}). "
                f"By reason: {dict(self.skipped)}. First bad rows: {self._first_bad()}. {self._fix(key)}"
            )
        if self.total == 0:
            raise DataError(f"{self.name} is empty: it holds no rows. Pass a dataset with at least one row.")
        if self.kept == 0:
            top = self.dropped.most_common(1)
            fix = DROP_FIXES.get(top[0][0]) if top and top[0][1] >= self.num_skipped else None
            raise DataError(
                f"{self.name}: no usable rows out of {self.total} (skipped {dict(self.skipped)}, "
                f"dropped {dict(self.dropped)}). First bad rows: {self._first_bad()}."
                + (f" Most were dropped as {top[0][0]}: {fix}." if fix else "")
            )

    def _fix(self, key: str) -> str:
        """What to do about the malformed rows: what the detail of the commonest reason says when a larger
        fraction would not help (rows of another kind: the command that trains on them), else fix or raise."""
        top = self.skipped.most_common(1)[0][0]
        if top in reasons.NOT_A_THRESHOLD_MATTER:
            detail = next((d for _, r, d in self.bad_rows if r == top and d), "")
            return f"Most rows are {top}: {detail}." if detail else f"Most rows are {top}."
        return f"Fix the rows or raise {key}."

    def _first_bad(self, n: int = 5) -> str:
        if not self.bad_rows:
            return "none"
        return "; ".join(f"{w}: {r}" + (f" ({d})" if d else "") for w, r, d in self.bad_rows[:n])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able summary for logs and metrics."""
        return {
            "name": self.name,
            "total": self.total,
            "kept": self.kept,
            "skipped": dict(self.skipped),
            "dropped": dict(self.dropped),
            "truncated": dict(self.truncated),
            "notes": dict(self.notes),
            "bad_rows": [list(b) for b in self.bad_rows],
        }

    def summary(self) -> str:
        """One line for the console."""
        parts = [f"{self.name}: kept {self.kept}/{self.total}"]
        for label, counter in (
            ("skipped", self.skipped),
            ("dropped", self.dropped),
            ("truncated", self.truncated),
            ("notes", self.notes),
        ):
            if counter:
                parts.append(f"{label} {sum(counter.values())} {dict(counter)}")
        return ", ".join(parts)


def _file_order(bad_row: tuple[str, str, str]) -> tuple[str, int]:
    """(file, line) of a bad row's `file:line`, for listing the rows of two reports in the file's order."""
    where = bad_row[0]
    name, _, line = where.rpartition(":")
    return (name, int(line)) if line.isdigit() else (where, 0)
