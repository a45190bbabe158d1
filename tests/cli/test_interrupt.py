"""Ctrl-C in a `tempax` command (`tempax.cli.interrupt`): a press whose `KeyboardInterrupt` the interpreter drops
(raised inside a callback, as JAX's garbage-collection callback) still stops the command; a second press stops it
at once. Each case runs in a process of its own, as the `tempax` command does."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A Ctrl-C handled inside __del__: Python reports the exception as "ignored" and goes on.
_DROPPED = """
import os, signal, time
from tempax.cli import interrupt
interrupt.install()

class Dropper:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))

try:
    Dropper()
    print("went on after the dropped Ctrl-C", flush=True)
    {after}
    print("not reached", flush=True)
except KeyboardInterrupt:
    print("stopped", flush=True)
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})


def test_a_dropped_ctrl_c_stops_the_loop_that_checks_and_says_no_traceback():
    done = _run(_DROPPED.format(after="interrupt.check()"))
    assert done.stdout == "went on after the dropped Ctrl-C\nstopped\n"
    assert done.stderr == "" and done.returncode == 0  # the "Exception ignored ..." report is not printed


def test_a_dropped_ctrl_c_nothing_checks_for_ends_the_process_after_the_grace_time():
    done = _run(_DROPPED.format(after="time.sleep(50)"))
    assert done.returncode == 130 and done.stderr == "interrupted\n"
    assert done.stdout == "went on after the dropped Ctrl-C\n"


def test_a_second_ctrl_c_while_the_first_unwinds_ends_the_process_at_once():
    code = ("import os, signal, time\nfrom tempax.cli import interrupt\ninterrupt.install()\n"
            "try:\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(50)\n"
            "finally:\n    print('unwinding', flush=True)\n    os.kill(os.getpid(), signal.SIGINT)\n"
            "    time.sleep(50)\n    print('not reached', flush=True)\n")
    done = _run(code)
    assert done.returncode == 130 and done.stdout == "unwinding\n" and done.stderr == "interrupted\n"
