"""Calls with a deadline each, from any thread: a small pool of worker processes that are killed on timeout.

Checking model output (math-verify parsing an answer, sympy evaluating it) can take unbounded time on odd text
(`9^9^9^9` makes sympy compute a power tower that never finishes), and Python can interrupt such a call in its own
process only with a signal, which reaches only the main thread. So each checked item runs in a worker process:

    pool = DeadlinePool(workers=2)
    outcomes = pool.map(answers_match, [(("71", "71"), {}), (("9^9^9^9", "5"), {})], timeout_s=2.0)
    # [Outcome(value=True), Outcome(timed_out=True)]
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

# Imported by each worker before it reports ready: what answer checking needs (sympy comes with it).
DEFAULT_PRELOAD = ("tempax.rewards.correctness", "math_verify")


@dataclass(frozen=True)
class Outcome:
    """What one call gave: its return value, or that it ran past its deadline, or the error it raised."""

    value: Any = None
    timed_out: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.error is None


def _serve(conn: Connection, preload: Sequence[str]) -> None:
    """Worker loop: import `preload`, say ready, then answer (fn, args, kwargs) requests until told to stop."""
    # Ctrl-C reaches the whole process group; the parent decides what stops, and its exit (or EOF) ends us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in preload:
        importlib.import_module(name)
    conn.send("ready")
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):  # the parent went away
            return
        if request is None:
            return
        fn, args, kwargs = request
        try:
            reply = (True, fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - everything the checked code raises is reported, not fatal
            reply = (False, f"{type(e).__name__}: {e}")
        try:
            conn.send(reply)
        except Exception as e:  # an unpicklable return value
            conn.send((False, f"could not send the result back: {type(e).__name__}: {e}"))


def _worker_main() -> None:
    """Entry point of a worker process: `python -c ... FD SYS_PATH_JSON PRELOAD...` (see `_Worker`)."""
    fd, path = int(sys.argv[1]), json.loads(sys.argv[2])
    sys.path[:] = path
    _serve(Connection(fd), sys.argv[3:])


class _Worker:
    """One worker: a fresh `python` (not a multiprocessing child, which would re-run the caller's main script)
    talking pickles over a socket pair."""

    def __init__(self, preload: Sequence[str]):
        mine, theirs = socket.socketpair()
        code = "from tempax.rewards.bounded import _worker_main; _worker_main()"
        argv = [sys.executable, "-c", code, str(theirs.fileno()), json.dumps(sys.path), *preload]
        self.proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        self.conn = Connection(mine.detach())
        self.ready = False
        self.item: int | None = None  # index of the item it is running
        self.deadline = float("inf")

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        finally:
            self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
            self.proc.wait(timeout=1)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class DeadlinePool:
    """A persistent pool of worker processes running calls with a deadline each.

    Each item gets its own deadline, counted from the moment a ready worker receives it (worker start-up and the
    import of `preload` modules never count). A worker past its item's deadline is killed and replaced; the item
    alone is reported as timed out, the others are unaffected. Workers are fresh Python processes (never forks of
    a process running JAX threads, and not multiprocessing children, which re-run the caller's main script unless
    it has an `if __name__ == "__main__"` guard). The pool is persistent, so start-up (a fresh Python process
    importing sympy, slow to import) is paid once per worker, not per call; `shared_pool()` is the one the reward
    and evaluation code use. Functions and arguments travel by pickle, so the function must be importable by name
    (a module-level function); a raise inside it comes back as `Outcome.error`.

    Args:
      workers: worker processes (default: 2, at most the machine's CPUs).
      preload: modules each worker imports before taking work, so imports never eat into a deadline.
    """

    def __init__(self, workers: int | None = None, preload: Sequence[str] = DEFAULT_PRELOAD):
        self.size = max(1, workers if workers is not None else min(2, os.cpu_count() or 1))
        self.preload = tuple(preload)
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self.replaced = 0  # workers killed (timeouts) or found dead, and started again; cumulative
        self._failed_starts = 0

    def _start(self) -> None:
        while len(self._workers) < self.size:
            self._workers.append(_Worker(self.preload))

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers.remove(worker)
        self.replaced += 1
        self._start()

    def map(self, fn: Callable[..., Any], calls: Sequence[tuple[tuple, dict]], *,
            timeout_s: float | None) -> list[Outcome]:
        """Runs `fn(*args, **kwargs)` for each `(args, kwargs)` in `calls`, each call with its own `timeout_s`.

        Returns one `Outcome` per call, in order. `timeout_s` None waits as long as it takes.
        """
        items = list(calls)
        results: list[Outcome | None] = [None] * len(items)
        with self._lock:
            self._start()
            todo = deque(range(len(items)))
            while todo or any(w.item is not None for w in self._workers):
                now = time.monotonic()
                for w in self._workers:
                    if w.ready and w.item is None and todo:
                        i = todo.popleft()
                        args, kwargs = items[i]
                        try:
                            w.conn.send((fn, args, kwargs))
                        except Exception as e:  # unpicklable function or arguments: that call fails alone
                            results[i] = Outcome(error=f"could not send the call to a worker: {type(e).__name__}: {e}")
                            continue
                        w.item = i
                        w.deadline = float("inf") if timeout_s is None else now + timeout_s
                busy = [w for w in self._workers if w.item is not None]
                waiting = [w for w in self._workers if not w.ready]
                next_deadline = min((w.deadline for w in busy), default=float("inf"))
                wait_s = None if next_deadline == float("inf") else max(0.0, next_deadline - now)
                ready = set(wait([w.conn for w in busy + waiting], timeout=wait_s))
                now = time.monotonic()
                for w in list(self._workers):
                    if w.conn in ready:
                        try:
                            message = w.conn.recv()
                        except (EOFError, OSError):  # the worker died (crash, out of memory)
                            if not w.ready:
                                self._failed_starts += 1
                                if self._failed_starts >= 3:
                                    raise RuntimeError(
                                        f"deadline workers die while starting (importing {self.preload}); run "
                                        f"python -c 'import {', '.join(self.preload)}' to see why") from None
                            if w.item is not None:
                                results[w.item] = Outcome(error="the worker process died while running this call")
                            self._replace(w)
                            continue
                        if not w.ready:
                            w.ready = message == "ready"
                            continue
                        ok, value = message
                        results[w.item] = Outcome(value=value) if ok else Outcome(error=value)
                        w.item, w.deadline = None, float("inf")
                    elif w.item is not None and now >= w.deadline:
                        results[w.item] = Outcome(timed_out=True)
                        self._replace(w)
        return [r if r is not None else Outcome(error="not run") for r in results]

    def close(self) -> None:
        with self._lock:
            for w in self._workers:
                w.stop()
            self._workers = []


_shared: DeadlinePool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> DeadlinePool:
    """The process-wide pool the reward and evaluation code use (started on first use, closed at exit)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = DeadlinePool()
            atexit.register(_shared.close)
        return _shared
