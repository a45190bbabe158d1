"""One run over two hosts that share nothing but a network and a storage folder (`tests/kit/hosts.py`).

Host A (169.254.77.1) runs process 0, which serves the coordinator; host B (169.254.77.2) runs process 1. Each
process has 2 XLA host devices, so the mesh has 4, and every process is started the way a plain two-machine
deployment starts it: the `tempax` command with `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`,
`JAX_PROCESS_ID` (docs/multi-host.md). The run dir is on the shared storage; each host's compilation cache is on
its own disk. Losses are compared with the same recipe run in this process on 4 of its 8 host devices (rtol 1e-5,
as in tests/parallel/test_multiprocess.py: only the summation order across processes may differ).

A lost host is host B's processes SIGKILLed during a step or during an asynchronous checkpoint write: process 0
must stop within the heartbeat timeout plus a margin, with one line naming process 1 and its host, exit status 5
(`tempax.parallel.peers.EXIT_PROCESS_LOST`), and leave the newest intact checkpoint, from which host A alone
resumes (4 devices in one process: the checkpoint is resharded) with the uninterrupted run's losses.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
import yaml
from numpy.testing import assert_allclose

from tempax.algorithms.sft.main import SFTConfig, main
from tempax.configlib import from_dict
from tempax.parallel.peers import EXIT_PROCESS_LOST
from tempax.train.metrics import read_metrics
from tests.kit.hosts import ADDRESS_A, skip_reason, two_hosts
from tests.kit.tokenizers import DIALOGUES, tiny_chat_tokenizer

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PORT = 8476  # inside host A's own namespace: nothing else listens there
RUN_TIMEOUT_S = 240
HEARTBEAT_S = 10
LOST_WITHIN_S = HEARTBEAT_S + 20  # how long host A may take to stop (a hang guard): detection, the line, the exit
REFERENCE_STEPS = 6

MESHES = {"fsdp": {"fsdp": 4}, "data": {"data": 4}}


@pytest.fixture
def hosts(tmp_path):
    reason = skip_reason()
    if reason:
        pytest.skip(f"two hosts on one machine: {reason}")
    with two_hosts(tmp_path / "hosts") as made:
        yield made


def _files(folder) -> None:
    tiny_chat_tokenizer().hf.save_pretrained(folder / "tok")
    with open(folder / "train.jsonl", "w") as f:
        for i in range(24):
            f.write(json.dumps({"messages": DIALOGUES[i % 4]}) + "\n")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("two_hosts_files")
    _files(folder)
    return folder


def _sft_raw(files, run_dir, *, mesh: str = "fsdp", steps: int = 3, **train) -> dict:
    return {
        "model": {"source": "preset:tiny-llama", "tokenizer": str(files / "tok"),
                  "overrides": {"vocab_size": 400, "num_layers": 2}},
        "data": {"path": str(files / "train.jsonl")},
        "train": {"steps": steps, "batch_size": 8, "seq_len": 32, "progress_bar": False, "tensorboard": False,
                  "run_dir": str(run_dir),
                  "mesh": {**MESHES[mesh], "num_devices": 4, "init_timeout_s": 60,
                           "heartbeat_timeout_s": HEARTBEAT_S, "shutdown_timeout_s": 60},
                  "optimizer": {"learning_rate": 1e-2, "schedule": "constant", "weight_decay": 0.0},
                  "checkpoint": {"every": 1, "keep": 100, "save_at_end": True, "async_save": False}, **train},
    }


class _Reference(dict):
    """The uninterrupted one-process losses on 4 devices of a mesh, computed when first asked for."""

    def __init__(self, files, folder_factory):
        super().__init__()
        self.files, self.folder_factory = files, folder_factory

    def __missing__(self, mesh: str) -> list[float]:
        raw = _sft_raw(self.files, self.folder_factory(f"one_{mesh}"), mesh=mesh, steps=REFERENCE_STEPS)
        self[mesh] = main(from_dict(SFTConfig, raw), log=lambda _: None).losses
        return self[mesh]


@pytest.fixture(scope="module")
def reference(files, tmp_path_factory):
    return _Reference(files, tmp_path_factory.mktemp)


def _host_env(hosts, host, *, process_id: int | None, devices: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env.update(PYTHONPATH=REPO, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               TEMPAX_CACHE=str(hosts.local / "tempax_cache"))  # each host's caches on its own disk
    if process_id is not None:
        env.update(JAX_COORDINATOR_ADDRESS=f"{ADDRESS_A}:{PORT}", JAX_NUM_PROCESSES="2",
                   JAX_PROCESS_ID=str(process_id), JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
    return env


def _recipe(hosts, name: str, raw: dict) -> str:
    path = hosts.shared / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _tempax(*args: str) -> list[str]:
    return [sys.executable, "-m", "tempax.cli.main", *args]


def _start_pair(hosts, recipe: str, *, b_argv: list[str] | None = None):
    a = hosts.a.start(_tempax("sft", "--config", recipe), env=_host_env(hosts, hosts.a, process_id=0, devices=2),
                      name="process0", cwd=REPO)
    b = hosts.b.start(b_argv or _tempax("sft", "--config", recipe),
                      env=_host_env(hosts, hosts.b, process_id=1, devices=2), name="process1", cwd=REPO)
    return a, b


def _losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(str(run_dir)) if "loss" in r}


def _resume_on_host_a(hosts, raw: dict, steps: int) -> None:
    """Host A alone, one process with 4 devices, from the run dir's newest intact checkpoint."""
    raw = {**raw, "train": {**raw["train"], "steps": steps}}
    solo = hosts.a.start(_tempax("sft", "--config", _recipe(hosts, "solo", raw)),
                         env=_host_env(hosts, hosts.a, process_id=None, devices=4), name="solo", cwd=REPO)
    assert solo.wait(timeout=RUN_TIMEOUT_S) == 0, hosts.output()


