"""Two processes on localhost, each with 2 XLA host devices, as one 4-device run (`tempax launch`).

Each test starts the run through `tempax launch --nproc 2 --devices-per-process 2 --timeout T`, so a peer that
hangs (or never joins: `train.mesh.init_timeout_s`) fails the test within T seconds instead of hanging CI, and
compares with the same recipe run in this process on 4 of its 8 host devices: the same global batch on the same
mesh shape. Losses agree to rtol 1e-5 (float32; the two runs reduce over the same 4 shards, across processes
through gloo in one and inside XLA in the other, so only summation order may differ). The SFT test (equality,
a kill in both processes and the resume) is in the default suite; DPO and GRPO, the same check for the other
training paths, are marked slow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from numpy.testing import assert_allclose

from tempax.algorithms.sft.main import SFTConfig, main
from tempax.configlib import from_dict
from tempax.train.metrics import read_metrics
from tests.kit.tokenizers import DIALOGUES, tiny_chat_tokenizer

LAUNCH_TIMEOUT_S = 240
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mp")
    tiny_chat_tokenizer().hf.save_pretrained(folder / "tok")
    with open(folder / "train.jsonl", "w") as f:
        for i in range(24):
            f.write(json.dumps({"messages": DIALOGUES[i % 4]}) + "\n")
    return folder


def _sft_raw(files, run_dir, **train) -> dict:
    return {
        "model": {"source": "preset:tiny-llama", "tokenizer": str(files / "tok"),
                  "overrides": {"vocab_size": 400, "num_layers": 2}},
        "data": {"path": str(files / "train.jsonl")},
        "train": {"steps": 3, "batch_size": 8, "seq_len": 32, "progress_bar": False, "tensorboard": False,
                  "run_dir": str(run_dir), "mesh": {"fsdp": 4, "num_devices": 4, "init_timeout_s": 60},
                  "optimizer": {"learning_rate": 1e-2, "schedule": "constant", "weight_decay": 0.0},
                  "checkpoint": {"save_at_end": False, "async_save": False}, **train},
    }


def _launch_argv(recipe: str, command: str = "sft") -> list[str]:
    return [sys.executable, "-m", "tempax.cli.main", "launch", "--nproc", "2", "--devices-per-process", "2",
            "--timeout", str(LAUNCH_TIMEOUT_S), "--grace", "5", "--", "tempax", command, "--config", recipe]


def _env(tmp_path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("XLA_FLAGS", None)  # the launcher sets each process's device count
    # A persistent compilation cache shared by the launches of one test: the resumed run's compiles are hits.
    env.update(JAX_COMPILATION_CACHE_DIR=str(tmp_path / "xla_cache"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return env


def _write_recipe(path, raw) -> str:
    with open(path, "w") as f:
        yaml.safe_dump(raw, f)
    return str(path)


def _run_two_processes(recipe: str, command: str = "sft", *, env: dict[str, str]) -> subprocess.CompletedProcess:
    out = subprocess.run(_launch_argv(recipe, command), env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=LAUNCH_TIMEOUT_S + 30)
    assert out.returncode == 0, out.stderr[-4000:]
    return out


def _losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(str(run_dir)) if "loss" in r}


@pytest.mark.heavy
def test_sft_fsdp_over_two_processes_equals_one_process_and_resumes_after_a_kill(files, tmp_path):
    """Full fine-tuning with FSDP over 4 devices split 2 + 2 across processes, a checkpoint every step. The run is
    SIGKILLed (launcher and both processes) once checkpoint 2 is committed, and relaunched: it restores the
    latest checkpoint k >= 2 (state, RNG, data position) in both processes and runs steps k+1, k+2.
    Every step's loss, before the kill and after the resume, equals the uninterrupted one-process run on 4
    devices, and only process 0 wrote the run's files (step 1, never re-run, has one record)."""
    raw = _sft_raw(files, tmp_path / "two", steps=400,
                   checkpoint={"every": 1, "keep": 400, "save_at_end": False, "async_save": False})
    recipe = _write_recipe(tmp_path / "killed.yaml", raw)
    proc = subprocess.Popen(_launch_argv(recipe), env=_env(tmp_path), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    ckpt = tmp_path / "two" / "checkpoints"
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    try:
        while not (ckpt / "2").is_dir():
            assert proc.poll() is None, proc.stderr.read()[-4000:]
            assert time.monotonic() < deadline, "no checkpoint 2 in time"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    k = max(int(d) for d in os.listdir(ckpt) if d.isdigit())
    assert k >= 2
    with open(tmp_path / "two" / "metrics.jsonl") as f:
        assert sum(json.loads(line)["step"] == 1 for line in f if line.strip()) == 1  # one writer
    before_kill = _losses(tmp_path / "two")
    raw["train"]["steps"] = k + 2
    _run_two_processes(_write_recipe(tmp_path / "resume.yaml", raw), env=_env(tmp_path))
    reference = main(from_dict(SFTConfig, _sft_raw(files, tmp_path / "one", steps=k + 2)), log=lambda _: None)
    resumed = _losses(tmp_path / "two")
    assert_allclose([before_kill[s] for s in range(1, k + 1)], reference.losses[:k], rtol=1e-5)
    assert_allclose([resumed[k + 1], resumed[k + 2]], reference.losses[k:k + 2], rtol=1e-5)
    assert os.path.isfile(tmp_path / "two" / "config.yaml") and os.path.isdir(tmp_path / "two" / "tokenizer")


@pytest.mark.slow
def test_dpo_over_two_processes_equals_one_process(files, tmp_path):
    """Two DPO steps (full fine-tuning, reference log-probs precomputed by the sharded model before training,
    read back through `host_array`) with FSDP over 2 + 2 devices: losses equal the one-process run."""
    from tempax.algorithms.preference.dpo import DPOConfig
    from tempax.algorithms.preference.dpo import main as dpo_main

    with open(files / "pairs.jsonl", "w") as f:
        for i in range(16):
            f.write(json.dumps({"prompt": f"Tell me about item {i}.", "chosen": f"Sure, item {i}.",
                                "rejected": f"No. {i}"}) + "\n")

    def raw(run_dir):
        base = _sft_raw(files, run_dir, steps=2)
        return {"model": base["model"], "data": {"path": str(files / "pairs.jsonl")},
                "dpo": {"loss": "sigmoid", "beta": 0.1, "reference": "precomputed"}, "train": base["train"]}

    _run_two_processes(_write_recipe(tmp_path / "dpo.yaml", raw(tmp_path / "two")), "dpo", env=_env(tmp_path))
    reference = dpo_main(from_dict(DPOConfig, raw(tmp_path / "one")), log=lambda _: None)
    two = _losses(tmp_path / "two")
    assert sorted(two) == [1, 2]
    assert_allclose([two[1], two[2]], reference.losses, rtol=1e-5)


@pytest.mark.slow
def test_tiny_grpo_over_two_processes_equals_one_process(files, tmp_path):
    """Two GRPO steps (LoRA, 4 prompts x 2 completions, sampling, rewards, reference pass, update) with the policy
    sharded over 2 + 2 devices: the same completions and log-probs as one process (entropy, KL, completion
    lengths and rewards of each step equal to rtol 1e-5), and process 0 alone wrote the adapters."""
    from tempax.algorithms.grpo.config import GRPOConfig
    from tempax.algorithms.grpo.main import main as grpo_main

    def raw(run_dir):
        base = _sft_raw(files, run_dir, steps=2, batch_size=4, check_memory=False)
        base["train"].pop("seq_len")
        return {"model": base["model"], "lora": {"rank": 2, "alpha": 4.0},
                "task": {"name": "arithmetic", "num_train_problems": 8},
                "grpo": {"group_size": 2, "max_new_tokens": 4, "beta": 0.04},
                "eval": {"before": False, "after": False}, "train": base["train"]}

    _run_two_processes(_write_recipe(tmp_path / "grpo.yaml", raw(tmp_path / "two")), "grpo", env=_env(tmp_path))
    grpo_main(from_dict(GRPOConfig, raw(tmp_path / "one")), log=lambda _: None)
    one, two = read_metrics(str(tmp_path / "one")), read_metrics(str(tmp_path / "two"))
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2]
    keys = ["entropy", "kl", "completion/length_mean", "reward/total_mean"]
    for a, b in zip(one, two):
        assert all(k in a for k in keys), sorted(a)
        assert_allclose([b[k] for k in keys], [a[k] for k in keys], rtol=1e-5)
    assert os.path.isfile(tmp_path / "two" / "adapters" / "adapter_model.safetensors")
