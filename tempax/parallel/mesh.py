"""The device mesh: one `jax.sharding.Mesh` with axes ('data', 'fsdp', 'tensor').

- `data`: pure data parallelism; parameters are replicated across it.
- `fsdp`: data parallelism whose parameters (and optimizer state) are also split across it (ZeRO-3 / FSDP).
- `tensor`: tensor (Megatron-style) parallelism inside matmuls.

The same three axes exist on every topology, with size 1 where unused, so the rules table in `rules.py` never
has to know the hardware.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import jax
from jax.sharding import AxisType, Mesh

from tempax.errors import ConfigError
from tempax.parallel.peers import PeerWatch, wait_for_coordinator

MESH_AXES: tuple[str, str, str] = ("data", "fsdp", "tensor")


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh of shape (data, fsdp, tensor) over `devices` (default: every device of every process).

    At most one axis may be -1, meaning "all the devices the other axes leave". Axes are `AxisType.Auto`, so the
    compiler propagates shardings from the constraints we place (`jax.make_mesh` would default to Explicit).

    Raises:
        ConfigError: a size is not a positive int or -1, or the sizes do not multiply to the device count.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
    for name, size in sizes.items():
        if not isinstance(size, int) or isinstance(size, bool) or (size < 1 and size != -1):
            raise ConfigError(f"mesh axis '{name}' must be a positive int or -1 (the rest), got {size!r}")
    rest = [name for name, size in sizes.items() if size == -1]
    if len(rest) > 1:
        raise ConfigError(f"only one mesh axis may be -1 (the rest), got -1 for {', '.join(rest)}")
    fixed = math.prod(size for size in sizes.values() if size != -1)
    shown = " x ".join(f"{n}={s}" for n, s in sizes.items())
    if rest:
        if len(devices) % fixed:
            raise ConfigError(
                f"mesh {shown}: the fixed axes need a multiple of {fixed} devices but there are {len(devices)}; "
                "pick fsdp/tensor sizes that divide the device count"
            )
        sizes[rest[0]] = len(devices) // fixed
    elif fixed != len(devices):
        raise ConfigError(
            f"mesh {shown} needs {fixed} devices but there are {len(devices)}; set one axis to -1 to use the rest"
        )
    shape = tuple(sizes[name] for name in MESH_AXES)
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


# The settings `tempax launch` gives each process it starts. JAX reads JAX_COORDINATOR_ADDRESS itself; it has no
# variables for the other two (on SLURM, Open MPI, Kubernetes and Cloud TPU it discovers them: `cluster`).
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} must be an integer") from None


def init_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    cluster: bool = False,
    timeout_s: int = 300,
    heartbeat_timeout_s: int = 100,
    shutdown_timeout_s: int = 300,
) -> bool:
    """Join a multi-process run via `jax.distributed.initialize`; a no-op for a single process.

    Where the settings come from, first match wins: the arguments; the environment `tempax launch` sets
    (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID); with `cluster`, JAX's own discovery (SLURM,
    Open MPI, Kubernetes, Cloud TPU: `jax.distributed.initialize()` without arguments). On CPU the processes talk
    through gloo collectives (set before initialising; without them cross-process programs cannot run on CPU).
    `timeout_s` bounds the wait for the other processes, so a missing peer fails instead of hanging (and a process
    other than 0 first waits that long for the coordinator's address to answer: `peers.wait_for_coordinator`);
    `heartbeat_timeout_s` is how long a silent process counts as alive, `shutdown_timeout_s` how long the
    processes wait for each other at the end. A lost process ends the others with one line naming it
    (`tempax.parallel.peers`). Call it before anything touches `jax.devices()`. Returns True when it initialised
    (or already had).
    """
    coordinator_address = coordinator_address or os.environ.get(ENV_COORDINATOR) or None
    num_processes = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
    process_id = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
    if jax.distributed.is_initialized():
        return True
    explicit = coordinator_address is not None or (num_processes or 1) > 1
    if not explicit and not cluster:
        return False
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # A lost process must not end the others from inside C++: they find it through `PeerWatch` instead.
    jax.config.update("jax_enable_recoverability", True)
    timeouts = {"initialization_timeout": timeout_s, "heartbeat_timeout_seconds": heartbeat_timeout_s,
                "shutdown_timeout_seconds": shutdown_timeout_s}
    if not explicit:
        jax.distributed.initialize(**timeouts)
        _watch_peers(heartbeat_timeout_s, shutdown_timeout_s)
        return True
    if coordinator_address is None or num_processes is None or process_id is None:
        raise ConfigError(
            "multi-host runs need coordinator_address, num_processes and process_id together; got "
            f"coordinator_address={coordinator_address!r}, num_processes={num_processes!r}, process_id={process_id!r}"
            " (set train.mesh.* or the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID environment, "
            "or use `tempax launch`)"
        )
    if not 0 <= process_id < num_processes:
        raise ConfigError(f"process_id must be in [0, {num_processes}), got {process_id}")
    if process_id != 0:
        wait_for_coordinator(coordinator_address, timeout_s)
    jax.distributed.initialize(coordinator_address, num_processes=num_processes, process_id=process_id, **timeouts)
    _watch_peers(heartbeat_timeout_s, shutdown_timeout_s)
    return True


def _watch_peers(heartbeat_timeout_s: int, shutdown_timeout_s: int) -> None:
    from jax._src import distributed  # the coordination client: JAX has no public handle on it

    state = distributed.global_state
    PeerWatch(state.client, process_id=state.process_id, num_processes=state.num_processes,
              coordinator=state.coordinator_address, heartbeat_timeout_s=heartbeat_timeout_s,
              shutdown_timeout_s=shutdown_timeout_s).start()