@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_sft_across_two_hosts_equals_one_process_and_resumes_resharded_on_one(hosts, files, reference, mesh):
    """3 steps over the two hosts, a checkpoint each step on the shared storage with both hosts' shards, then
    host A alone (1 process, 4 devices) resumes from checkpoint 3 for steps 4 and 5. Every loss equals the
    one-process run's; only process 0 wrote the run's files; nothing was written to either host's local run
    dir path."""
    run_dir = hosts.shared / "run"
    raw = _sft_raw(files, run_dir, mesh=mesh)
    a, b = _start_pair(hosts, _recipe(hosts, "pair", raw))
    assert a.wait(timeout=RUN_TIMEOUT_S) == 0 and b.wait(timeout=60) == 0, hosts.output()
    two = _losses(run_dir)
    assert sorted(two) == [1, 2, 3], two
    assert_allclose([two[s] for s in (1, 2, 3)], reference[mesh][:3], rtol=1e-5)
    assert sorted(int(d) for d in os.listdir(run_dir / "checkpoints") if d.isdigit()) == [1, 2, 3]
    _resume_on_host_a(hosts, raw, steps=5)
    resumed = _losses(run_dir)
    assert_allclose([resumed[4], resumed[5]], reference[mesh][3:5], rtol=1e-5)
    with open(run_dir / "metrics.jsonl") as f:
        assert sum(json.loads(line)["step"] == 1 for line in f if line.strip()) == 1  # one writer


def _newest_checkpoint(run_dir) -> int:
    return max(int(d) for d in os.listdir(run_dir / "checkpoints") if d.isdigit())


@pytest.mark.parametrize("fault", ["kill_step", "kill_save"])
def test_host_b_lost_stops_host_a_with_one_line_and_resumes_on_one_host(hosts, files, reference, fault):
    """Host B's process is SIGKILLed at step 4 (dispatched, not finished) or right after checkpoint 4's
    asynchronous write started, then every process left on host B is killed. Process 0 on host A stops through
    tempax's own peer check (`tempax.parallel.peers`, its heartbeat timeout, not JAX's): exit status 5 and one
    line naming process 1 and host B's name and address; no traceback, no fatal check from JAX's C++ (what JAX's
    own detection ends in). The newest intact checkpoint (3 or 4: whatever was
    committed) is where host A alone resumes, with the uninterrupted run's next two losses.

    The previous code (before `tempax.parallel.peers`): status 134 after a Python traceback of
    "Gloo AllGather failed ... Connection reset by peer" and JAX's "Terminating process because the JAX
    distributed service detected fatal errors", 77 s after the kill with JAX's default 100 s heartbeat."""
    run_dir = hosts.shared / "run"
    raw = _sft_raw(files, run_dir, steps=400, checkpoint={"every": 1, "keep": 400, "save_at_end": False,
                                                           "async_save": fault == "kill_save"})
    recipe = _recipe(hosts, "pair", raw)
    b_argv = [sys.executable, "-m", "tests.kit.host_faults", fault, "4", "--", "sft", "--config", recipe]
    a, b = _start_pair(hosts, recipe, b_argv=b_argv)
    b.wait(timeout=RUN_TIMEOUT_S)
    hosts.b.kill_all()
    status = a.wait(timeout=LOST_WITHIN_S + 60)
    err = a.stderr()
    lines = [line for line in err.splitlines() if "lost process" in line]
    assert status == EXIT_PROCESS_LOST and len(lines) == 1, f"status {status}, lines {lines}\n{hosts.output()}"
    assert f"process 1 of 2 (host {hosts.b.hostname}, {hosts.b.address})" in lines[0], lines
    assert "Traceback" not in err and "Check failure" not in err, err[-3000:]
    k = _newest_checkpoint(run_dir)
    assert k in (3, 4), os.listdir(run_dir / "checkpoints")
    _resume_on_host_a(hosts, raw, steps=k + 2)
    resumed = _losses(run_dir)
    assert_allclose([resumed[k + 1], resumed[k + 2]], reference["fsdp"][k:k + 2], rtol=1e-5)


