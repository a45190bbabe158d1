"""Supervised data set-up (SFT, continued pre-training, distillation): the `data:` recipe section, and rows ->
tokenised examples (chat template, assistant-only loss mask, bad rows skipped and reported) -> a resumable loader
of packed [batch_size, seq_len] batches, with held-out batches beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from tempax.configlib import help_field
from tempax.data.formats import FormatOptions, tokenize_rows
from tempax.data.loader import sft_loader
from tempax.data.report import DataReport
from tempax.data.sources import Row, holdout_split, read_rows
from tempax.errors import ConfigError


@dataclass(frozen=True)
class SFTDataConfig:
    """Training rows and how they become batches."""

    path: str | None = help_field(
        "Dataset (required): a .jsonl/.json/.parquet file, a folder, or a Hub dataset id.", None
    )
    split: str | None = help_field("Split of a folder or Hub dataset.", None)
    format: Literal["auto", "messages", "prompt_completion", "text"] = help_field(
        "Row format: auto-detect, chat messages, prompt/completion, or plain text.", "auto"
    )
    train_on: Literal["assistant", "last_assistant", "all"] = help_field(
        "Tokens that carry loss: every assistant turn, only the last, or all tokens.", "assistant"
    )
    text_fields: tuple[str, ...] = help_field(
        "Plain-text rows: join these row fields with a newline into the text (e.g. [question, answer]); empty: "
        "the row's `text` field.",
        (),
    )
    overlong: Literal["truncate", "drop", "split"] = help_field(
        "Examples longer than train.seq_len: truncate, drop, or split into chunks (text).", "truncate"
    )
    max_bad_fraction: float = help_field("Fail when more than this fraction of rows is malformed.", 0.1)
    max_rows: int | None = help_field("Use only the first N rows (quick runs); null: all.", None)
    eval_fraction: float = help_field("Hold out this fraction of rows for evaluation (0: no evaluation).", 0.0)
    packing: bool = help_field("Pack several examples into each row (segment ids keep them apart).", True)
    shuffle: bool = help_field("Shuffle the examples (seeded by train.seed; a new order every epoch).", True)

    def validate(self) -> None:
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigError(f"max_rows must be >= 1 or null, got {self.max_rows}")


def text_rows(rows: list[Any], fields: tuple[str, ...]) -> list[Any]:
    """Rows with `fields` joined into a `text` field (rows missing a field are left for the report to flag)."""
    out = []
    for row in rows:
        data = row.data
        if data is not None and all(isinstance(data.get(f), str) for f in fields):
            data = {"text": "\n".join(data[f] for f in fields)}
        out.append(Row(data=data, source=row.source, index=row.index, error=row.error))
    return out


@dataclass
class SFTData:
    """The loaders and the data report of a run."""

    train: Any
    eval_examples: list[Any]
    report: Any
    eval_loader: Callable[[], Any] | None


def read_data_rows(spec: SFTDataConfig) -> list[Any]:
    """The dataset's rows (raises `ConfigError` when no path is set, `DataError` naming the path when it does not
    exist)."""
    return read_rows(spec.path, split=spec.split)


def build_data(
    spec: SFTDataConfig, tokenizer: Any, *, batch_size: int, seq_len: int, seed: int = 0, rows: list[Any] | None = None,
    eval_rows: list[Any] | None = None,
) -> SFTData:
    """Rows -> examples -> a resumable loader of packed batches, and held-out batches: of `eval_rows` when given
    (already split off by the caller), else of `data.eval_fraction` of the rows."""
    d = spec
    rows = read_data_rows(spec) if rows is None else rows
    if d.max_rows is not None:
        rows = rows[: d.max_rows]
    if eval_rows is None:
        eval_rows = []
        if d.eval_fraction > 0:
            rows, eval_rows = holdout_split(rows, d.eval_fraction, seed=seed)
    if d.text_fields:
        rows, eval_rows = text_rows(rows, d.text_fields), text_rows(eval_rows, d.text_fields)
    options = FormatOptions(format=d.format, train_on=d.train_on, max_length=seq_len, overlong=d.overlong,
                            max_bad_fraction=d.max_bad_fraction)
    examples, training = tokenize_rows(rows, tokenizer, options, name=d.path, check=False)
    report = DataReport(name=d.path).merge(training)  # one report of the file's rows: the totals data stats gives
    eval_examples: list[Any] = []
    if eval_rows:
        eval_examples, held_out = tokenize_rows(eval_rows, tokenizer, options, check=False)
        report.merge(held_out)
    report.check(d.max_bad_fraction)
    if training.kept == 0:  # every usable row was held out: the message of the training rows alone
        training.check(1.0)
    pad = tokenizer.pad_id
    train = sft_loader(examples, batch_size=batch_size, seq_len=seq_len, pad_id=pad, packing=d.packing,
                       seed=seed, shuffle=d.shuffle)
    eval_loader: Callable[[], Any] | None = None
    if eval_examples:
        def held_out_batches() -> Any:  # a fresh single pass over the held-out rows, in order, for each evaluation
            return sft_loader(eval_examples, batch_size=batch_size, seq_len=seq_len, pad_id=pad,
                              packing=d.packing, shuffle=False, num_epochs=1, drop_remainder=False)

        eval_loader = held_out_batches
    return SFTData(train=train, eval_examples=eval_examples, report=report, eval_loader=eval_loader)
