"""GracefulStop: the first SIGTERM / Ctrl-C only asks for a stop; a second one stops at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tempax.train.preemption import GracefulStop, RunStopped


def test_first_signal_sets_the_request_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    said = []
    with GracefulStop(say=said.append) as stop:
        assert stop.active and not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signal_name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before
    assert said == ["SIGTERM received: finishing this step, saving a checkpoint, then stopping "
                    "(send SIGTERM again to stop at once, without saving)"]


def test_second_ctrl_c_raises_at_once():
    before = signal.getsignal(signal.SIGINT)  # Python's handler, or SIG_IGN in a job started in the background
    with pytest.raises(KeyboardInterrupt):
        with GracefulStop(say=lambda _: None) as stop:
            os.kill(os.getpid(), signal.SIGINT)
            assert stop.signal_name == "SIGINT"
            os.kill(os.getpid(), signal.SIGINT)
            raise AssertionError("not reached: the second Ctrl-C interrupts")
    assert signal.getsignal(signal.SIGINT) is before


def test_second_sigterm_ends_the_process_with_the_default_action():
    code = ("import os, signal, time\nfrom tempax.train.preemption import GracefulStop\n"
            "with GracefulStop(say=print):\n    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(5)\nprint('not reached')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == -signal.SIGTERM and "not reached" not in proc.stdout


def test_run_stopped_exit_status_is_128_plus_the_signal():
    assert RunStopped(7, "SIGTERM", "/r/checkpoints/7").exit_status == 143
    assert RunStopped(7, "SIGINT", None).exit_status == 130
    assert str(RunStopped(7, "SIGINT", None)).startswith("stopped on SIGINT at step 7, before another step")
    message = str(RunStopped(7, "SIGTERM", "/r/checkpoints/7"))
    assert message.startswith("stopped on SIGTERM after step 7; saved checkpoint /r/checkpoints/7")
