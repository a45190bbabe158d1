"""Rollout workers: processes that each hold a copy of the policy and the generation engine, run as Ray actors,
so sampling runs beside training (`tempax.rl.async_source` schedules them). Only trainable arrays travel after a
worker is built (with LoRA the adapters, never the base), and a failure says what happened instead of hanging.
Ray is optional (`pip install 'tempax[distributed]'`) and imported only when a pool is built.

    pool = WorkerPool(rollout_fn, parts, params, num_workers=1, ray_config=RayConfig())
    pool.publish(version=1, params=new_params)     # trainable weights through Ray's object store
    ref = pool.submit(request_id=0, payload={...}) # the worker samples with the newest version it was sent
    request_id, version, result, timing = pool.result(ref)
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from tempax.configlib import help_field
from tempax.errors import ConfigError, TempaxError

INSTALL_HINT = "pip install 'tempax[distributed]'  (or: pip install ray==2.60.0)"


@dataclass(frozen=True)
class RayConfig:
    """Where the rollout workers run."""

    address: str | None = help_field(
        "A running Ray cluster to join ('auto', 'ray://HOST:10001', or HOST:PORT); null starts a local Ray "
        "instance for the run and stops it at the end.",
        None,
    )
    num_cpus: int | None = help_field("CPUs a local instance may schedule on (null: all of the machine's).", None)
    timeout_s: float = help_field(
        "Longest wait for a rollout (and the weight versions applied before it) before the run fails with an "
        "error naming the worker, instead of hanging.",
        600.0,
    )
    worker_resource: str | None = help_field(
        "Place each rollout worker on a Ray node offering this custom resource, one unit per worker (start the "
        "rollout hosts with `ray start --address HEAD:6379 --resources '{\"NAME\": N}'`); null: any node.",
        None,
    )
    worker_cpus: tuple[int, ...] = help_field(
        "Pin worker i to CPU core worker_cpus[i % len] (os.sched_setaffinity), e.g. [1] to keep core 0 for the "
        "trainer; empty: no pinning.",
        (),
    )

    def validate(self) -> None:
        if not self.timeout_s > 0:
            raise ConfigError(f"ray.timeout_s must be > 0, got {self.timeout_s}")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ConfigError(f"ray.num_cpus must be >= 1 or null, got {self.num_cpus}")


class WorkerDied(TempaxError):
    """A rollout worker's process ended (killed, out of memory, crashed)."""

    def __init__(self, index: int, cause: BaseException):
        super().__init__(f"rollout worker {index} died: {type(cause).__name__}: {str(cause).splitlines()[0][:300]}")
        self.index = index


class WorkerTimeout(TempaxError):
    """A rollout worker answered nothing within `ray.timeout_s`."""


def require_ray(what: str = "grpo.workers > 0") -> Any:
    """The `ray` module, or a `ConfigError` saying how to install it."""
    try:
        import ray  # optional dependency: only runs with rollout workers load it
    except ImportError as e:
        raise ConfigError(f"{what} runs rollout workers on Ray, which is not installed: {INSTALL_HINT}") from e
    return ray


def host_params(params: dict[str, Any]) -> dict[str, np.ndarray]:
    """Trainable arrays as host numpy arrays (what travels to the workers)."""
    return {k: np.asarray(v) for k, v in jax.device_get(dict(params)).items()}


def params_nbytes(params: dict[str, Any]) -> int:
    return int(sum(np.asarray(v).nbytes if isinstance(v, np.ndarray) else v.nbytes for v in params.values()))


class RolloutWorker:
    """The actor's body (`WorkerPool` says how it is built and fed); `WorkerPool` starts it with `ray.remote`."""

    def __init__(self, index: int, rollout_fn: Callable[[Any, Any], Any], parts: Any, params: dict[str, np.ndarray],
                 version: int, cpus: tuple[int, ...] = ()):
        if cpus:
            os.sched_setaffinity(0, set(cpus))
        self.index = index
        self.rollout_fn = rollout_fn
        self.parts = parts
        self.rest = jax.tree.map(jnp.asarray, parts.rest)
        self.params = {k: jnp.asarray(v) for k, v in params.items()}
        self.version = int(version)
        self.sync_error: str | None = None

    def pid(self) -> int:
        return os.getpid()

    def set_weights(self, version: int, params: dict[str, np.ndarray]) -> dict[str, float]:
        """Applies weight version `version` (runs between requests: actor calls never overlap)."""
        t0 = time.perf_counter()
        bad = sorted(set(params) ^ set(self.params)) or sorted(
            k for k in params if tuple(np.shape(params[k])) != tuple(self.params[k].shape))
        if bad:
            self.sync_error = (f"weight version {version} does not fit rollout worker {self.index}'s model: "
                               f"{len(bad)} mismatched arrays, e.g. {bad[0]!r} (keys or shapes differ)")
            raise TempaxError(self.sync_error)
        self.params = {k: jnp.asarray(v) for k, v in params.items()}
        self.version = int(version)
        return {"version": float(version), "apply_s": time.perf_counter() - t0}

    def rollout(self, request_id: int, payload: Any) -> tuple[int, int, Any, dict[str, float]]:
        """One request with the newest applied version: (request_id, version, result, timing)."""
        if self.sync_error is not None:
            raise TempaxError(self.sync_error)
        start = time.time()
        model = self.parts.merge(self.params, self.rest)
        result = self.rollout_fn(model, payload)
        return request_id, self.version, result, {"start": start, "end": time.time(), "worker": float(self.index)}