def test_unreachable_coordinator_is_one_line_naming_the_address_and_the_timeout(hosts, files):
    """Process 1 on host B with nobody serving the coordinator on host A: exit status 2 through tempax's own
    initialisation timeout (5 s, named in the one line with the address; JAX's fatal check would be status 134).

    The previous code: JAX's fatal check after about 16 s ("Terminating process because the JAX distributed service
    detected fatal errors ... DEADLINE_EXCEEDED ... RegisterTask"), status 134, and a C++ stack trace."""
    raw = _sft_raw(files, hosts.shared / "run")
    raw["train"]["mesh"]["init_timeout_s"] = 5
    b = hosts.b.start(_tempax("sft", "--config", _recipe(hosts, "alone", raw)),
                      env=_host_env(hosts, hosts.b, process_id=1, devices=2), name="process1", cwd=REPO)
    status = b.wait(timeout=120)
    err = b.stderr().strip()
    assert status == 2 and len(err.splitlines()) == 1, f"status {status}:\n{err}"
    assert f"{ADDRESS_A}:{PORT}" in err and "5 s" in err and "train.mesh.init_timeout_s" in err, err


def _ray(hosts, host, name: str, *args: str, env: dict[str, str]):
    started = host.start([os.path.join(os.path.dirname(sys.executable), "ray"), "start", *args,
                          "--node-ip-address", host.address, "--num-cpus", "1", "--disable-usage-stats",
                          "--temp-dir", str(host.scratch)], env=env, name=name)
    assert started.wait(timeout=180) == 0, hosts.output()


def _rollout_workers(host) -> list[int]:
    """The Ray rollout-worker actor processes running on `host`."""
    found = []
    for pid in host.pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"RolloutWorker" in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def _wait_until(condition, timeout_s: float, what: str, hosts) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout_s:g} s\n{hosts.output()}"
        time.sleep(0.5)


def test_async_grpo_with_its_rollout_worker_on_host_b_finishes_on_a_replacement_node(hosts, files):
    """A Ray head on host A, a Ray node on host B offering the custom resource `rollout_host`; `tempax grpo` on
    host A with one rollout worker (`grpo.workers=1`, `ray.address`, `ray.worker_resource=rollout_host`), so the
    worker runs on host B and the adapters travel over the network to it at every step. Once step 2 is logged,
    every process of host B (the Ray node and the worker) is SIGKILLed and a new Ray node is started there: the
    worker is replaced on the new node and the run finishes all 6 steps (async/worker_restarts >= 1)."""
    token_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": os.urandom(32).hex(), "RAY_USAGE_STATS_ENABLED": "0"}
    env_a = {**_host_env(hosts, hosts.a, process_id=None, devices=1), **token_env}
    env_b = {**_host_env(hosts, hosts.b, process_id=None, devices=1), **token_env}
    head = f"{hosts.a.address}:6379"
    _ray(hosts, hosts.a, "ray-head", "--head", "--port", "6379", "--include-dashboard", "false", env=env_a)
    _ray(hosts, hosts.b, "ray-node", "--address", head, "--resources", '{"rollout_host": 1}', env=env_b)
    run_dir = hosts.shared / "grpo"
    base = _sft_raw(files, run_dir, steps=6, batch_size=2, check_memory=False)
    base["train"].pop("seq_len")
    base["train"]["mesh"] = {}
    raw = {"model": base["model"], "lora": {"rank": 2, "alpha": 4.0},
           "task": {"name": "arithmetic", "num_train_problems": 8},
           "grpo": {"group_size": 2, "max_new_tokens": 4, "beta": 0.0, "workers": 1, "max_staleness": 1},
           "ray": {"address": head, "worker_resource": "rollout_host", "timeout_s": 240},
           "eval": {"before": False, "after": False}, "train": base["train"]}
    trainer = hosts.a.start(_tempax("grpo", "--config", _recipe(hosts, "grpo", raw)), env=env_a, name="grpo",
                            cwd=REPO)
    _wait_until(lambda: _rollout_workers(hosts.b), RUN_TIMEOUT_S, "a rollout worker on host B", hosts)
    assert not _rollout_workers(hosts.a), "the rollout worker must run on host B only"
    _wait_until(lambda: 2 in _losses_or_steps(run_dir), RUN_TIMEOUT_S, "step 2", hosts)
    hosts.b.kill_all()
    _ray(hosts, hosts.b, "ray-replacement", "--address", head, "--resources", '{"rollout_host": 1}', env=env_b)
    assert trainer.wait(timeout=RUN_TIMEOUT_S + 240) == 0, hosts.output()
    records = read_metrics(str(run_dir))
    steps = [r["step"] for r in records if "async/worker_restarts" in r]
    assert steps == [1, 2, 3, 4, 5, 6], steps
    # one replacement per request the dead worker held; the only `rollout_host` left is the new node on host B
    assert records[-1]["async/worker_restarts"] >= 1.0, records[-1]


def _losses_or_steps(run_dir) -> set[int]:
    if not os.path.isfile(run_dir / "metrics.jsonl"):
        return set()
    return {r["step"] for r in read_metrics(str(run_dir))}
