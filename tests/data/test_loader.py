"""The Grain-backed loader: determinism, epochs, fixed shapes, exact resumption."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tempax.data.formats import Example
from tempax.data.loader import sft_loader
from tempax.data.packing import BATCH_KEYS
from tempax.errors import DataError


def make_examples(n: int = 37) -> list[Example]:
    """Example i is [1000 + i, i, i, ...] of length 3 + i % 6, trained after its first token: easy to identify."""
    out = []
    for i in range(n):
        length = 3 + i % 6
        tokens = np.full(length, i, np.int32)
        tokens[0] = 1000 + i
        out.append(Example(tokens, np.r_[False, np.ones(length - 1, bool)], f"mem:{i + 1}"))
    return out


def example_ids(batch) -> list[int]:
    """Which examples a batch holds, from their first tokens (positions 0 of non-padding segments)."""
    first = (batch["positions"] == 0) & (batch["segment_ids"] > 0)
    return sorted(int(t) - 1000 for t in batch["tokens"][first])


def take(loader, n):
    return [next(loader) for _ in range(n)]


def same(a, b) -> bool:
    return all(np.array_equal(a[k], b[k]) for k in BATCH_KEYS)


@pytest.mark.parametrize("packing", [True, False])
def test_fixed_shapes_and_dtypes(packing):
    loader = sft_loader(make_examples(), batch_size=4, seq_len=16, pad_id=0, packing=packing)
    for b in take(loader, 12):
        assert set(b) == set(BATCH_KEYS)
        assert all(v.shape == (4, 16) and v.dtype == np.int32 for v in b.values())


def test_same_seed_same_batches_other_seed_other_batches():
    a = take(sft_loader(make_examples(), batch_size=4, seq_len=16, pad_id=0, seed=7), 6)
    b = take(sft_loader(make_examples(), batch_size=4, seq_len=16, pad_id=0, seed=7), 6)
    c = take(sft_loader(make_examples(), batch_size=4, seq_len=16, pad_id=0, seed=8), 6)
    assert all(same(x, y) for x, y in zip(a, b))
    assert not all(same(x, y) for x, y in zip(a, c))


def test_one_epoch_visits_every_example_once_and_epochs_reshuffle():
    """Padded, no drop: 37 examples in batches of 4 -> 10 batches, the last with 1 example and 3 empty rows."""
    loader = sft_loader(
        make_examples(), batch_size=4, seq_len=16, pad_id=0, packing=False, num_epochs=2, drop_remainder=False
    )
    epochs = [take(loader, 10), take(loader, 10)]
    with pytest.raises(StopIteration):
        next(loader)
    for batches in epochs:
        assert sorted(i for b in batches for i in example_ids(b)) == list(range(37))
    last = epochs[0][-1]
    assert (last["segment_ids"].max(axis=1) > 0).sum() == 1 and not last["loss_mask"][1:].any()
    order = [[i for b in batches for i in example_ids(b)] for batches in epochs]
    assert order[0] != order[1]


def test_unshuffled_keeps_dataset_order():
    loader = sft_loader(make_examples(8), batch_size=4, seq_len=16, pad_id=0, packing=False, shuffle=False)
    assert [example_ids(b) for b in take(loader, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7]] * 2


@pytest.mark.parametrize("packing", [True, False])
@pytest.mark.parametrize("stop_after", [5, 9])
def test_restore_continues_exactly_like_an_uninterrupted_loader(packing, stop_after):
    """5 batches stays in epoch 0; 9 crosses into epoch 1 (37 examples / 4 = 9 padded batches per epoch)."""
    kwargs = dict(batch_size=4, seq_len=16, pad_id=0, packing=packing, seed=3)
    reference = take(sft_loader(make_examples(), **kwargs), stop_after + 8)

    first = sft_loader(make_examples(), **kwargs)
    take(first, stop_after)
    state = json.loads(json.dumps(first.state()))  # must survive a JSON round trip
    resumed = sft_loader(make_examples(), **kwargs)
    resumed.restore(state)
    assert all(same(x, y) for x, y in zip(take(resumed, 8), reference[stop_after:]))


def test_restore_refuses_a_different_dataset_or_seed():
    loader = sft_loader(make_examples(), batch_size=4, seq_len=16, pad_id=0, seed=1)
    next(loader)
    state = loader.state()
    with pytest.raises(DataError, match="seed: saved 1 vs now 2"):
        sft_loader(make_examples(), batch_size=4, seq_len=16, pad_id=0, seed=2).restore(state)
    with pytest.raises(DataError, match="num_items"):
        sft_loader(make_examples(30), batch_size=4, seq_len=16, pad_id=0, seed=1).restore(state)


def test_drop_remainder_and_too_small_datasets():
    """Padded, 37 examples, batch 4: 9 full batches with drop_remainder, 10 without."""
    kwargs = dict(batch_size=4, seq_len=16, pad_id=0, packing=False)
    assert sft_loader(make_examples(), **kwargs).batches_in_epoch() == 9
    assert sft_loader(make_examples(), drop_remainder=False, **kwargs).batches_in_epoch() == 10
    with pytest.raises(DataError, match="fewer than one batch of train.batch_size=4"):
        next(sft_loader(make_examples(3), **kwargs))


def test_examples_longer_than_the_sequence_are_refused():
    with pytest.raises(DataError, match="longer than seq_len=4"):
        sft_loader(make_examples(), batch_size=2, seq_len=4, pad_id=0)
