"""`tempax validate`'s checks of an SFT recipe beyond the shared ones (`tempax.algorithms.validate`), run through
the record's `validate` hook: the first rows of `data.path` are in a format SFT trains on, and chat rows meet a
tokenizer with a chat template (the run renders them with it)."""

from __future__ import annotations

from typing import Any

from tempax.algorithms.validate import check_tokenizer_folder, first_rows, tokenizer_folder
from tempax.data.formats import RowError, detect_format
from tempax.errors import ConfigError


def check_rows(cfg: Any) -> list[str]:
    """Raises `ConfigError` when none of the first rows of a local `data.path` is in a format SFT reads, or when
    they are chats and the model's local tokenizer folder has no chat template; rows made of `text_fields` are
    plain text. No warnings."""
    rows = first_rows(cfg)
    if not rows or cfg.data.text_fields:
        return []
    formats, problems = [], []
    for row in rows:
        try:
            formats.append(detect_format(row.data))
        except RowError as e:
            problems.append(f"{row.where}: {e}")
    if not formats:
        raise ConfigError(f"data.path: none of the first {len(rows)} rows of {cfg.data.path} is in a format sft "
                          f"reads; {problems[0]}")
    found = tokenizer_folder("model", cfg.model)
    if "messages" in formats and found is not None:
        check_tokenizer_folder(*found, chat=True)
    return []
