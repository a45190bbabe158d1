"""Graceful stop: SIGTERM (what preemptible VMs, SLURM and Kubernetes send) and the first Ctrl-C end a run at the
next step boundary with a checkpoint, instead of losing every step since the last periodic one.

    with GracefulStop(say=print) as stop:
        while step < steps:
            train_step()
            if stop.requested:
                save_checkpoint(); wait_for_it()
                raise RunStopped(step, stop.signal_name, checkpoint_path)

While the context is open, the first SIGTERM or SIGINT only sets `requested` (the step in flight finishes; JAX
runs it in C++, where Python signal handlers wait anyway). A second signal stops at once: a second Ctrl-C raises
`KeyboardInterrupt` (exit status 130), a second SIGTERM gets the default action (the process ends, status 143).

Exit status after a graceful stop (`tempax` commands, `RunStopped.exit_status`): 128 + the signal number, as a
shell reports a process ended by that signal: 143 for SIGTERM, 130 for Ctrl-C. A scheduler's requeue logic keeps
working unchanged, and the run continues from its checkpoint when the same command runs again.

Handlers can only be installed from the main thread; elsewhere the context does nothing (`active` is false).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable

from tempax.errors import TempaxError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


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

    Args:
      say: where the one line acknowledging the signal goes (default: stderr).
      signals: the signals to catch (default SIGTERM and SIGINT).
    """

    def __init__(self, say: Callable[[str], None] | None = None, signals: tuple[int, ...] = STOP_SIGNALS):
        import sys

        self._say = say or (lambda text: print(text, file=sys.stderr, flush=True))
        self._signals = tuple(signals)
        self._previous: dict[int, Any] = {}
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
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        self.active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        self.active = False

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.signum is None:
            self.signum = signum
            self._say(f"{name} received: finishing this step, saving a checkpoint, then stopping "
                      f"(send {name} again to stop at once, without saving)")
            return
        self.__exit__()  # a second signal: nothing more of ours runs
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
