"""What changes when a run spans several processes (`jax.distributed`): who writes, how hosts read, whose rows.

In a multi-process run every process executes the same program on its own devices; a global `jax.Array` has
shards in every process and no process can read it whole with `np.asarray`. Three rules follow:

* One writer. Files of the run (metrics.jsonl, TensorBoard events, config.yaml, the tokenizer, evaluation
  results, adapters) are written by process 0 only (`is_writer`); the others compute the same values and keep
  them in memory. Orbax checkpoints are the exception: every process writes its own shards, and Orbax
  coordinates the commit itself.
* Host reads through JAX's multi-process utilities. `host_array` returns the whole value of a global array on
  every process (`jax.experimental.multihost_utils.process_allgather`; a local read on one process).
* Rows by process. Every process builds the same global host batch (the loaders are deterministic given the
  seed and their position) and places only the rows of its own devices on them (`global_batch`), so each row
  of the global batch lands on exactly one device: none is seen twice or skipped, and the result is the
  single-process run of the same global batch. `process_rows` says which rows a process owns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding


def is_writer() -> bool:
    """True in the one process that writes the run's files (process 0; the only one on a single host)."""
    return jax.process_index() == 0


def host_array(x: Any) -> np.ndarray:
    """The whole value of `x` (a global `jax.Array`, possibly spread over processes) as a NumPy array here."""
    if jax.process_count() == 1 or not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def host_tree(tree: Any) -> Any:
    """`host_array` on every leaf of a pytree."""
    return jax.tree.map(host_array, tree)


def global_batch(batch: Mapping[str, Any], sharding: NamedSharding) -> dict[str, jax.Array]:
    """A global host batch (the same in every process) as global arrays: each process supplies its own rows."""
    if jax.process_count() == 1:
        return jax.device_put({k: np.asarray(v) for k, v in batch.items()}, sharding)
    return {
        k: jax.make_array_from_callback(np.shape(v), sharding, lambda idx, v=v: np.asarray(v)[idx])
        for k, v in batch.items()
    }


def process_rows(batch_size: int, sharding: NamedSharding, process_index: int | None = None) -> list[int]:
    """The rows of a [batch_size, ...] global batch that `process_index` (default: this one) places on its devices
    under `sharding` (rows shared by several devices, e.g. over a tensor axis, are listed once)."""
    process_index = jax.process_index() if process_index is None else process_index
    rows: set[int] = set()
    for device, index in sharding.devices_indices_map((batch_size,)).items():
        if device.process_index == process_index:
            rows.update(range(batch_size)[index[0]])
    return sorted(rows)


def sync(name: str) -> None:
    """Waits until every process reaches `sync(name)` (a no-op on one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
