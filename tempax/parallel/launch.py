"""N processes of one multi-process JAX run on this machine (`tempax launch --nproc N -- COMMAND ...`).

Each process gets JAX's own coordinator settings and nothing else (no protocol of ours): the coordinator
address (process 0 serves it on a free local port), the process count and its index, as the environment
variables `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID`, which
`tempax.parallel.init_distributed` passes to `jax.distributed.initialize` (the training commands join first thing, via
`tempax.algorithms.run.start_run`); gloo as the CPU collectives
(`JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo`); and with `--devices-per-process D` the XLA host device count
(`--xla_force_host_platform_device_count=D`, CPU only: a GPU process sees its own GPUs).

When one process fails, the others are stopped (SIGTERM, then SIGKILL after `--grace` seconds) and the launcher
exits with the failed process's status; `--timeout` bounds the whole run. A command starting with `tempax` runs
as `python -m tempax.cli.main` with this interpreter.

On a cluster, start one process per host with the cluster's own tool instead and set `train.mesh.cluster=true`:
JAX then discovers the coordinator on SLURM (srun), Open MPI (mpirun), Kubernetes (an indexed Job) and Cloud
TPU pods itself; see the README section "Running on several hosts".
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from tempax.runtime.process import LAUNCH_RANK_ENV
from tempax.errors import ConfigError
from tempax.parallel.mesh import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(base: dict[str, str], *, coordinator: str, nproc: int, index: int,
                devices_per_process: int | None) -> dict[str, str]:
    """The environment of process `index` of `nproc` (see the module docstring)."""
    env = dict(base)
    env[ENV_COORDINATOR] = coordinator
    env[ENV_NUM_PROCESSES] = str(nproc)
    env[ENV_PROCESS_ID] = str(index)
    env[LAUNCH_RANK_ENV] = str(index)
    env.setdefault("JAX_CPU_COLLECTIVES_IMPLEMENTATION", "gloo")
    if devices_per_process is not None:
        flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT_FLAG)]
        env["XLA_FLAGS"] = " ".join([*flags, f"{DEVICE_COUNT_FLAG}={devices_per_process}"])
    return env


def command_argv(command: list[str]) -> list[str]:
    if not command:
        raise ConfigError("tempax launch: give the command to run after `--`, e.g. -- tempax sft --config R.yaml")
    if command[0] == "tempax":
        return [sys.executable, "-m", "tempax.cli.main", *command[1:]]
    return list(command)


def launch(command: list[str], *, nproc: int, devices_per_process: int | None = None, port: int | None = None,
           timeout: float | None = None, grace: float = 10.0) -> int:
    """Runs `command` as `nproc` processes of one JAX run; returns 0, or the first failing process's status."""
    if nproc < 1:
        raise ConfigError(f"tempax launch: --nproc must be >= 1, got {nproc}")
    argv = command_argv(command)
    coordinator = f"127.0.0.1:{port or free_port()}"
    # Process 0 writes to the launcher's own stdout and stderr. The others' stdout repeats it and is dropped;
    # their stderr (a `tempax` command keeps only warnings and errors there) comes through with their rank.
    procs, relays = [], []
    for i in range(nproc):
        env = process_env(dict(os.environ), coordinator=coordinator, nproc=nproc, index=i,
                          devices_per_process=devices_per_process)
        if i == 0:
            procs.append(subprocess.Popen(argv, env=env))
            continue
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        relays.append(threading.Thread(target=_relay, args=(procs[-1].stderr, f"[process {i}] "), daemon=True))
        relays[-1].start()
    deadline = None if timeout is None else time.monotonic() + timeout
    status = 0
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                status = failed[0]
                print(f"tempax launch: a process exited with status {status}; stopping the others", file=sys.stderr)
                break
            if all(c == 0 for c in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                print(f"tempax launch: still running after {timeout:g} s; stopping", file=sys.stderr)
                status = 124
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        status = 130
    _stop(procs, grace)  # nothing left to stop when every process finished
    for relay in relays:
        relay.join(timeout=5)  # the last lines of each process
    return status


def _relay(stream: Any, prefix: str) -> None:
    """Copies a process's stderr to ours line by line, each line behind `prefix`."""
    for line in iter(stream.readline, b""):
        sys.stderr.write(prefix + line.decode("utf-8", "replace"))
        sys.stderr.flush()


def _stop(procs: list[subprocess.Popen], grace: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(end - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
