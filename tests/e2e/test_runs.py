"""The documented commands whose promise is about a running process: a SIGTERM'd run that resumes, the trackers it
reported to, Ray rollout workers (one killed mid-run), and `tempax serve` answering the `openai` client."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.e2e.cases import TRACEBACK, Case, case_argv, check_training, children_cpu_s, read_metrics, run_case, tail
from tests.e2e.conftest import REWARD_MODEL_CASE, SFT_CASE, _finish, _popen, wait_for_step
from tests.e2e.test_commands import GRPO_SMALL, values_for

pytestmark = pytest.mark.e2e

ASYNC_RL = "tempax grpo --config recipes/grpo_gsm8k_smollm2.yaml grpo.workers=1 grpo.max_staleness=1"
# Every step logs these; `async/sync_bytes` only steps that publish new weights first (step 1's went with the
# workers' start), so the Ray tests check it from step 2 on.
ASYNC_METRICS = ("loss", "async/staleness", "async/wait_s")
RAY_CASES = [
    Case(ASYNC_RL, f"grpo --config recipes/grpo_gsm8k_smollm2.yaml grpo.workers=1 grpo.max_staleness=1 {GRPO_SMALL}",
         steps=2, metrics=ASYNC_METRICS),
]
# Two workers at staleness 0 (each step waits for rollouts of the weights it just published), one of them killed
# after step 1: the tier's one run with two workers, so the restart is exercised where no stale rollout can cover
# for the lost one.
KILLED_WORKER = Case((), f"grpo --config recipes/grpo_gsm8k_smollm2.yaml grpo.workers=2 grpo.max_staleness=0 "
                         f"{GRPO_SMALL}", steps=3, metrics=ASYNC_METRICS, name="grpo-2-workers-staleness-0-one-killed")
# One server for both documented lines: a run dir goes through the same loader as a registered name once its
# newest checkpoint is merged (the registered name itself is taken by the generate, chat and export cases).
SERVE_CASES = [
    Case(("tempax serve SOURCE --port 8000", "tempax serve smollm2-135m-instruct --port 8000"), "serve {sft} --port 0"),
]


def test_sft_sigterm_then_resume(sft_run, record):
    """SIGTERM after step 1: exit 143 with the step's checkpoint; the same command again resumes and finishes."""
    first, second = sft_run["first"], sft_run["second"]
    record(first["wall_s"], first["cpu_s"], "until SIGTERM")
    record(second["wall_s"], second["cpu_s"], "resumed")
    assert sft_run["signal_sent"], f"the run ended before its first step was logged:\n{tail(first['output'])}"
    assert first["rc"] == 143 and TRACEBACK not in first["output"], tail(first["output"])
    stopped = [r for r in read_metrics(sft_run["run_dir"]) if r.get("event") == "stop"]
    assert stopped and stopped[0]["stop_reason"] == "SIGTERM", "no SIGTERM `stop` event in metrics.jsonl"
    resumed = re.search(r"resumed from \S+ \(step (\d+)\)", second["output"])
    assert resumed and 1 <= int(resumed.group(1)) < SFT_CASE.steps, tail(second["output"])
    check_training(sft_run["run_dir"], second["output"], SFT_CASE.steps, SFT_CASE.metrics)


