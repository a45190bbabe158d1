"""The launcher of `tempax launch`: the environment each process gets, that one failing or hanging process ends the
run, and that only process 0 prints (the command itself: tests/cli/test_launch.py)."""

from __future__ import annotations

import os
import sys

from tempax.parallel.launch import command_argv, launch, process_env


def test_each_process_gets_jax_coordinator_settings_and_its_device_count():
    env = process_env({"XLA_FLAGS": "--xla_foo=1 --xla_force_host_platform_device_count=8"},
                      coordinator="127.0.0.1:1234", nproc=2, index=1, devices_per_process=2)
    assert env["JAX_COORDINATOR_ADDRESS"] == "127.0.0.1:1234"
    assert (env["JAX_NUM_PROCESSES"], env["JAX_PROCESS_ID"]) == ("2", "1")
    assert env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] == "gloo"
    assert env["XLA_FLAGS"] == "--xla_foo=1 --xla_force_host_platform_device_count=2"
    assert command_argv(["tempax", "sft", "-c", "r.yaml"]) == [sys.executable, "-m", "tempax.cli.main", "sft",
                                                               "-c", "r.yaml"]


# Each process writes its pid (atomically), then sleeps 60 s and marks that it reached its end; with `fail`,
# process 1 waits until process 0 has started and exits with status 3.
SLEEPER = """
import os, sys, time
marks, fail, me = sys.argv[1], sys.argv[2] == "fail", os.environ["JAX_PROCESS_ID"]
with open(os.path.join(marks, f"pid{me}.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(marks, f"pid{me}.tmp"), os.path.join(marks, f"pid{me}"))
if fail and me == "1":
    while not os.path.exists(os.path.join(marks, "pid0")):
        time.sleep(0.01)
    sys.exit(3)
time.sleep(60)
open(os.path.join(marks, f"finished{me}"), "w").close()
"""


def stopped(marks, index: int) -> bool:
    """Process `index` was stopped before its sleep ended: it is no longer running and never marked its end."""
    if (marks / f"finished{index}").exists():
        return False
    pid_file = marks / f"pid{index}"
    if not pid_file.exists():
        return True  # stopped before it wrote its pid
    try:
        os.kill(int(pid_file.read_text()), 0)
    except ProcessLookupError:
        return True
    return False


def test_a_failing_process_stops_the_others_and_gives_its_status(tmp_path):
    """Process 1 exits with status 3 once process 0 has started; process 0 would sleep 60 s: the launcher
    returns 3 with process 0 stopped (gone, its sleep never ended), not after waiting for it."""
    assert launch([sys.executable, "-c", SLEEPER, str(tmp_path), "fail"], nproc=2, grace=2.0) == 3
    assert stopped(tmp_path, 0)


def test_timeout_stops_a_hung_run_with_status_124(tmp_path):
    """Both processes would sleep 60 s; past the 1 s timeout the launcher stops both and returns 124."""
    assert launch([sys.executable, "-c", SLEEPER, str(tmp_path), "hang"], nproc=2, timeout=1.0, grace=2.0) == 124
    assert stopped(tmp_path, 0) and stopped(tmp_path, 1)


def test_all_processes_succeeding_is_status_0():
    assert launch([sys.executable, "-c", "pass"], nproc=2) == 0


def test_process_0_prints_and_the_others_only_warn_behind_their_rank(capfd):
    """Two processes each print an info line to stdout and stderr and raise one warning, as a `tempax` command
    does: the info lines appear once (process 0's), the warning twice, process 1's behind its rank."""
    script = ("import sys, warnings\n"
              "from tempax.runtime.process import quiet_unless_first_process\n"
              "quiet_unless_first_process()\n"
              "print('a table on stdout')\n"
              "print('resumed from step 3', file=sys.stderr)\n"
              "warnings.warn('careful with that axe')\n")
    capfd.readouterr()
    assert launch([sys.executable, "-c", script], nproc=2) == 0
    out, err = capfd.readouterr()
    assert out.count("a table on stdout") == 1 and err.count("resumed from step 3") == 1
    warned = [line for line in err.splitlines() if "UserWarning: careful with that axe" in line]
    assert len(warned) == 2 and sum(line.startswith("[process 1] ") for line in warned) == 1, err
    assert not any(line.startswith("[process 1] ") for line in err.splitlines() if "resumed" in line)
