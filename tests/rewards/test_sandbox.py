"""The sandbox's mechanics: a program's output and exit status come back, limits are config fields checked when
read, a batch runs in parallel in order, output is bounded, and a kernel without a network namespace is refused
(or warned about once when the user allows it). The attacks themselves: tests/faults/test_sandbox_attacks.py."""

from __future__ import annotations

import threading

import pytest

from tempax.configlib import from_dict
from tempax.errors import ConfigError
from tempax.rewards import sandbox as sandbox_module
from tempax.rewards.sandbox import Sandbox, SandboxConfig, SandboxUnavailable, describe_isolation


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxConfig(timeout_s=3.0, max_output_bytes=1000))


def test_output_and_exit_status_come_back(sandbox):
    result = sandbox.run("import sys\nprint(sum(range(10)))\nprint('oops', file=sys.stderr)\nsys.exit(3)")
    assert (result.stdout, result.stderr, result.status, result.exit_code) == ("45\n", "oops\n", "exited", 3)
    assert not result.ok and result.describe() == "exit status 3"
    assert sandbox.run("print('fine')").ok


def test_the_program_works_in_its_own_empty_tmp_as_an_unprivileged_uid(sandbox):
    result = sandbox.run("import os\nopen('note.txt', 'w').write('kept')\n"
                         "print(os.getcwd(), os.getuid() >= 200000, sorted(os.listdir('.')), open('note.txt').read())")
    assert result.stdout.split() == ["/tmp", "True", "['main.py',", "'note.txt']", "kept"]
    # A fresh tmpfs each time: the last program's file is gone.
    assert sandbox.run("import os\nprint(sorted(os.listdir('.')))").stdout == "['main.py']\n"


def test_output_past_the_bound_is_cut_and_the_program_killed(sandbox):
    """The program is killed when its output passes the bound, not at the 3 s deadline nor after its 30 s sleep:
    a run is killed for one reason, the first that comes (status output_limit, not timeout)."""
    result = sandbox.run("print('x' * 5000)\nimport time\ntime.sleep(30)")
    assert result.status == "output_limit" and result.truncated
    assert len(result.stdout) == 1000


def test_a_batch_runs_in_parallel_and_in_order():
    """Two workers, four programs sleeping 1 s each: the programs run two at a time (each pair meets at a barrier
    of two before its programs start, which one at a time never passes); results in the order given."""
    box = Sandbox(SandboxConfig(workers=2, timeout_s=10.0))
    box.run("pass")
    both_running = threading.Barrier(2)
    run_one = box.run

    def run_in_pairs(source: str):
        both_running.wait(timeout=60)  # BrokenBarrierError when no second program is in flight beside this one
        return run_one(source)

    box.run = run_in_pairs
    results = box.run_many([f"import time\ntime.sleep(1)\nprint({i})" for i in range(4)])
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n", "3\n"]
    assert box.counters.programs == 5 and box.counters.exited_ok == 5


def test_limits_are_config_fields_checked_when_read():
    cfg = from_dict(SandboxConfig, {"timeout_s": 2.5, "memory_mb": 128, "allow_network_check": False})
    assert (cfg.timeout_s, cfg.memory_mb, cfg.allow_network_check) == (2.5, 128, False)
    with pytest.raises(ConfigError, match="sandbox.cpu_seconds must be > 0"):
        SandboxConfig(cpu_seconds=0)
    with pytest.raises(ConfigError, match="sandbox.workers must be in 1..32"):
        SandboxConfig(workers=64)
    with pytest.raises(ConfigError, match="system uid"):
        SandboxConfig(uid_base=0)


def test_this_kernel_gives_every_isolation():
    """Root on Linux here: every namespace, the read-only remount and the uid drop are applied, nothing missing."""
    found = describe_isolation()
    applied = found["applied"]
    assert found["result"] == "exit status 0" and found["missing"] == []
    assert all(applied[n] for n in ("network", "mount", "pid", "ipc", "uts", "read_only_root", "uid"))


def test_no_network_namespace_is_refused_unless_allowed(monkeypatch, capsys):
    """A kernel without network namespaces, imitated by not asking for one: refused with the key to set, and run
    with one warning (said once) when allow_network_check is false."""
    monkeypatch.setattr(sandbox_module, "NAMESPACES", ("mount", "pid", "ipc", "uts"))
    monkeypatch.setattr(sandbox_module, "_WARNED", set())
    with pytest.raises(SandboxUnavailable, match="sandbox.allow_network_check=false"):
        Sandbox(SandboxConfig()).run("pass")
    box = Sandbox(SandboxConfig(allow_network_check=False))
    with pytest.warns(RuntimeWarning, match="no network namespace"):
        assert box.run("print(1)").ok
    assert box.run("print(2)").ok  # no second warning (pytest.warns is not active: a warning would pass silently)
    assert capsys.readouterr().err.count("no network namespace") == 1
