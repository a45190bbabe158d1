"""The queue between rollout workers and an on-policy batch source: bounded staleness, weight sync, restarts,
resume. `RolloutQueue` states its deterministic schedule (rollout i is sampled at most `max_staleness` versions
before it is trained on; 0 is the synchronous loop, step for step) and what a resume keeps.

    queue = RolloutQueue(pool_factory, max_staleness=1)
    result, meta = queue.next(version=trainer.step, params=lambda: trainer.params,
                              make_request=lambda: payload)     # called by the source for each rollout
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from tempax.rl.staleness import staleness
from tempax.rl.workers import WorkerDied, WorkerPool


@dataclass
class _Request:
    request_id: int
    payload: Any
    worker: int = -1
    ref: Any = None


class RolloutQueue:
    """Requests rollouts from a `WorkerPool` ahead of the trainer, at most `max_staleness` versions.

    Schedule (deterministic, so runs are reproducible): rollout i is requested when the trainer is about to train
    on rollout i - max_staleness, with the newest weights, and rollouts are handed out in request order. So
    rollout i is sampled by version max(0, i - max_staleness) - or newer - and trained on at version i:

      * max_staleness = 0: rollout i is requested after update i, with its weights: the synchronous loop, step
        for step (the same prompts, seeds and weights, so the same losses);
      * max_staleness = k: the workers sample up to k rollouts ahead while the trainer trains, each at most k
        versions old. A rollout that comes back older than that (a replacement worker, several workers out of
        order) is dropped and requested again with the newest weights (`async/dropped_stale`).

    Weights are published before each batch is handed out when the trainer has a newer version
    (`WorkerPool.publish`), so a worker never samples with a version older than the schedule allows. A worker
    that died is replaced (`WorkerPool.restart`) and every request it held is issued again to the replacement
    (`async/worker_restarts`, `async/reissued`). Every result carries the worker's start and end wall times, for
    `overlap()`.

    Args:
      pool_factory: `pool_factory(params, version) -> WorkerPool`, called on the first `next`.
      max_staleness: k >= 0.
      encode / decode: a result <-> JSON-able value, for `state()` / `restore()`.
    """

    def __init__(self, pool_factory: Callable[[dict[str, Any], int], WorkerPool], *, max_staleness: int,
                 encode: Callable[[Any], Any], decode: Callable[[Any], Any]):
        self.pool_factory = pool_factory
        self.max_staleness = int(max_staleness)
        self.encode, self.decode = encode, decode
        self.pool: WorkerPool | None = None
        self.issued = 0  # requests made so far (ids 0 .. issued - 1)
        self.taken = 0  # rollouts handed to the trainer (ids 0 .. taken - 1)
        self._pending: dict[int, _Request] = {}  # requested, no result yet
        self._arrived: dict[int, tuple[int, Any]] = {}  # request id -> (version, result), restored or collected
        self._payloads: dict[int, Any] = {}  # request id -> payload, until the rollout is handed out
        self.generated: list[int] = []  # request ids whose results this process received from a worker
        self.counters = {"dropped_stale": 0, "reissued": 0}
        self.busy: list[tuple[float, float]] = []  # worker (start, end) wall times
        self.waits: list[tuple[float, float]] = []  # trainer waiting for a rollout (start, end)

    # -- the source's side --------------------------------------------------------------------------------
    def next(self, version: int, params: Callable[[], dict[str, Any]],
             make_request: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
        """The result of the next rollout for the trainer at `version`, and metrics (staleness, sync, waits).

        `params()` gives the trainer's current trainable arrays (read only when a new version is published);
        `make_request()` gives the payload of the next request (it draws the prompts, so it is called in order).
        """
        metrics: dict[str, float] = {}
        if self.pool is None:
            self.pool = self.pool_factory(params(), version)
            for request in sorted(self._pending.values(), key=lambda r: r.request_id):  # restored: issue again
                self._submit(request)
        elif version > self.pool.version:
            metrics.update(self.pool.publish(version, params()))
        while self.issued <= self.taken + self.max_staleness:
            self._submit(_Request(self.issued, make_request()))
            self.issued += 1
        want = self.taken
        t0 = time.time()
        while True:
            sampled, result = self._wait_for(want)
            lag = staleness(version, sampled)
            if lag <= self.max_staleness:
                break
            self.counters["dropped_stale"] += 1  # too old: ask again with the newest weights
            self._submit(_Request(want, self._payloads[want]))
        self.waits.append((t0, time.time()))
        self._payloads.pop(want, None)
        self.taken += 1
        metrics.update({"async/staleness": float(lag), "async/wait_s": self.waits[-1][1] - t0,
                        "async/dropped_stale": float(self.counters["dropped_stale"]),
                        "async/reissued": float(self.counters["reissued"]),
                        "async/worker_restarts": float(self.pool.restarts), "async/version_sampled": float(sampled)})
        return result, metrics

    def _submit(self, request: _Request) -> None:
        assert self.pool is not None
        self._payloads[request.request_id] = request.payload
        request.worker, request.ref = self.pool.submit(request.request_id, request.payload)
        self._pending[request.request_id] = request

    def _wait_for(self, request_id: int) -> tuple[int, Any]:
        """(version, result) of a request, replacing dead workers and re-issuing their requests meanwhile."""
        assert self.pool is not None
        while request_id not in self._arrived:
            request = self._pending[request_id]
            try:
                self._collect(request, self.pool.result(request.worker, request.ref))
            except WorkerDied as died:
                self.pool.restart(died.index)
                for r in sorted(self._pending.values(), key=lambda r: r.request_id):
                    if r.worker == died.index:
                        self.counters["reissued"] += 1
                        r.worker, r.ref = self.pool.submit(r.request_id, r.payload, worker=died.index)
        return self._arrived.pop(request_id)

    def _collect(self, request: _Request, answer: tuple[int, int, Any, dict[str, float]]) -> None:
        request_id, version, result, timing = answer
        self._pending.pop(request_id, None)
        self._arrived[request_id] = (version, result)
        self.generated.append(request_id)
        self.busy.append((timing["start"], timing["end"]))

    def _collect_ready(self) -> None:
        """Moves every result that has already arrived out of the pool (no waiting)."""
        if self.pool is None:
            return
        by_ref = {r.ref: r for r in self._pending.values()}
        for ref in self.pool.ready(list(by_ref)):
            request = by_ref[ref]
            try:
                self._collect(request, self.pool.result(request.worker, ref))
            except WorkerDied:
                continue  # issued again after the restore or by the next `next`

    # -- resume -----------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """In-flight requests and arrived results, JSON-able. Results that have arrived but were not yet handed to
        the trainer are kept, encoded by `encode`, so a resumed run trains on them without sampling them again;
        requests without a result are issued again on restore (with the resumed trainer's weights). Nothing is lost
        and nothing that finished is generated twice; with max_staleness = 0 nothing is in flight at a step
        boundary, so a resumed run equals the uninterrupted one exactly."""
        self._collect_ready()
        return {
            "issued": self.issued, "taken": self.taken, "counters": dict(self.counters),
            "pending": [{"id": r.request_id, "payload": r.payload}
                        for r in sorted(self._pending.values(), key=lambda r: r.request_id)],
            "arrived": [{"id": i, "version": v, "payload": self._payloads.get(i), "result": self.encode(res)}
                        for i, (v, res) in sorted(self._arrived.items())],
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.issued, self.taken = int(state["issued"]), int(state["taken"])
        self.counters.update({k: int(v) for k, v in state.get("counters", {}).items()})
        self._pending = {int(p["id"]): _Request(int(p["id"]), p["payload"]) for p in state.get("pending", [])}
        self._payloads = {i: r.payload for i, r in self._pending.items()}
        self._payloads.update({int(a["id"]): a.get("payload") for a in state.get("arrived", [])})
        self._arrived = {int(a["id"]): (int(a["version"]), self.decode(a["result"])) for a in state.get("arrived", [])}

    # -- measurement -------------------------------------------------------------------------------------------
    def overlap(self, since: float | None = None) -> dict[str, float]:
        """Worker busy time, the part of it the trainer spent not waiting (generation overlapped with training),
        and the wall time from the first request (or `since`, a `time.time()`) to the last rollout handed out."""
        if not self.busy or not self.waits:
            return {}
        start = min(s for s, _ in self.busy) if since is None else since
        end = max(e for _, e in self.waits)
        busy = _union(self.busy, start, end)
        waiting = _union(self.waits, start, end)
        both = _intersection(busy, waiting)
        total_busy = _length(busy)
        return {"wall_s": end - start, "generation_s": total_busy, "overlapped_s": total_busy - _length(both),
                "overlap_frac": (total_busy - _length(both)) / max(end - start, 1e-9)}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def _union(spans: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in spans):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out = []
    for s1, e1 in a:
        for s2, e2 in b:
            s, e = max(s1, s2), min(e1, e2)
            if e > s:
                out.append((s, e))
    return out


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in spans)