class WorkerPool:
    """N `RolloutWorker` actors on Ray, the weight versions they were sent, and replacement of dead ones.

    A worker is built once from the model split the trainer uses (`tempax.train.state.ModelParts`: graph, frozen
    rest, trainable templates) and the trainable arrays; afterwards only trainable arrays travel (`publish`). An
    actor runs its calls one at a time in the order they were sent, so a new version is applied between two
    requests and never in the middle of a sequence. `rollout_fn(model, payload)` is what a request does (GRPO:
    `sample_rollout` on the payload's prompts); it must be picklable (a module-level function or a
    `functools.partial` of one).

    Failures: a weight version the worker cannot apply (wrong keys or shapes) fails its next request with a
    `TempaxError`, a worker that answers nothing within `ray.timeout_s` raises `WorkerTimeout`, and a worker
    process that died raises `WorkerDied`, so the caller can start a replacement and re-issue its requests.

    Args:
      rollout_fn: `rollout_fn(model, payload) -> result`, run by a worker per request (picklable).
      parts: the trainer's `ModelParts` (graph, frozen rest, trainable templates); sent once per worker.
      params: the trainable arrays of version `version`.
      num_workers: N >= 1.
      ray_config: where Ray runs, timeouts, CPU pinning.
      version: the version of `params` (the trainer's step; non-zero on resume).
    """

    def __init__(self, rollout_fn: Callable[[Any, Any], Any], parts: Any, params: dict[str, Any], *,
                 num_workers: int, ray_config: RayConfig, version: int = 0):
        ray = require_ray()
        self.ray = ray
        self.config = ray_config
        self.started_ray = False
        if not ray.is_initialized():
            if ray_config.address:
                ray.init(address=ray_config.address, log_to_driver=False)
            else:
                ray.init(num_cpus=ray_config.num_cpus, include_dashboard=False, log_to_driver=False)
                self.started_ray = True
        placement = {"resources": {ray_config.worker_resource: 1}} if ray_config.worker_resource else {}
        self._actor_cls = ray.remote(num_cpus=0, **placement)(RolloutWorker)
        self.rollout_fn = rollout_fn
        frozen = jax.tree.map(np.asarray, jax.device_get(parts.rest))
        self._parts_ref = ray.put(type(parts)(parts.graphdef, parts.templates, frozen))
        self.version = int(version)
        self._params_ref = ray.put(host_params(params))
        self.restarts = 0
        self.sync_bytes = 0
        self.workers = [self._start(i) for i in range(num_workers)]
        self._next = 0

    def _start(self, index: int) -> Any:
        cpus = self.config.worker_cpus
        pin = (cpus[index % len(cpus)],) if cpus else ()
        return self._actor_cls.remote(index, self.rollout_fn, self._parts_ref, self._params_ref, self.version, pin)

    def restart(self, index: int) -> None:
        """Replaces worker `index` with a fresh one holding the newest published version."""
        self.ray.kill(self.workers[index], no_restart=True)
        self.workers[index] = self._start(index)
        self.restarts += 1

    def publish(self, version: int, params: dict[str, Any]) -> dict[str, float]:
        """Sends weight version `version` to every worker through the object store (put once, read by all);
        each applies it after the requests already queued on it. Returns sync metrics."""
        t0 = time.perf_counter()
        arrays = host_params(params)
        self._params_ref = self.ray.put(arrays)
        self.version = int(version)
        for actor in self.workers:
            actor.set_weights.remote(self.version, self._params_ref)
        nbytes = params_nbytes(arrays)
        self.sync_bytes += nbytes
        return {"async/sync_bytes": float(nbytes), "async/sync_s": time.perf_counter() - t0}

    def submit(self, request_id: int, payload: Any, worker: int | None = None) -> tuple[int, Any]:
        """Queues a request on a worker (round robin unless given); returns (worker index, result ref)."""
        if worker is None:
            worker, self._next = self._next, (self._next + 1) % len(self.workers)
        return worker, self.workers[worker].rollout.remote(request_id, payload)

    def ready(self, refs: list[Any]) -> list[Any]:
        """The refs among `refs` whose results are there now (no waiting)."""
        if not refs:
            return []
        done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
        return done

    def result(self, worker: int, ref: Any) -> tuple[int, int, Any, dict[str, float]]:
        """Waits (at most `ray.timeout_s`) for a request's result.

        Raises:
          WorkerDied: the worker's process ended; restart it and re-issue its requests.
          WorkerTimeout: nothing came back in time.
          TempaxError: the request failed on the worker (a weight version it could not apply, a reward error).
        """
        ray = self.ray
        done, _ = ray.wait([ref], timeout=self.config.timeout_s)
        if not done:
            raise WorkerTimeout(
                f"rollout worker {worker} returned nothing within ray.timeout_s={self.config.timeout_s:g} s (last "
                f"weight version sent: {self.version}); it may be stuck applying weights or generating. Raise "
                "ray.timeout_s for slow rollouts, or look at the worker's log (ray logs)"
            )
        try:
            return ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
            raise WorkerDied(worker, e) from e
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, TempaxError):
                raise TempaxError(f"rollout worker {worker}: {cause}") from e
            raise TempaxError(f"rollout worker {worker} failed: {str(e).splitlines()[-1][:500]}") from e

    def close(self) -> None:
        for actor in self.workers:
            self.ray.kill(actor, no_restart=True)
        self.workers = []
        if self.started_ray:
            self.ray.shutdown()
