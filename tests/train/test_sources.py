"""tempax.train.sources: the batch-source protocol's optional methods, used where present, and arrays kept in a
source's JSON state bit for bit."""

from __future__ import annotations

import json

import numpy as np

from tempax.train.sources import (
    BatchSource,
    attach_source,
    batch_metrics,
    decode_arrays,
    encode_arrays,
    restore_source,
    source_state,
)


class Full:
    """A source with every optional method, recording what it was given."""

    def __init__(self):
        self.restored, self.attached, self.position = None, None, 3

    def __iter__(self):
        yield {"x": np.zeros((2, 4), np.int32)}

    def state(self):
        return {"position": self.position}

    def restore(self, state):
        self.restored = state

    def attach(self, trainer):
        self.attached = trainer

    def batch_metrics(self):
        return {"rollout/reward_mean": 0.5}


def test_a_plain_list_of_batches_is_a_source_with_nothing_optional():
    batches = [{"x": np.zeros((2, 4), np.int32)}]
    assert isinstance(batches, BatchSource) and not isinstance(3, BatchSource)
    assert source_state(batches) is None and batch_metrics(batches) == {}
    restore_source(batches, {"position": 1})  # nothing to restore into: no error
    attach_source(batches, object())


def test_the_optional_methods_are_called_when_present():
    """An empty or missing state is not restored (a fresh run), so a source never sees {}."""
    source, trainer = Full(), object()
    assert source_state(source) == {"position": 3}
    restore_source(source, {})
    restore_source(source, None)
    assert source.restored is None
    restore_source(source, {"position": 7})
    assert source.restored == {"position": 7}
    attach_source(source, trainer)
    assert source.attached is trainer
    metrics = batch_metrics(source)
    metrics["changed"] = 1.0  # a copy: the source's own dict is not the step's record
    assert batch_metrics(source) == {"rollout/reward_mean": 0.5}


def test_arrays_survive_json_bit_for_bit():
    """float32 1/3 and -0.0, a bool mask and an int64 beyond 2**53 keep their exact bytes, dtype and shape through
    JSON text; the decoded arrays are writable copies."""
    arrays = {"logp": np.array([[1 / 3, -0.0], [np.inf, 1e-45]], np.float32),
              "mask": np.array([True, False, True]), "ids": np.array([2**62 + 1], np.int64),
              "empty": np.zeros((0, 3), np.int32)}
    back = decode_arrays(json.loads(json.dumps(encode_arrays(arrays))))
    assert sorted(back) == sorted(arrays)
    for name, a in arrays.items():
        b = back[name]
        assert b.dtype == a.dtype and b.shape == a.shape and b.tobytes() == a.tobytes(), name
    back["mask"][0] = False  # writable
    assert encode_arrays({"t": np.arange(6, dtype=np.int16).reshape(2, 3).T})["t"]["shape"] == [3, 2]
