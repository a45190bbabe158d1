"""A deterministic, resumable, multi-epoch iterator of fixed-shape batches, built on Grain.

Epoch e visits the items in the order of `grain.MapDataset.range(n).shuffle(seed).repeat()` at indices
[e*n, (e+1)*n) — Grain reseeds the permutation each epoch (seed + e), so every epoch has a new order and the
same seed always gives the same sequence. The ordered items are grouped into rows (packing, or one per row)
and the rows into global batches of `batch_size` with `grain.MapDataset.batch`.

Because an epoch's batches are a pure function of (items, seed, epoch), the loader's position is just
(epoch, batch): `state()` returns it as a small JSON-able dict and `restore(state)` continues exactly where the
saved loader stopped, with no replay.

The batch is global: `batch_size` rows across all devices and hosts. Sharding it is the train step's job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Generic, Sequence, TypeVar

import numpy as np

from tempax.data.formats import Example
from tempax.data.packing import collate_rows, plan_packing
from tempax.errors import ConfigError, DataError

if TYPE_CHECKING:
    import grain

Item = TypeVar("Item")
Unit = TypeVar("Unit")
Batch = dict[str, np.ndarray]

_STATE_VERSION = 1


class BatchLoader(Generic[Item, Unit]):
    """Iterates fixed-shape batches over `items`, epoch after epoch.

    Args:
      items: the dataset (tokenised examples, preference pairs...).
      batch_size: global batch size: units per batch.
      make_units: turns one epoch's items, in visiting order, into batch units (e.g. packed rows).
      collate: turns up to `batch_size` units into a batch dict, padding a short final batch to full shape.
      seed: shuffling seed.
      shuffle: visit items in a seeded random order (else in dataset order every epoch).
      num_epochs: stop after this many epochs; None runs forever.
      drop_remainder: drop each epoch's last, partial batch; otherwise it is padded with empty rows.
      name: what the data is called in error messages.
    """

    def __init__(
        self,
        items: Sequence[Item],
        *,
        batch_size: int,
        make_units: Callable[[list[Item]], list[Unit]],
        collate: Callable[[Sequence[Unit]], Batch],
        seed: int = 0,
        shuffle: bool = True,
        num_epochs: int | None = None,
        drop_remainder: bool = True,
        name: str = "dataset",
    ):
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if num_epochs is not None and num_epochs < 1:
            raise ConfigError(f"num_epochs must be >= 1 or None, got {num_epochs}")
        if not items:
            raise DataError(f"{name} is empty: no examples to batch")
        self.items = items
        self.batch_size = batch_size
        self.seed = int(seed)
        self.shuffle = shuffle
        self.num_epochs = num_epochs
        self.drop_remainder = drop_remainder
        self.name = name
        # Imported here: `import grain` takes seconds, and code that only tokenises should not pay for it.
        import grain

        self._grain = grain
        self._make_units = make_units
        self._collate = collate
        self._order = grain.MapDataset.range(len(items)).shuffle(seed=self.seed).repeat() if shuffle else None
        self._epoch = 0
        self._batch = 0
        self._cached: tuple[int, grain.MapDataset] | None = None

    # -- epochs ---------------------------------------------------------------------------------------------

    def epoch_order(self, epoch: int) -> list[int]:
        """Item indices in the order epoch `epoch` visits them."""
        n = len(self.items)
        if self._order is None:
            return list(range(n))
        return [int(self._order[epoch * n + j]) for j in range(n)]

    def _epoch_batches(self, epoch: int) -> grain.MapDataset:
        if self._cached is None or self._cached[0] != epoch:
            units = self._make_units([self.items[i] for i in self.epoch_order(epoch)])
            ds = self._grain.MapDataset.source(units).batch(
                self.batch_size, drop_remainder=self.drop_remainder, batch_fn=self._collate
            )
            if len(ds) == 0:
                raise DataError(
                    f"{self.name}: one epoch gives {len(units)} rows, fewer than one batch of "
                    f"train.batch_size={self.batch_size}; use more data (a larger data.max_rows, or none) or a "
                    "smaller train.batch_size"
                )
            self._cached = (epoch, ds)
        return self._cached[1]

    def batches_in_epoch(self, epoch: int = 0) -> int:
        """Batches in one epoch (with packing this can differ by one or two between epochs)."""
        return len(self._epoch_batches(epoch))

    # -- iteration ------------------------------------------------------------------------------------------

    def __iter__(self) -> BatchLoader[Item, Unit]:
        return self

    def __next__(self) -> Batch:
        if self.num_epochs is not None and self._epoch >= self.num_epochs:
            raise StopIteration
        ds = self._epoch_batches(self._epoch)
        batch = ds[self._batch]
        self._batch += 1
        if self._batch >= len(ds):
            self._epoch += 1
            self._batch = 0
        return batch

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self._epoch

    # -- resumption -----------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The position of the next batch as a small JSON-able dict."""
        return {
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "batch": self._batch,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_items": len(self.items),
            "batch_size": self.batch_size,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continues from a `state()` taken on a loader over the same data, seed and batch size."""
        expected = {
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_items": len(self.items),
            "batch_size": self.batch_size,
        }
        wrong = {k: (state.get(k), v) for k, v in expected.items() if state.get(k) != v}
        if wrong or state.get("version") != _STATE_VERSION:
            detail = ", ".join(f"{k}: saved {s!r} vs now {n!r}" for k, (s, n) in wrong.items())
            raise DataError(
                f"{self.name}: cannot resume the data position: {detail or 'unknown state version'}. The data, seed "
                "and batch size must match the run that saved it; start the data from scratch instead."
            )
        epoch, batch = int(state["epoch"]), int(state["batch"])
        if batch >= self.batches_in_epoch(epoch):
            raise DataError(f"{self.name}: saved position batch {batch} is past the end of epoch {epoch}")
        self._epoch, self._batch = epoch, batch


def sft_loader(
    examples: Sequence[Example],
    *,
    batch_size: int,
    seq_len: int,
    pad_id: int,
    packing: bool = True,
    seed: int = 0,
    shuffle: bool = True,
    num_epochs: int | None = None,
    drop_remainder: bool = True,
    max_open: int = 64,
) -> BatchLoader[Example, list[Example]]:
    """Batches of `[batch_size, seq_len]` from tokenised examples (keys: see `packing.BATCH_KEYS`).

    Args:
      examples: from `formats.tokenize_rows` with `max_length <= seq_len`.
      packing: greedy-pack several examples per row (`packing.plan_packing`) — each epoch repacks its shuffled
        order; otherwise one example per row, right-padded.
      max_open: rows kept open while packing (see `plan_packing`).
      Others: see `BatchLoader`.
    """
    too_long = [i for i, e in enumerate(examples) if len(e) > seq_len]
    if too_long:
        raise DataError(
            f"{len(too_long)} examples are longer than seq_len={seq_len} (first: {examples[too_long[0]].source}); "
            "tokenize with FormatOptions(max_length=seq_len)."
        )

    def make_units(ordered: list[Example]) -> list[list[Example]]:
        if not packing:
            return [[e] for e in ordered]
        plan = plan_packing([len(e) for e in ordered], seq_len, max_open=max_open)
        return [[ordered[i] for i in row] for row in plan]

    def collate(units: Sequence[list[Example]]) -> Batch:
        return collate_rows(units, seq_len=seq_len, pad_id=pad_id, num_rows=batch_size)

    return BatchLoader(
        examples,
        batch_size=batch_size,
        make_units=make_units,
        collate=collate,
        seed=seed,
        shuffle=shuffle,
        num_epochs=num_epochs,
        drop_remainder=drop_remainder,
        name="sft data",
    )
