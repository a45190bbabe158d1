"""The processes of a multi-process run as peers: reaching the coordinator, and what a lost one looks like.

A run over several hosts loses a process when a host dies, is preempted or runs out of memory. By default JAX's
coordination service then ends every survivor from inside C++ with a page of logs, and a survivor waiting in a
collective gets an error from deep inside XLA. Instead, every tempax process ends with one line naming the lost
process and its host (`PeerWatch`, `EXIT_PROCESS_LOST`), and the run resumes from its newest intact checkpoint
(Orbax commits a step only after every process wrote its shards).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import sys
import threading
import time
from typing import Any

from tempax.errors import TempaxError

EXIT_PROCESS_LOST = 5
POLL_S = 1.0
PEER_KEY = "tempax/peer/"


class CoordinatorUnreachable(TempaxError):
    """The coordinator's address did not accept a connection within the initialisation timeout (exit status 2)."""


def wait_for_coordinator(address: str, timeout_s: float) -> None:
    """Returns once `address` (host:port) accepts a TCP connection; retries until `timeout_s` have passed.

    Raises:
        CoordinatorUnreachable: nothing answered there in time.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=min(2.0, max(timeout_s, 0.1))):
                return
        except OSError as e:
            last = e.strerror or type(e).__name__
        if time.monotonic() >= deadline:
            raise CoordinatorUnreachable(
                f"the coordinator {address} did not answer within {timeout_s:g} s (train.mesh.init_timeout_s; last "
                f"attempt: {last}): start process 0 first, and check that this host reaches that address and port "
                "(train.mesh.coordinator_address / JAX_COORDINATOR_ADDRESS)"
            )
        time.sleep(0.5)


def own_address(coordinator: str) -> str:
    """The address this host uses to reach the coordinator (how the other hosts know it)."""
    host = coordinator.rpartition(":")[0].strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))  # a datagram socket sends nothing on connect: it only picks the route
            return s.getsockname()[0]
    except OSError:
        return "?"


class PeerWatch:
    """Watches the other processes of this run through JAX's coordination service.

    The service is recoverable (`jax_enable_recoverability`, set by `init_distributed`), so a lost process does not
    end the others from C++; they learn of it by asking which processes are alive. This daemon thread asks every
    `POLL_S` seconds; when a process is missing (or, in the other processes, when the coordinator stops answering)
    it prints one line naming the lost process and its host, and ends this process with `EXIT_PROCESS_LOST` at
    once: the interpreter's exit handlers would wait for the lost process at JAX's shutdown barrier. An XLA runtime
    error that reaches the top of the program (a collective whose peer went away) is held until the watch has named
    the lost process, at most the heartbeat timeout, so that line is what the user reads; an error with every
    process alive is reported as usual. Before joining, a process other than 0 checks that the coordinator's
    address answers within `init_timeout_s` (`wait_for_coordinator`)."""

    def __init__(self, client: Any, *, process_id: int, num_processes: int, coordinator: str,
                 heartbeat_timeout_s: float, shutdown_timeout_s: float):
        self.client, self.process_id, self.num_processes = client, process_id, num_processes
        self.coordinator, self.heartbeat_timeout_s = coordinator, heartbeat_timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.hosts: dict[int, str] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tempax-peer-watch", daemon=True)

    def start(self) -> None:
        """Publishes this process's host, reads the others' and starts watching; at exit, waits for every process
        before JAX shuts down (a coordinator leaving first would strand the others)."""
        me = json.dumps({"host": socket.gethostname(), "address": own_address(self.coordinator)})
        self.client.key_value_set(f"{PEER_KEY}{self.process_id}", me)
        for i in range(self.num_processes):
            peer = json.loads(self.client.blocking_key_value_get(f"{PEER_KEY}{i}", int(self.heartbeat_timeout_s * 1000)))
            self.hosts[i] = f"{peer['host']}, {peer['address']}"
        self._thread.start()
        previous = sys.excepthook
        sys.excepthook = lambda kind, value, tb: self._on_uncaught(previous, kind, value, tb)
        atexit.register(self._at_exit)  # after JAX's own handler was registered: runs before it

    def describe(self, process: int) -> str:
        return f"process {process} of {self.num_processes} (host {self.hosts.get(process, '?')})"

    def _watch(self) -> None:
        everyone = list(range(self.num_processes))
        while not self._stopped.wait(POLL_S):
            try:
                live = self.client.get_live_nodes(everyone)
            except Exception as e:  # noqa: BLE001 - whatever the service's RPC raised: it no longer answers
                if self._stopped.is_set():
                    return
                self.lost([0], f"the coordinator {self.coordinator} stopped answering ({str(e).splitlines()[0]})")
                return
            missing = [i for i in everyone if i not in live]
            if missing and not self._stopped.is_set():
                self.lost(missing, f"no heartbeat for {self.heartbeat_timeout_s:g} s (train.mesh.heartbeat_timeout_s)")
                return

    def lost(self, processes: list[int], why: str) -> None:
        """Says which processes were lost, in one line, and ends this one (`PeerWatch`)."""
        names = "; ".join(self.describe(p) for p in processes)
        print(f"tempax: lost {names}: {why}. Stopping {self.describe(self.process_id)}; the newest intact "
              "checkpoint stays in the run dir: run the same command again to resume (on the hosts left, the "
              "checkpoint is resharded)", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_PROCESS_LOST)

    def _on_uncaught(self, previous: Any, kind: type, value: BaseException, tb: Any) -> None:
        """Holds an XLA runtime error until the watch has named a lost process (it then ends the process)."""
        if type(value).__name__ in ("JaxRuntimeError", "XlaRuntimeError") and self._thread.is_alive():
            self._thread.join(timeout=self.heartbeat_timeout_s + 3 * POLL_S)
        previous(kind, value, tb)

    def _at_exit(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=2 * POLL_S)
        try:
            self.client.wait_at_barrier("tempax-exit", int(self.shutdown_timeout_s * 1000))
        except Exception as e:  # noqa: BLE001 - a process lost at the very end: say so instead of JAX's fatal check
            print(f"tempax: not every process reached the end of the run within {self.shutdown_timeout_s:g} s "
                  f"(train.mesh.shutdown_timeout_s): {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
            os._exit(EXIT_PROCESS_LOST)
        if self.process_id == 0:
            # The recoverable service has no shutdown barrier of its own: process 0 serves it, so it leaves last,
            # once the others have disconnected (a client that finds the service gone fails JAX's fatal check).
            deadline = time.monotonic() + self.shutdown_timeout_s
            everyone = list(range(self.num_processes))
            with contextlib.suppress(Exception):
                while set(self.client.get_live_nodes(everyone)) - {0} and time.monotonic() < deadline:
                    time.sleep(0.1)
