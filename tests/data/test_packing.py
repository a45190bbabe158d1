"""Greedy packing and the batch layout: segments, positions, shifted targets and masks."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tempax.data.formats import Example, FormatOptions, tokenize_rows
from tempax.data.packing import BATCH_KEYS, collate_rows, pack_examples, pad_examples, plan_packing
from tempax.data.sources import read_rows
from tests.kit.tokenizers import tiny_chat_tokenizer

SFT_FILE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "hh-rlhf-sft", "train.jsonl")


def ex(tokens, mask) -> Example:
    return Example(np.asarray(tokens, np.int32), np.asarray(mask, bool))


def test_first_fit_plan_by_hand():
    """seq_len 8, lengths [5, 3, 4, 2, 6]:
    5 -> row A (3 free); 3 -> A (full, closed); 4 -> row B (4 free); 2 -> B (2 free); 6 -> row C.
    Closed rows come first, then open rows in opening order: [[0, 1], [2, 3], [4]]."""
    assert plan_packing([5, 3, 4, 2, 6], 8) == [[0, 1], [2, 3], [4]]


def test_first_fit_fills_earlier_rows_and_bounded_open_rows():
    """lengths [6, 6, 2, 2]: 6 -> A, 6 -> B, 2 -> A (full), 2 -> B (full) => [[0, 2], [1, 3]].
    With one open row (next-fit) A closes when the second 6 arrives: [[0], [1, 2], [3]]."""
    assert plan_packing([6, 6, 2, 2], 8) == [[0, 2], [1, 3]]
    assert plan_packing([6, 6, 2, 2], 8, max_open=1) == [[0], [1, 2], [3]]


def test_plan_refuses_examples_longer_than_a_row():
    with pytest.raises(ValueError, match="more than seq_len"):
        plan_packing([3, 9], 8)


def test_collate_layout_by_hand():
    """Row of T=7 with [10, 11, 12] (mask 0 1 1) then [20, 21] (mask 0 1), pad 0:
    tokens      10 11 12 20 21  0  0
    targets     11 12  0 21  0  0  0   (next token inside the segment; a segment's last slot has none)
    loss_mask    1  1  0  1  0  0  0   (example mask shifted left by one)
    positions    0  1  2  0  1  0  0
    segment_ids  1  1  1  2  2  0  0"""
    b = collate_rows([[ex([10, 11, 12], [0, 1, 1]), ex([20, 21], [0, 1])]], seq_len=7, pad_id=0, num_rows=2)
    assert set(b) == set(BATCH_KEYS) and all(v.dtype == np.int32 and v.shape == (2, 7) for v in b.values())
    assert b["tokens"][0].tolist() == [10, 11, 12, 20, 21, 0, 0]
    assert b["targets"][0].tolist() == [11, 12, 0, 21, 0, 0, 0]
    assert b["loss_mask"][0].tolist() == [1, 1, 0, 1, 0, 0, 0]
    assert b["positions"][0].tolist() == [0, 1, 2, 0, 1, 0, 0]
    assert b["segment_ids"][0].tolist() == [1, 1, 1, 2, 2, 0, 0]
    # The extra row is pure padding.
    assert not b["segment_ids"][1].any() and not b["loss_mask"][1].any()


def test_collate_refuses_overfull_rows():
    with pytest.raises(ValueError, match="more than seq_len"):
        collate_rows([[ex([1, 2, 3], [0, 1, 1]), ex([4, 5], [0, 1])]], seq_len=4, pad_id=0)


def check_batch_invariants(b: dict[str, np.ndarray]) -> None:
    """Properties every batch must have, packed or padded."""
    seg, pos, tok, tgt, lm = (b[k] for k in ("segment_ids", "positions", "tokens", "targets", "loss_mask"))
    for r in range(seg.shape[0]):
        ids = seg[r]
        used = ids[ids > 0]
        # Segments are contiguous, numbered 1..n in order, and padding only trails.
        assert (np.diff(used) >= 0).all() and (np.diff(used) <= 1).all()
        if used.size:
            assert used[0] == 1 and (ids[: used.size] == used).all() and not ids[used.size :].any()
        for k in np.unique(used):
            where = np.flatnonzero(ids == k)
            assert (pos[r, where] == np.arange(where.size)).all()  # positions restart per segment
        # Every trained slot predicts the next token of the same segment.
        j = np.flatnonzero(lm[r])
        assert (j + 1 < ids.size).all()
        assert (ids[j] > 0).all() and (ids[j] == ids[j + 1]).all() and (tgt[r, j] == tok[r, j + 1]).all()


@pytest.fixture(scope="module")
def examples():
    tok = tiny_chat_tokenizer()
    rows = read_rows(SFT_FILE)[:200]
    out, _ = tokenize_rows(rows, tok, FormatOptions(max_length=256))
    return out


def test_packing_real_examples_keeps_every_example_intact(examples):
    b = pack_examples(examples, seq_len=1024, pad_id=0)
    check_batch_invariants(b)
    recovered = []
    for r in range(b["tokens"].shape[0]):
        for k in range(1, b["segment_ids"][r].max() + 1):
            recovered.append(tuple(b["tokens"][r, b["segment_ids"][r] == k]))
    assert sorted(recovered) == sorted(tuple(e.tokens) for e in examples)
    # Packing is dense: fewer rows than examples, and every trained target of every example survives.
    assert b["tokens"].shape[0] < len(examples) // 2
    assert b["loss_mask"].sum() == sum(e.num_targets for e in examples)


def test_packed_and_padded_train_the_same_targets(examples):
    """Packing must not change what is learned: same multiset of (context-free) trained (token, target) pairs."""
    packed = pack_examples(examples, seq_len=1024, pad_id=0)
    padded = pad_examples(examples, seq_len=256, pad_id=0)
    check_batch_invariants(padded)
    assert padded["segment_ids"].max() == 1

    def trained(b):
        m = b["loss_mask"].astype(bool)
        return sorted(zip(b["tokens"][m].tolist(), b["targets"][m].tolist(), b["positions"][m].tolist()))

    assert trained(packed) == trained(padded)
