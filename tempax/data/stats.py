"""`tempax data stats`: how big a dataset is in a model's tokens, through its tokenizer and chat template.

Rows are tokenised exactly as training tokenises them (`formats.tokenize_rows`, `preference.tokenize_preference_rows`)
with no length limit, so "tokens" and "loss tokens" are what an SFT / DPO run would see before truncation.
Question/answer rows (gsm8k) are counted as prompt/completion pairs; preference rows count both sides.
Rows are read and tokenised in chunks, so a large file streams.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Iterable, Iterator

import numpy as np

from tempax.data import reasons
from tempax.data.formats import FormatOptions, tokenize_rows
from tempax.data.kinds import mixed_kinds_error, row_kind, turn_count
from tempax.data.preference import PreferenceOptions, tokenize_preference_rows
from tempax.data.sources import Row, iter_rows
from tempax.errors import DataError
from tempax.data.tasks.gsm8k import parse_final_answer

_CHUNK = 512
_MAX_BAD_ROWS = 20  # malformed rows quoted with their file:line; the counters hold every one


@dataclass
class DataStats:
    """Token statistics of a dataset (per-row lengths in `lengths`, one entry per tokenised sequence)."""

    path: str
    kind: str | None = None
    rows: int = 0
    usable_rows: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [sequences]
    turns: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)  # malformed rows by reason (`tempax.data.reasons`)
    bad_rows: list[tuple[str, str, str]] = field(default_factory=list)  # the first few: (file:line, reason, detail)
    seq_len: int | None = None

    @property
    def loss_token_share(self) -> float:
        return self.loss_tokens / self.tokens if self.tokens else 0.0

    def share_longer(self, seq_len: int) -> float:
        return float(np.mean(self.lengths > seq_len)) if self.lengths.size else 0.0

    def percentile(self, q: float) -> int:
        return int(np.percentile(self.lengths, q)) if self.lengths.size else 0

    def to_dict(self) -> dict[str, Any]:
        out = {
            "path": self.path, "kind": self.kind, "rows": self.rows, "usable_rows": self.usable_rows,
            "sequences": int(self.lengths.size), "tokens": self.tokens, "loss_tokens": self.loss_tokens,
            "loss_token_share": round(self.loss_token_share, 4),
            "length": {"mean": round(float(self.lengths.mean()), 1) if self.lengths.size else 0,
                       **{f"p{q}": self.percentile(q) for q in (50, 90, 95, 99)},
                       "max": int(self.lengths.max()) if self.lengths.size else 0},
            "turns": {str(k): v for k, v in sorted(self.turns.items())},
            "skipped": dict(self.skipped),
            "bad_rows": [list(b) for b in self.bad_rows],
        }
        if self.seq_len:
            out[f"share_longer_than_{self.seq_len}"] = round(self.share_longer(self.seq_len), 4)
        return out

    def table(self) -> str:
        d = self.to_dict()
        ln = d["length"]
        lines = [
            f"{self.path} ({self.kind}): {self.rows:,} rows, {self.usable_rows:,} usable, {d['sequences']:,} sequences",
            f"  tokens            {self.tokens:,} (loss tokens {self.loss_tokens:,}, {self.loss_token_share:.1%})",
            f"  tokens per row    mean {ln['mean']}, median {ln['p50']}, p90 {ln['p90']}, p95 {ln['p95']}, "
            f"p99 {ln['p99']}, max {ln['max']}",
        ]
        if self.seq_len:
            lines.append(f"  longer than {self.seq_len:<5} {self.share_longer(self.seq_len):.1%} of sequences")
        if self.turns:
            mean = sum(k * v for k, v in self.turns.items()) / sum(self.turns.values())
            hist = ", ".join(f"{k}: {v}" for k, v in sorted(self.turns.items()))
            lines.append(f"  turns per dialogue mean {mean:.1f} ({hist})")
        if self.skipped:
            lines.append(f"  skipped           {sum(self.skipped.values()):,} malformed rows, not counted above: "
                         f"{dict(self.skipped)}")
            lines += [f"    {line}" for line in self.bad_row_lines()]
        return "\n".join(lines)

    def bad_row_lines(self, n: int = 5) -> list[str]:
        """The first `n` malformed rows as `file:line: reason (detail)`."""
        return [f"{where}: {reason}" + (f" ({detail})" if detail else "") for where, reason, detail in self.bad_rows[:n]]

    def skip(self, where: str, reason: str, detail: str = "") -> None:
        self.skipped[reasons.check(reason, reasons.MALFORMED)] += 1
        if len(self.bad_rows) < _MAX_BAD_ROWS:
            self.bad_rows.append((where, reason, detail))


def _as_prompt_completion(row: Row) -> Row:
    """A question/answer row as prompt/completion, the way it would be supervised."""
    d = row.data or {}
    q = d.get("question", d.get("problem"))
    a = d.get("answer", d.get("solution"))
    return Row(data={"prompt": q, "completion": a}, source=row.source, index=row.index)


def _line_of(where: str) -> int:
    line = where.rpartition(":")[2]
    return int(line) if line.isdigit() else 0


def _chunks(rows: Iterable[Row], n: int) -> Iterator[list[Row]]:
    it = iter(rows)
    while chunk := list(islice(it, n)):
        yield chunk


def dataset_stats(
    path: str, tokenizer: Any, *, seq_len: int | None = None, max_rows: int | None = None, split: str | None = None
) -> DataStats:
    """Tokens, lengths, turns and loss-token share of a dataset (see the module docstring).

    Args:
      path: a file or folder the data layer reads.
      tokenizer: a `tempax.models.tokenizer.Tokenizer` (its chat template renders chat rows).
      seq_len: report the share of sequences longer than this.
      max_rows: look at the first N rows only.
      split: the split of a folder; default: "train" when the folder holds a train file and others.
    """
    split = split if split is not None else default_split(path)
    rows = iter_rows(path, split=split)
    if max_rows is not None:
        rows = islice(rows, max_rows)
    return rows_stats(rows, tokenizer, name=path + (f" [{split}]" if split else ""), seq_len=seq_len)


def rows_stats(rows: Iterable[Row], tokenizer: Any, *, name: str, seq_len: int | None = None) -> DataStats:
    """`dataset_stats` of rows from anywhere (a file's stream, a sample); `name` names them in messages."""
    stats = DataStats(path=name, seq_len=seq_len)
    lengths: list[np.ndarray] = []
    first_where = ""
    for chunk in _chunks(rows, _CHUNK):
        stats.rows += len(chunk)
        quoted = len(stats.bad_rows)  # the bad rows of earlier chunks
        good = []
        for r in chunk:
            if r.data is None:
                stats.skip(r.where, r.reason, r.error or "")
            elif row_kind(r.data) is None:
                stats.skip(r.where, "unknown_format", f"keys {sorted(r.data)}")
            else:
                good.append(r)
        if not good:
            continue
        if stats.kind is None:
            stats.kind, first_where = row_kind(good[0].data), good[0].where
        for r in good:
            kind = row_kind(r.data)
            if kind != stats.kind:
                raise mixed_kinds_error(r.where, kind, stats.kind, first_where)
            stats.turns[turn_count(r.data, kind)] += 1
        if stats.kind == "preference":
            pairs, report = tokenize_preference_rows(good, tokenizer, PreferenceOptions(), check=False)
            examples = [e for p in pairs for e in (p.chosen, p.rejected)]
        else:
            if stats.kind == "qa":
                good = [_as_prompt_completion(r) for r in good]
            examples, report = tokenize_rows(good, tokenizer, FormatOptions(), check=False)
        stats.usable_rows += report.kept
        stats.skipped.update(report.skipped)  # the report counts them all and quotes the first few
        this_chunk = sorted(stats.bad_rows[quoted:] + report.bad_rows, key=lambda b: _line_of(b[0]))
        stats.bad_rows = stats.bad_rows[:quoted] + this_chunk[:_MAX_BAD_ROWS - quoted]
        stats.tokens += sum(len(e) for e in examples)
        stats.loss_tokens += sum(e.num_targets for e in examples)
        lengths.append(np.array([len(e) for e in examples], np.int64))
    stats.skipped = +stats.skipped
    if stats.rows == 0:
        raise DataError(f"{name} holds no rows; pass a non-empty dataset.")
    if stats.usable_rows == 0:
        raise DataError(f"{name}: none of its {stats.rows} rows could be tokenised (skipped {dict(stats.skipped)}); "
                        "rows must be chat, prompt/completion, preference, question/answer or text objects.")
    stats.lengths = np.concatenate(lengths) if lengths else stats.lengths
    return stats


def length_histogram(stats: DataStats, png_path: str, *, bins: int = 50) -> str:
    """Draws the per-sequence token-length histogram to `png_path`, with `seq_len` marked; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(stats.lengths, bins=bins, color="#4c72b0")
    if stats.seq_len:
        ax.axvline(stats.seq_len, color="#c44e52", linestyle="--",
                   label=f"seq_len {stats.seq_len}: {stats.share_longer(stats.seq_len):.1%} longer")
        ax.legend()
    ax.set_xlabel("tokens per sequence")
    ax.set_ylabel("sequences")
    ax.set_title(f"{stats.path} ({stats.lengths.size:,} sequences)", fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path


# --------------------------------------------------------------------------------------------------------------
# What a dataset holds, for `tempax recommend`


@dataclass(frozen=True)
class DataProfile:
    """What a dataset holds and how much: its row kind, size, token lengths (from a tokenised sample) and the
    share of question/answer rows whose answer can be checked automatically (GSM8K's "#### <number>")."""

    path: str
    split: str | None
    kind: str
    rows: int
    sample_rows: int
    tokens_per_row: float  # mean over the sample (preference: both sides)
    p95_tokens: int  # 95th percentile sequence length in the sample
    loss_token_share: float
    checkable_fraction: float = 0.0

    @property
    def total_tokens(self) -> int:
        """Estimated tokens of the whole dataset."""
        return int(self.tokens_per_row * self.rows)

    def summary(self) -> dict[str, Any]:
        """What the profile found, as JSON-able data: kind, rows, estimated tokens, p95 length, checkable share."""
        return {"kind": self.kind, "rows": self.rows, "tokens": self.total_tokens, "p95_tokens": self.p95_tokens,
                "checkable_fraction": round(self.checkable_fraction, 3)}


def default_split(path: str) -> str | None:
    """"train" for a folder holding a train file next to other splits (e.g. gsm8k/{train,test}.jsonl), else None."""
    if not os.path.isdir(path):
        return None
    names = [n for n in os.listdir(path) if n.split(".", 1)[-1] in ("jsonl", "jsonl.gz", "json", "json.gz", "parquet")]
    return "train" if len(names) > 1 and any(n.split(".", 1)[0] == "train" for n in names) else None


def profile_dataset(path: str, tokenizer: Any, *, split: str | None = None, sample_rows: int = 300,
                    seed: int = 0) -> DataProfile:
    """Counts every row in one streaming pass, keeping a uniform random sample of `sample_rows` rows (reservoir
    sampling, seeded) that is then tokenised to measure lengths: files are often sorted (by source, by length),
    so their first rows are not a fair sample."""
    split = split if split is not None else default_split(path)
    rng = np.random.default_rng(seed)
    sample: list[Row] = []
    rows = checkable = 0
    first: tuple[str, str] | None = None  # (kind, where) of the first parsed row
    for row in iter_rows(path, split=split):
        rows += 1
        kind = row_kind(row.data) if row.data is not None else None
        if kind is not None:
            first = first or (kind, row.where)
            if kind != first[0]:
                raise mixed_kinds_error(row.where, kind, *first)
        if len(sample) < sample_rows:
            sample.append(row)
        else:
            j = int(rng.integers(rows))
            if j < sample_rows:
                sample[j] = row
        if kind == "qa":
            answer = row.data.get("answer", row.data.get("solution"))
            checkable += isinstance(answer, str) and parse_final_answer(answer) is not None
    sample.sort(key=lambda r: r.index)
    stats = rows_stats(sample, tokenizer, name=path + (f" [{split}]" if split else ""))
    per_row = stats.tokens / max(stats.usable_rows, 1)
    return DataProfile(
        path=path, split=split, kind=stats.kind or "text", rows=rows, sample_rows=stats.rows,
        tokens_per_row=per_row, p95_tokens=stats.percentile(95), loss_token_share=stats.loss_token_share,
        checkable_fraction=checkable / rows if rows else 0.0,
    )
