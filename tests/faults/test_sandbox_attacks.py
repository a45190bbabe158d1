"""Programs that attack the sandbox (`tempax.rewards.sandbox`), each run as a code task's answer through the
`code_tests` reward: each must be contained (this process keeps running, files outside the sandbox stay as they
were, no process of the program is left afterwards), score 0, and be counted in the sandbox's metrics. The
session's summary line says how many were tried (`tests/faults/conftest.py`).

What "cannot read the trainer's files" promises: the home folder, the working directory (here the repository),
the Python environment and the temporary folders are shown empty; world-readable files elsewhere (the system's
/usr, /etc) stay readable, and are not what is tested here.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

import psutil
import pytest

from tempax.rewards.code import CodeRewardConfig, CodeTestsReward
from tempax.rewards.sandbox import MAX_WORKERS, SandboxConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = [{"args": [2], "expected": 4}, {"args": [5], "expected": 25}]  # square(x): a one-line honest answer


def fenced(body: str) -> str:
    """A completion holding `body`, then a correct `square`: any score above 0 would mean the attack got past."""
    return f"```python\n{body}\n\ndef square(x):\n    return x * x\n```"


@pytest.fixture(scope="module")
def reward():
    return CodeTestsReward(CodeRewardConfig(sandbox=SandboxConfig(timeout_s=2.0, cpu_seconds=1, memory_mb=256,
                                                                  max_processes=16, max_output_bytes=4096)))


def _program_processes(reward) -> list[psutil.Process]:
    """Live processes running as one of this process's sandbox uids (zombies are dead and hold nothing)."""
    low = reward.config.sandbox.uid_base + (os.getpid() % 997) * MAX_WORKERS
    found = []
    for proc in psutil.process_iter(["uids", "status"]):
        try:
            if low <= proc.info["uids"].real < low + MAX_WORKERS and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, TypeError):
            continue
    return found


def attack(reward, contained, name: str, body: str, counter: str | tuple[str, ...], *,
           guard: str | None = None) -> None:
    """Runs one attack: scored 0, counted under `counter` (or one of several: the limit that stopped it, so it ran
    no longer than that limit allows), nothing left running, `guard` (a file) unchanged."""
    counters = (counter,) if isinstance(counter, str) else counter
    before = dict(reward.metrics())
    snapshot = open(guard, "rb").read() if guard else None
    scores = reward(["p"], [fenced(body)], tests=[TESTS], entry_point=["square"])
    assert scores == [0.0], f"{name}: scored {scores}"
    after = reward.metrics()
    grew = [c for c in counters if after[c] == before[c] + 1]
    assert len(grew) == 1 and after["sandbox/programs"] == before["sandbox/programs"] + 1, \
        f"{name}: not counted as {counter}: {after}"
    deadline = time.monotonic() + 5
    while _program_processes(reward) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _program_processes(reward) == [], f"{name}: processes left running"
    if guard:
        assert open(guard, "rb").read() == snapshot, f"{name}: {guard} changed"
    contained(name)


def test_an_infinite_loop_is_killed_at_the_cpu_limit(reward, contained):
    # On a loaded machine the wall-clock deadline (2 s) can come before 1 CPU second: either limit contains it.
    attack(reward, contained, "infinite loop", "while True:\n    pass", ("sandbox/cpu_limits", "sandbox/timeouts"))


def test_a_sleeping_program_is_killed_at_the_wall_clock_deadline(reward, contained):
    attack(reward, contained, "sleep past the deadline", "import time\ntime.sleep(60)", "sandbox/timeouts")


def test_a_fork_bomb_stops_at_the_process_limit(reward, contained):
    body = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    attack(reward, contained, "fork bomb", body, ("sandbox/timeouts", "sandbox/cpu_limits"))


def test_a_memory_hog_fails_to_allocate(reward, contained):
    attack(reward, contained, "memory hog", "hog = bytearray(4 << 30)", "sandbox/errors")


def test_a_write_outside_the_temp_dir_is_refused(reward, contained, tmp_path):
    victim = os.path.join(ROOT, "pyproject.toml")
    body = (f"open({victim!r}, 'a').write('owned')\n")
    attack(reward, contained, "write into the repository", body, "sandbox/errors", guard=victim)
    for folder in ("/etc", "/usr", "/var/tmp", "/dev/shm", str(tmp_path)):
        path = os.path.join(folder, "tempax-sandbox-probe")
        where = "the test's temporary folder" if folder == str(tmp_path) else folder
        attack(reward, contained, f"write into {where}", f"open({path!r}, 'w').write('x')", "sandbox/errors")
        assert not os.path.exists(path)


def test_the_trainers_files_cannot_be_read(reward, contained):
    """The repository, home and this process's /proc entry are hidden: listing them finds nothing, opening fails."""
    home = os.path.expanduser("~")
    attack(reward, contained, "read the repository", f"open({os.path.join(ROOT, 'pyproject.toml')!r}).read()",
           "sandbox/errors")
    attack(reward, contained, "read this process's environment", f"open('/proc/{os.getpid()}/environ').read()",
           "sandbox/errors")
    seen = reward.sandbox.run(f"import json, os\nls = lambda p: os.listdir(p) if os.path.isdir(p) else []\n"
                              f"print(json.dumps([ls({ROOT!r}), ls({home!r}), ls({sys.prefix!r}), "
                              f"sorted(p for p in os.listdir('/proc') if p.isdigit())]))")
    assert seen.ok, seen.stderr
    repo, home_items, venv, pids = json.loads(seen.stdout)
    assert repo == [] and venv == [] and pids == ["1", "2"]  # only the sandbox's two processes in its /proc
    assert all(item in (".pyenv",) for item in home_items)  # at most the interpreter's install, re-exposed


def test_a_network_connection_fails(reward, contained):
    """A server listens on this machine's loopback; from the sandbox's network namespace it cannot be reached."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []

    def serve():
        server.settimeout(6)
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        body = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')"
        attack(reward, contained, "network connection", body, "sandbox/errors")
        result = reward.sandbox.run(body)
        assert "Network is unreachable" in result.stderr or "Connection refused" in result.stderr
    finally:
        server.close()
        thread.join()
    assert accepted == []


def test_os_system_runs_as_nobody_inside_the_sandbox(reward, contained):
    victim = os.path.join(ROOT, "pyproject.toml")
    body = f"import os, sys\nos.system('echo owned >> {victim}; kill -9 {os.getpid()}')\nsys.exit(1)"
    attack(reward, contained, "os.system", body, "sandbox/errors", guard=victim)


def test_a_huge_print_is_cut_and_killed(reward, contained):
    attack(reward, contained, "huge print", "while True:\n    print('x' * 100000)", "sandbox/output_limits")


def test_a_program_that_closes_its_output_and_hangs(reward, contained):
    attack(reward, contained, "close stdout and hang", "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)",
           "sandbox/timeouts")


def test_a_child_that_outlives_the_program_is_killed(reward, contained):
    """The child leaves the program's session (setsid) and would sleep for a minute; the program exits at once."""
    body = ("import subprocess, sys\nsubprocess.Popen(['sleep', '60'], start_new_session=True, "
            "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\nsys.exit(2)")
    attack(reward, contained, "child outliving the program", body, "sandbox/errors")


def test_the_caller_survives_every_attack(reward):
    """After the attacks this process still runs code and the sandbox still runs an honest program."""
    scores = reward(["p"], ["```python\ndef square(x):\n    return x * x\n```"], tests=[TESTS], entry_point=["square"])
    assert scores == [1.0]
    assert psutil.Process().status() != psutil.STATUS_ZOMBIE and sys.exc_info() == (None, None, None)
