"""The end-to-end tier's shared state: one tempax cache, the runs several cases read, and the cases' wall times.

The cache (TEMPAX_CACHE: the GGUF's tokenizer, its dequantised weights, compiled programs) and the shared runs
live in one folder for the whole test session, shared by pytest-xdist workers (`-n 2`): the first worker to need
a shared run trains it under a file lock, the other reads what it wrote.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from filelock import FileLock

from tests.documented_commands import ROOT
from tests.e2e.cases import (SMALL_TRAIN, TRACEBACK, Case, case_argv, children_cpu_s, fill, read_metrics, run_case,
                             tail, tempax_argv, user_env)


def _session_dir(tmp_path_factory, config) -> str:
    """The folder every worker of the session shares (each xdist worker's base temp is a child of it)."""
    base = tmp_path_factory.getbasetemp()
    return str(base.parent if hasattr(config, "workerinput") else base)


@pytest.fixture(scope="session")
def e2e_dir(tmp_path_factory, pytestconfig) -> str:
    path = os.path.join(_session_dir(tmp_path_factory, pytestconfig), "e2e")
    os.makedirs(path, exist_ok=True)
    return path


@pytest.fixture(scope="session", autouse=True)
def tempax_cache(e2e_dir):
    """One TEMPAX_CACHE for every command of the session (the subprocesses inherit it through `user_env`)."""
    previous = os.environ.get("TEMPAX_CACHE")
    os.environ["TEMPAX_CACHE"] = os.path.join(e2e_dir, "cache")
    yield os.environ["TEMPAX_CACHE"]
    if previous is not None:
        os.environ["TEMPAX_CACHE"] = previous


@pytest.fixture
def record(request):
    """record(wall_s, cpu_s, what=""): a command's wall and CPU seconds, printed in the session's summary (CPU
    seconds are the figure that holds on a machine shared with other work)."""
    def _record(wall_s: float, cpu_s: float, what: str = "") -> None:
        request.node.user_properties.append(("wall_s", (what, round(wall_s, 1), round(cpu_s, 1))))
    return _record


def pytest_terminal_summary(terminalreporter):
    rows = []
    for outcome in ("passed", "failed"):
        for report in terminalreporter.stats.get(outcome, []):
            if report.when != "call":
                continue
            for key, (what, wall, cpu) in report.user_properties:
                if key == "wall_s":
                    name = report.nodeid.split("::", 1)[-1] + (f" [{what}]" if what else "")
                    rows.append((wall, cpu, outcome, name))
    if rows:
        terminalreporter.section("e2e commands: wall s, CPU s")
        for wall, cpu, outcome, name in sorted(rows, reverse=True):
            terminalreporter.write_line(f"{wall:7.1f} {cpu:7.1f}  {outcome:6}  {name}")
        terminalreporter.write_line(f"{sum(r[0] for r in rows):7.1f} {sum(r[1] for r in rows):7.1f}  total")


def _shared(e2e_dir: str, name: str, build):
    """`build(folder)`'s JSON result, built once per session across workers."""
    folder = os.path.join(e2e_dir, name)
    result = os.path.join(e2e_dir, f"{name}.json")
    with FileLock(os.path.join(e2e_dir, f"{name}.lock")):
        if not os.path.exists(result):
            os.makedirs(folder, exist_ok=True)
            data = build(folder)
            with open(result, "w") as f:
                json.dump(data, f)
    with open(result) as f:
        data = json.load(f)
    if "error" in data:
        pytest.fail(f"the shared run {name} failed: {data['error']}")
    return data


def _popen(argv, env, log_path):
    log = open(log_path, "w")
    return subprocess.Popen(tempax_argv() + argv, cwd=ROOT, env=user_env(env), stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True), log


def wait_for_step(run_dir: str, process: subprocess.Popen, step: int, timeout: float) -> None:
    """Until metrics.jsonl holds the record of optimizer step `step` (or the process ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if any(r.get("step", 0) >= step and "loss" in r for r in read_metrics(run_dir)):
                return
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.2)


def _finish(process: subprocess.Popen, log, start: float, cpu: float, timeout: float) -> dict:
    rc = process.wait(timeout=timeout)
    log.close()
    return {"rc": rc, "output": open(log.name).read(), "wall_s": time.monotonic() - start,
            "cpu_s": children_cpu_s() - cpu}


def interrupted_then_resumed(folder: str, argv: list[str], env: dict, signum: int, at_step: int) -> dict:
    """Runs argv, sends `signum` once step `at_step` is logged, waits, then runs the same argv again to its end."""
    run_dir = next(a for a in argv if a.startswith("train.run_dir=")).split("=", 1)[1]
    start, cpu = time.monotonic(), children_cpu_s()
    first, log = _popen(argv, env, os.path.join(folder, "first.log"))
    wait_for_step(run_dir, first, at_step, timeout=540)
    sent = first.poll() is None
    if sent:
        first.send_signal(signum)
    out = {"run_dir": run_dir, "signal_sent": sent, "first": _finish(first, log, start, cpu, 300)}
    start, cpu = time.monotonic(), children_cpu_s()
    second, log = _popen(argv, env, os.path.join(folder, "second.log"))
    out["second"] = _finish(second, log, start, cpu, 540)
    return out


# The guides' `runs/sft`: trackers.md's LoRA SFT with TensorBoard, W&B (offline) and MLflow (a SQLite file), stopped
# by SIGTERM after its first step and run again, so that it resumes (robustness.md, running-commands.md), on the
# README quick start's own JSONL of chat rows (`my_chats.jsonl`: messages only, written by the fixture). Its run
# dir is the RUN_DIR / SOURCE of plot, export, eval, serve and rft's WARM_START_DIR.
SFT_CASE = Case(
    ("tempax sft --config recipes/sft_lora_smollm2.yaml",
     "tempax sft --config recipes/sft_lora_smollm2.yaml data.path=my_chats.jsonl train.run_dir=runs/my_sft",
     "tempax sft --config recipes/sft_lora_smollm2.yaml train.report_to=[tensorboard,wandb,mlflow]",
     "WANDB_MODE=offline tempax sft --config recipes/sft_lora_smollm2.yaml 'train.report_to=[wandb]'",
     "MLFLOW_TRACKING_URI=sqlite:///runs/mlflow.db tempax sft --config recipes/sft_lora_smollm2.yaml 'train.report_to=[mlflow]'"),
    f"sft --config recipes/sft_lora_smollm2.yaml data.path={{tmp}}/my_chats.jsonl "
    f"train.report_to=[tensorboard,wandb,mlflow] {SMALL_TRAIN} data.max_rows=24 "
    "train.eval_at_start=false train.checkpoint.every=0",
    steps=4, env={"WANDB_MODE": "offline", "MLFLOW_TRACKING_URI": "sqlite:///{tmp}/mlflow.db"},
    name="sft-sigterm-resume-trackers")

REWARD_MODEL_CASE = Case(
    "tempax reward-model --config recipes/reward_model_smollm2_lora.yaml",
    f"reward-model --config recipes/reward_model_smollm2_lora.yaml {SMALL_TRAIN} data.max_rows=8 data.max_eval_rows=4",
    steps=2, files=("{run}/reward_model",))


def write_my_chats(path: str, rows: int) -> None:
    """A user's own chat JSONL as the README's quick start describes it: `{"messages": [...]}` rows and nothing
    else (the shipped hh-rlhf-sft rows' conversations, without their source columns)."""
    with open(os.path.join(ROOT, "..", "shared", "data", "hh-rlhf-sft", "train.jsonl")) as f, open(path, "w") as out:
        for _, line in zip(range(rows), f):
            out.write(json.dumps({"messages": json.loads(line)["messages"]}) + "\n")


@pytest.fixture(scope="session")
def sft_run(e2e_dir) -> dict:
    def build(folder):
        values = {"tmp": folder, "run": os.path.join(folder, "run")}
        write_my_chats(os.path.join(folder, "my_chats.jsonl"), rows=24)
        env = {k: fill(v, values) for k, v in SFT_CASE.env.items()}
        out = interrupted_then_resumed(folder, case_argv(SFT_CASE, values), env, signal.SIGTERM, 1)
        out["env"] = env
        if out["second"]["rc"] != 0 or TRACEBACK in out["second"]["output"]:
            out["error"] = f"the resumed run exited {out['second']['rc']}:\n{tail(out['second']['output'])}"
        return out
    return _shared(e2e_dir, "sft", build)


@pytest.fixture(scope="session")
def reward_model_run(e2e_dir) -> dict:
    def build(folder):
        values = {"tmp": folder, "run": os.path.join(folder, "run")}
        try:
            result = run_case(REWARD_MODEL_CASE, values)
        except AssertionError as e:
            return {"error": str(e)}
        return {"run_dir": values["run"], "wall_s": result.wall_s, "cpu_s": result.cpu_s}
    return _shared(e2e_dir, "reward_model", build)
