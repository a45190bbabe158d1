"""The batch-source protocol: what `Trainer.fit` trains on, for every algorithm (offline data and on-policy
rollouts). A source is an iterable of fixed-shape host batches; its optional methods (state and restore, attach,
batch metrics) are used where present, through the helpers below. `BatchSource` states the whole protocol.
"""

from __future__ import annotations

import base64
from typing import Any, Iterable, Iterator, Protocol, runtime_checkable

import numpy as np

from tempax.train.view import TrainerView

Batch = dict[str, np.ndarray]


@runtime_checkable
class BatchSource(Protocol):
    """What `Trainer.fit` trains on: an iterable of fixed-shape global host batches (dicts of numpy arrays with a
    leading `[batch_size, ...]` axis). Only `__iter__` is required; `fit` uses what else is there:

        def state(self) -> dict | None: ...                             # position after the batch last yielded
        def restore(self, state: dict) -> None: ...                     # continue from such a position
        def attach(self, trainer: TrainerView) -> None: ...             # on-policy sources (`attach_source`)
        def batch_metrics(self) -> dict[str, float]: ...                # host metrics of the batch last yielded

    `tempax.data.loader.BatchLoader` is a source (iteration, state, restore);
    `tempax.algorithms.grpo.source.GRPOSource` is an on-policy one (all five).
    """

    def __iter__(self) -> Iterator[Batch]: ...


def source_state(source: Iterable[Batch]) -> dict[str, Any] | None:
    """`source.state()` when the source has one, else None.

    A JSON-able dict (positions, counters, seeds; arrays as `encode_arrays`). `fit` stores the state taken right
    after a step's batch was drawn in that step's checkpoint, and on resume restores it before anything else, so
    the source continues exactly where the checkpointed run did.

    The boundary rule (several optimizer passes over one rollout: PPO epochs, GRPO's num_iterations): the state
    must be resumable after *every* batch, also between two passes over the same rollout. A source in the middle
    of such a rollout puts the rollout itself (its batch, `encode_arrays`) and the passes left into its state, and
    `restore` yields it again for those passes before sampling anything new. A checkpoint can then fall due at any
    step, a hook can stop a run at any step, and a killed-and-resumed run trains on exactly the batches the
    uninterrupted run did: the rollout is never re-sampled with weights it was not sampled with.
    """
    fn = getattr(source, "state", None)
    return fn() if callable(fn) else None


def restore_source(source: Iterable[Batch], state: dict[str, Any] | None) -> None:
    """`source.restore(state)` when the source can and the state is not empty."""
    fn = getattr(source, "restore", None)
    if state and callable(fn):
        fn(state)


def attach_source(source: Iterable[Batch], trainer: TrainerView) -> None:
    """`source.attach(trainer)` when the source has it.

    `fit` calls it once, after any restore and before the first batch is drawn, with the trainer as a
    `tempax.train.view.TrainerView` (the members a source may use, and no more). An on-policy source keeps it to
    sample with the current policy (`trainer.model`), to run no-grad forward passes over its weights
    (`trainer.params`, `trainer.rest`, `trainer.parts.merge`) on the mesh (`trainer.mesh`, `trainer.put_batch`) in
    micro-batches of `trainer.micro_batch_size` rows, and to read the settings it seeds and sizes itself with
    (`trainer.seed`, `trainer.batch_size`, `trainer.seq_len`). Iteration is lazy: batch k + 1 is drawn after step
    k was dispatched, so it is sampled from the weights step k produced.
    """
    fn = getattr(source, "attach", None)
    if callable(fn):
        fn(trainer)


def batch_metrics(source: Iterable[Batch]) -> dict[str, float]:
    """`source.batch_metrics()` when the source has it, else {}: host-side numbers about the batch just drawn
    (rollout rewards, completion lengths, time spent sampling), merged into that step's logged metrics beside the
    loss function's."""
    fn = getattr(source, "batch_metrics", None)
    return dict(fn() or {}) if callable(fn) else {}


def encode_arrays(arrays: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """Arrays as JSON-able dicts (dtype, shape, base64 of the raw bytes): exact, and small next to the weights."""
    out = {}
    for name, value in arrays.items():
        a = np.ascontiguousarray(value)
        out[name] = {"dtype": a.dtype.str, "shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode()}
    return out


def decode_arrays(encoded: dict[str, dict[str, Any]]) -> dict[str, np.ndarray]:
    """The inverse of `encode_arrays` (bit-identical arrays)."""
    return {
        name: np.frombuffer(base64.b64decode(e["data"]), dtype=np.dtype(e["dtype"])).reshape(e["shape"]).copy()
        for name, e in encoded.items()
    }
