"""Graceful stop: SIGTERM (what preemptible VMs, SLURM and Kubernetes send) and the first Ctrl-C end a run at the
next step boundary with a checkpoint, instead of losing every step since the last periodic one; a second signal
stops at once. The exit status is the shell's for that signal (143, 130), so a scheduler's requeue logic keeps
working and the same command continues from the checkpoint.

    with GracefulStop(say=print) as stop:
        while step < steps:
            train_step()
            if stop.requested:
                save_checkpoint(); wait_for_it()
                raise RunStopped(step, stop.signal_name, checkpoint_path)
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable

from tempax.errors import TempaxError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# How long the watcher lets the main thread act on a second signal before ending the process itself: the
# handler runs within microseconds when the main thread is in Python, so a longer wait means native code.
STUCK_AFTER_S = 1.0


class RunStopped(TempaxError):
    """Training stopped on a signal after writing a checkpoint of the step it had finished.

    Attributes: step, signal_name ("SIGTERM" / "SIGINT"), checkpoint (its path; None when no step finished since
    the run started or resumed), exit_status (128 + the signal number).
    """

    def __init__(self, step: int, signal_name: str, checkpoint: str | None):
        self.step, self.signal_name, self.checkpoint = step, signal_name, checkpoint
        self.exit_status = 128 + int(getattr(signal, signal_name))
        if checkpoint:
            text = (f"stopped on {signal_name} after step {step}; saved checkpoint {checkpoint}. Run the same command "
                    "again to continue from it.")
        else:
            text = f"stopped on {signal_name} at step {step}, before another step finished; nothing new to save."
        super().__init__(text)


class GracefulStop:
    """Context manager turning the first SIGTERM / SIGINT into a request to stop at the next step boundary.

    While the context is open, the first SIGTERM or SIGINT only sets `requested` (the step in flight finishes). A
    second signal stops at once: a second Ctrl-C raises `KeyboardInterrupt` (exit status 130), a second SIGTERM
    gets the default action (the process ends, status 143).

    "At once" has to hold while the main thread is inside a step: JAX runs it in C++, and Python runs a signal's
    handler only when the main thread is back in Python, so two Ctrl-C pressed during one step would reach the
    handler as one (Python keeps one pending flag per signal) after the step and its checkpoint. So the signals are
    also counted off the main thread: `signal.set_wakeup_fd` makes the C-level handler write one byte per delivery
    to a pipe, and a watcher thread reads them. On the second delivery the watcher nudges the main thread (a real
    signal, so a blocking system call returns and the handler runs); when the main thread has not raised within
    `STUCK_AFTER_S`, it is inside native code, and the watcher ends the process itself with the same status
    (`os._exit`: nothing more of the run is written, and what is on disk is whole: checkpoints commit by renaming
    a finished folder, and the next run drops an unfinished one).

    Handlers can only be installed from the main thread; elsewhere the context does nothing (`active` is false).

    Args:
      say: where the one line acknowledging the signal goes (default: stderr).
      signals: the signals to catch (default SIGTERM and SIGINT).
    """

    def __init__(self, say: Callable[[str], None] | None = None, signals: tuple[int, ...] = STOP_SIGNALS):
        import sys

        self._say = say or (lambda text: print(text, file=sys.stderr, flush=True))
        self._signals = tuple(signals)
        self._previous: dict[int, Any] = {}
        self._previous_wakeup_fd = -1
        self._pipe: tuple[int, int] | None = None
        self._watcher: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stop_now: int | None = None  # the second signal, once one came: the handler raises on seeing it
        self._raised = threading.Event()
        self.signum: int | None = None
        self.active = False

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def signal_name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is not threading.main_thread():
            return self
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # the C-level handler must never block on it
        self._pipe = (read_fd, write_fd)
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        self._previous_wakeup_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self._watcher = threading.Thread(target=self._watch, args=(read_fd,), name="tempax-signals", daemon=True)
        self._watcher.start()
        self.active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.active:
            return
        self.active = False
        signal.set_wakeup_fd(self._previous_wakeup_fd)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        read_fd, write_fd = self._pipe
        os.write(write_fd, b"\0")  # not a signal number: tells the watcher to end
        self._watcher.join(STUCK_AFTER_S)
        if not self._watcher.is_alive():  # else it waits on a lock the interrupted main thread holds: leave it be
            os.close(read_fd)
            os.close(write_fd)
        self._pipe = self._watcher = None

    def _first(self, signum: int) -> None:
        """Records the first signal and says so once, from whichever of the handler and the watcher sees it first."""
        with self._lock:
            if self.signum is not None:
                return
            self.signum = signum
        name = signal.Signals(signum).name
        self._say(f"{name} received: finishing this step, saving a checkpoint, then stopping "
                  f"(send {name} again to stop at once, without saving)")

    def _handle(self, signum: int, frame: Any) -> None:
        """The Python-level handler, in the main thread: records the first signal; raises on the second."""
        if self._stop_now is None:
            self._first(signum)
            return
        signum = self._stop_now
        self._raised.set()
        self.__exit__()  # a second signal: nothing more of ours runs
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _watch(self, read_fd: int) -> None:
        """Counts deliveries (one byte each) as they happen, even while the main thread is in native code."""
        deliveries = 0
        while True:
            try:
                data = os.read(read_fd, 64)
            except InterruptedError:
                continue
            for byte in data:
                if byte == 0 or not self.active:
                    return
                if byte not in self._signals:
                    continue
                deliveries += 1
                if deliveries == 1:
                    self._first(byte)
                elif deliveries == 2:
                    self._stop_at_once(byte)

    def _stop_at_once(self, signum: int) -> None:
        self._stop_now = signum
        # A real signal to the main thread: a blocking system call there returns, and the handler runs and raises.
        # Not when the handler has raised already (it saw the second signal first): the nudge would land after the
        # handlers are restored and interrupt whatever the program does next.
        if not self._raised.is_set():
            signal.pthread_kill(threading.main_thread().ident, signum)
        if self._raised.wait(STUCK_AFTER_S):
            return
        name = signal.Signals(signum).name
        os.write(2, f"\n{name} received again: stopping at once, without saving\n".encode())
        os._exit(128 + signum)
