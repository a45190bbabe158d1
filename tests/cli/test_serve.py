"""`tempax serve` refuses impossible settings with exit status 2 and a message naming the flag, and stops on
Ctrl-C or SIGTERM however it was started."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from tempax.cli.main import main
from tempax.models.hf_io import save_hf_checkpoint
from tests.generate.conftest import peaked_tiny_model
from tests.kit.tokenizers import tiny_chat_tokenizer


def test_serve_refuses_a_context_beyond_the_model_and_a_busy_port(tmp_path, capsys):
    folder = save_hf_checkpoint(peaked_tiny_model(), str(tmp_path / "tiny"), tokenizer=tiny_chat_tokenizer())
    assert main(["serve", folder, "--max-model-len", "100000"]) == 2
    assert "--max-model-len 100000 must lie in [2, " in capsys.readouterr().err
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", folder, "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_a_port_out_of_range_or_in_use_is_refused_before_the_model_loads(capsys, monkeypatch):
    """The report: --port 70000 ended in an OverflowError traceback after 23 s of loading, a busy port was refused
    only after 35 s of loading and compiling. Both are now one line, exit 2, with nothing loaded."""
    import tempax.cli.serve as serve_cli

    def must_not_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the port was checked")

    monkeypatch.setattr(serve_cli, "load_source", must_not_load)
    for port in ("70000", "-1"):
        assert main(["serve", "smollm2-135m-instruct", "--port", port]) == 2
        err = capsys.readouterr().err
        assert err == f"tempax serve: error: --port {port} is not a TCP port; choose one in 0-65535 (0: any free port)\n"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "smollm2-135m-instruct", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tempax serve: error: cannot listen on 127.0.0.1:{port} (") and "choose another --port" in err
    assert main(["serve", "smollm2-135m-instruct", "--host", "no-such-host.invalid", "--port", "0"]) == 2
    assert "cannot listen on no-such-host.invalid:0" in capsys.readouterr().err


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _ask_until_refused(url: str) -> None:
    while True:
        try:
            urllib.request.urlopen(url, timeout=5).close()
        except (urllib.error.URLError, OSError):
            return


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.heavy
def test_serve_stops_on_a_signal_even_when_started_with_sigint_ignored(tmp_path, signum):
    """A server a script starts in the background inherits SIGINT ignored (POSIX shells do that to `cmd &`), and
    Python then installs no KeyboardInterrupt: Ctrl-C / kill -INT used to leave it running. Started that way, it
    answers /health, then each signal stops it: one line naming the signal, exit status 0, no traceback."""
    folder = save_hf_checkpoint(peaked_tiny_model(), str(tmp_path / "tiny"), tokenizer=tiny_chat_tokenizer())
    env = {**os.environ, "PYTHONPATH": ROOT, "TEMPAX_REEXEC": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "tempax.cli.main", "serve", folder, "--port", "0",
                             "--max-model-len", "32", "--max-batch", "2"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline, line = time.monotonic() + 240, ""
        while time.monotonic() < deadline and "serving" not in line and proc.poll() is None:
            line = proc.stderr.readline()
        url = re.search(r"on (http://\S+)/v1", line)
        assert url, line
        with urllib.request.urlopen(url.group(1) + "/health", timeout=30) as response:
            assert response.status == 200
        # Requests keep arriving while the signal lands, so it may find the main thread handing one to its
        # thread, where socketserver would swallow an ordinary exception.
        busy = threading.Thread(target=_ask_until_refused, args=(url.group(1) + "/health",), daemon=True)
        busy.start()
        time.sleep(0.5)
        proc.send_signal(signum)
        err = proc.communicate(timeout=60)[1]
        busy.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert f"tempax serve: stopped ({signal.Signals(signum).name})" in err and "Traceback" not in err
