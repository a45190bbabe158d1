"""Examples -> fixed-shape batches, packed (several examples per row) or padded (one per row).

Every batch is a dict of int32 numpy arrays of shape [rows, seq_len]:
  tokens       input ids; padding slots hold `pad_id`.
  targets      the next token of the same example: targets[r, j] = tokens[r, j + 1] while j + 1 is in the same
               segment; the last slot of each segment and padding slots hold `pad_id`.
  loss_mask    1 where targets[r, j] is trained (the example's loss_mask shifted by one), else 0. Never 1 on a
               segment's last slot or on padding, so no loss crosses an example boundary.
  positions    0, 1, 2, ... restarting at each segment; 0 on padding.
  segment_ids  1..n for the n examples packed in a row, 0 on padding. Attention must stay within equal,
               non-zero segment ids; this is what makes packed training equal to padded training.

A row is empty (all-padding) iff its segment_ids are all 0; losses normalised by `loss_mask.sum()` ignore it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tempax.data.formats import Example

BATCH_KEYS = ("tokens", "targets", "loss_mask", "positions", "segment_ids")


def plan_packing(lengths: Sequence[int], seq_len: int, *, max_open: int = 64) -> list[list[int]]:
    """Greedy first-fit packing: assigns example indices to rows of at most `seq_len` tokens.

    Examples are visited in the given order (so a shuffled order gives shuffled rows). Each goes into the first
    open row with room; if none has room a new row opens. At most `max_open` rows stay open: beyond that the
    fullest is closed, which bounds the work to O(n * max_open) and keeps rows close to visiting order.
    No example is ever split across rows.

    Returns:
      rows as lists of example indices, each row's lengths summing to at most `seq_len`.
    """
    if max_open < 1:
        raise ValueError("max_open must be >= 1")
    done: list[list[int]] = []
    open_rows: list[list[int]] = []
    free: list[int] = []
    for i, n in enumerate(lengths):
        if n > seq_len:
            raise ValueError(f"example {i} has {n} tokens, more than seq_len={seq_len}; truncate it first")
        for r, room in enumerate(free):
            if room >= n:
                open_rows[r].append(i)
                free[r] -= n
                break
        else:
            if len(open_rows) == max_open:
                r = int(np.argmin(free))
                done.append(open_rows.pop(r))
                free.pop(r)
            open_rows.append([i])
            free.append(seq_len - n)
            r = len(free) - 1
        if free[r] == 0:
            done.append(open_rows.pop(r))
            free.pop(r)
    return done + open_rows


def collate_rows(
    rows: Sequence[Sequence[Example]], *, seq_len: int, pad_id: int, num_rows: int | None = None
) -> dict[str, np.ndarray]:
    """Lays out rows of examples into a batch (see the module docstring for the keys).

    Args:
      rows: per row, the examples packed into it, in order. Their lengths must sum to at most `seq_len`.
      seq_len: T, the row length.
      pad_id: the id written in padding slots of `tokens` and `targets`.
      num_rows: B; extra all-padding rows are appended up to it (for a short final batch). Default len(rows).
    """
    b = len(rows) if num_rows is None else num_rows
    if len(rows) > b:
        raise ValueError(f"{len(rows)} rows do not fit num_rows={b}")
    tokens = np.full((b, seq_len), pad_id, dtype=np.int32)
    targets = np.full((b, seq_len), pad_id, dtype=np.int32)
    loss_mask = np.zeros((b, seq_len), dtype=np.int32)
    positions = np.zeros((b, seq_len), dtype=np.int32)
    segment_ids = np.zeros((b, seq_len), dtype=np.int32)
    for r, row in enumerate(rows):
        off = 0
        for k, ex in enumerate(row, start=1):
            n = len(ex)
            if off + n > seq_len:
                raise ValueError(f"row {r} holds {off + n} tokens, more than seq_len={seq_len}")
            tokens[r, off : off + n] = ex.tokens
            targets[r, off : off + n - 1] = ex.tokens[1:]
            loss_mask[r, off : off + n - 1] = ex.loss_mask[1:]
            positions[r, off : off + n] = np.arange(n, dtype=np.int32)
            segment_ids[r, off : off + n] = k
            off += n
    return {
        "tokens": tokens,
        "targets": targets,
        "loss_mask": loss_mask,
        "positions": positions,
        "segment_ids": segment_ids,
    }


def pack_examples(
    examples: Sequence[Example], *, seq_len: int, pad_id: int, max_open: int = 64
) -> dict[str, np.ndarray]:
    """All examples packed into as few rows as greedy first-fit finds, as one batch (tests, small evals)."""
    plan = plan_packing([len(e) for e in examples], seq_len, max_open=max_open)
    return collate_rows([[examples[i] for i in row] for row in plan], seq_len=seq_len, pad_id=pad_id)


def pad_examples(
    examples: Sequence[Example], *, seq_len: int, pad_id: int, num_rows: int | None = None
) -> dict[str, np.ndarray]:
    """One example per row, right-padded."""
    return collate_rows([[e] for e in examples], seq_len=seq_len, pad_id=pad_id, num_rows=num_rows)