def test_trackers_hold_the_resumed_run(sft_run):
    """trackers.md: one W&B (offline) run and one MLflow run across the stop and the resume, read back through the
    libraries' own readers, with metrics.jsonl's losses at their steps."""
    from mlflow.tracking import MlflowClient

    run_dir = sft_run["run_dir"]
    losses = {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}
    assert glob.glob(os.path.join(run_dir, "tb", "*tfevents*")), "no TensorBoard event file"
    ids = json.load(open(os.path.join(run_dir, "trackers.json")))
    offline = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*"))
    assert len(offline) >= 1 and all(ids["wandb"] in path for path in offline), (offline, ids)
    wandb_losses = {}
    for path in offline:
        printed = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", path],
                                 capture_output=True, text=True, timeout=120)
        assert printed.returncode == 0, printed.stderr[-2000:]
        for line in printed.stdout.splitlines():
            row = json.loads(line) if line.strip().startswith("{") else {}
            history = (row.get("history") or {}).get("item", {})  # {"type": "history", "history": {"item": ..}}
            if "loss" in history and "_step" in history:
                wandb_losses[int(history["_step"])] = history["loss"]
    assert wandb_losses and all(wandb_losses[s] == pytest.approx(losses[s]) for s in wandb_losses), (wandb_losses, losses)
    client = MlflowClient(tracking_uri=sft_run["env"]["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("tempax")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [ids["mlflow"]["run_id"]]
    history = {m.step: m.value for m in client.get_metric_history(runs[0].info.run_id, "loss")}
    assert history == pytest.approx(losses), (history, losses)


def test_reward_model_recipe(reward_model_run, record):
    record(reward_model_run["wall_s"], reward_model_run["cpu_s"])


@pytest.mark.parametrize("case", RAY_CASES, ids=[c.id for c in RAY_CASES])
def test_ray_rollout_workers(case, tmp_path, request, record):
    values = values_for(case, tmp_path, request)
    run_case(case, values, record)
    assert_weights_published(values["run"], case.steps)


def assert_weights_published(run_dir: str, steps: int) -> None:
    """Every step after the first sent the workers the adapters the previous step trained."""
    published = {r["step"] for r in read_metrics(run_dir) if r.get("async/sync_bytes", 0) > 0}
    assert published == set(range(2, steps + 1)), sorted(published)


def rollout_workers(pid: int) -> list[psutil.Process]:
    """The Ray actor processes of the rollout workers under `pid`. A process a worker forks carries the worker's
    process title until it execs, so only those whose parent is not a worker count."""
    def is_worker(process: psutil.Process) -> bool:
        return "RolloutWorker" in " ".join(process.cmdline())

    out = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            parent = child.parent()
            if is_worker(child) and not (parent is not None and is_worker(parent)):
                out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out


def test_ray_worker_killed_mid_run(tmp_path, request, record):
    """docs/async-rl.md, faults: a worker whose process dies is replaced, its requests issued again, and the run
    finishes; the restart is counted in metrics.jsonl."""
    values = values_for(KILLED_WORKER, tmp_path, request)
    start, cpu = time.monotonic(), children_cpu_s()
    process, log = _popen(case_argv(KILLED_WORKER, values), {}, str(tmp_path / "log"))
    wait_for_step(values["run"], process, 1, timeout=540)
    workers = rollout_workers(process.pid)
    assert process.poll() is None and len(workers) == 2, (workers, tail(open(log.name).read()))
    os.kill(workers[0].pid, signal.SIGKILL)
    done = _finish(process, log, start, cpu, 540)
    record(done["wall_s"], done["cpu_s"])
    assert done["rc"] == 0 and TRACEBACK not in done["output"], tail(done["output"])
    records = check_training(values["run"], done["output"], KILLED_WORKER.steps, KILLED_WORKER.metrics)
    assert max(r.get("async/worker_restarts", 0) for r in records) >= 1, [r for r in records if "loss" in r][-1]
    assert_weights_published(values["run"], KILLED_WORKER.steps)


@pytest.mark.parametrize("case", SERVE_CASES, ids=[c.id for c in SERVE_CASES])
def test_serve_answers_the_openai_client(case, tmp_path, request, record):
    """docs/serving.md: chat (plain and streamed) and completions through `openai.OpenAI(base_url=...)`; Ctrl-C
    stops the server without a traceback."""
    import openai

    values = values_for(case, tmp_path, request)
    start, cpu = time.monotonic(), children_cpu_s()
    process, log = _popen(case_argv(case, values), {}, str(tmp_path / "log"))
    try:
        deadline, found = time.monotonic() + 540, None
        while time.monotonic() < deadline and process.poll() is None and not found:
            found = re.search(r"serving (\S+) on (http://\S+/v1)", open(log.name).read())
            time.sleep(0.2)
        assert found, tail(open(log.name).read())
        name, base_url = found.groups()
        client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=120)
        chat = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "What is 2 + 2?"}],
                                              max_tokens=8)
        assert chat.choices[0].message.content and chat.usage.completion_tokens <= 8, chat
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8, stream=True)
            if chunk.choices)
        assert streamed, "the streamed reply was empty"
        completion = client.completions.create(model=name, prompt="The capital of France is", max_tokens=4)
        assert completion.choices[0].text, completion
        assert [m.id for m in client.models.list().data] == [name]
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        done = _finish(process, log, start, cpu, 60)
    record(done["wall_s"], done["cpu_s"])
    assert TRACEBACK not in done["output"], tail(done["output"])


# docs/adding-an-environment.md's whole path, each command feeding the next: scripted tool episodes, SFT on them,
# export, GRPO with the recipe's tools from the exported model.
TOOL_PATH = [
    Case("tempax data episodes --config recipes/grpo_price_tools.yaml --policy examples/price_tools.py:scripted_reply "
         "--out runs/price_episodes.jsonl --min-reward 1",
         "data episodes --config recipes/grpo_price_tools.yaml --policy examples/price_tools.py:scripted_reply "
         "--out {tmp}/price_episodes.jsonl --min-reward 1 --limit 8", files=("{tmp}/price_episodes.jsonl",)),
    Case("tempax sft --config recipes/sft_price_tools.yaml data.path=runs/price_episodes.jsonl",
         "sft --config recipes/sft_price_tools.yaml data.path={tmp}/price_episodes.jsonl train.seq_len=384 "
         "train.batch_size=1", steps=2),
    Case("tempax export runs/sft_price_tools runs/sft_price_tools/hf", "export {tmp}/run {tmp}/run/hf",
         files=("{tmp}/run/hf/config.json",)),
    Case("tempax grpo --config recipes/grpo_price_tools.yaml model.source=runs/sft_price_tools/hf",
         "grpo --config recipes/grpo_price_tools.yaml model.source={tmp}/run/hf grpo.group_size=2 grpo.max_new_tokens=16 "
         "train.batch_size=1", steps=2, metrics=("loss", "reward/total_mean"), name="grpo-price-tools-from-export"),
]


def test_tool_environment_path(tmp_path, request, record):
    values = values_for(TOOL_PATH[0], tmp_path, request)
    for case in TOOL_PATH[:3]:
        run_case(case, values, record)
    run_case(TOOL_PATH[3], values | {"run": str(tmp_path / "grpo")}, record)
