"""Ctrl-C in a `tempax` command: the command stops with exit status 130, every time.

Python's own handler raises `KeyboardInterrupt` at whatever bytecode the main thread has reached. In a JAX
program that bytecode can be inside a callback whose exceptions the interpreter reports and drops (JAX's
garbage-collection callback, a `__del__`), and the command then runs on as if no Ctrl-C had come. So the handler
installed here raises `KeyboardInterrupt` as Python's does (the command's `finally` blocks and messages run), and
also records the press and starts a watchdog:

- a loop that can stop cleanly asks `check()` between its steps, which raises again when the press was dropped
  (`tempax generate` does between streamed pieces);
- a process still running `GRACE_S` after the press says "interrupted" and ends with 130;
- a second Ctrl-C ends the process at once.

Before a command runs (the process's imports and set-up, parsing) a Ctrl-C ends the process at once
(`exit_on_ctrl_c`). The process then ends without Python's interpreter teardown (`tempax.cli.main.end_interrupted_process`). A
command that gives Ctrl-C a meaning of its own (chat stops a reply and keeps the conversation, serve closes the
server, launch passes it to its processes) says so with `HANDLES_CTRL_C = True` in its module and is left alone;
training installs its own handlers around the training loop (`tempax.train.preemption`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

# How long the command may take to unwind after a Ctrl-C (its `finally` blocks, removing a half-written
# output) before the watchdog ends the process.
GRACE_S = 3.0

_pressed = False  # a Ctrl-C came since `install`


def requested() -> bool:
    """Whether Ctrl-C was pressed since `install`."""
    return _pressed


def check() -> None:
    """Raises `KeyboardInterrupt` when Ctrl-C was pressed: for a loop to call between steps, so a press whose
    exception was dropped still stops it there."""
    if _pressed:
        raise KeyboardInterrupt


def _ignored() -> bool:
    """Whether the process was started with SIGINT ignored (a shell script's `cmd &`): then it stays ignored."""
    return signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def exit_on_ctrl_c() -> None:
    """Until `install`: a Ctrl-C ends the process at once with 130 (main thread only). For the start of the
    `tempax` process (its imports, setting up the process, parsing), where nothing is under way that could be
    unwound, and where Python's own handler would print a traceback of whichever import it cut."""
    if not _ignored():
        signal.signal(signal.SIGINT, lambda signum, frame: _say_and_exit())


def leave_to_command() -> None:
    """Python's own Ctrl-C (`KeyboardInterrupt`) for a command that gives Ctrl-C a meaning of its own."""
    if not _ignored():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def install() -> None:
    """Makes Ctrl-C behave as the module docstring says, for the rest of the process (main thread only)."""
    if _ignored():
        return
    signal.signal(signal.SIGINT, _on_ctrl_c)
    previous = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: _quiet_about_dropped_ctrl_c(unraisable, previous)


def _quiet_about_dropped_ctrl_c(unraisable: Any, report: Any) -> None:
    """The interpreter reports a dropped exception with its traceback ("Exception ignored in ..."); a dropped
    Ctrl-C is not news to the user (`check` or the watchdog still ends the command), the rest is reported."""
    if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
        return
    report(unraisable)


def _say_and_exit() -> None:
    os.write(2, b"interrupted\n")
    os._exit(130)


def _on_ctrl_c(signum: int, frame: Any) -> None:
    global _pressed
    if _pressed:  # a second press: the first one's unwinding is taking too long, or was dropped
        _say_and_exit()
    _pressed = True
    threading.Thread(target=_watchdog, name="tempax-ctrl-c", daemon=True).start()
    raise KeyboardInterrupt


def _watchdog() -> None:
    time.sleep(GRACE_S)
    _say_and_exit()
