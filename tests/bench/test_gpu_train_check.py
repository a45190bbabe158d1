"""bench/gpu_train_check.py --tiny: the GPU check's script runs on a CPU and reports every part."""

import json

import pytest

from bench import gpu_train_check
from tempax.models.presets import get_preset


def test_kv_bytes_per_step_by_hand():
    """SmolLM2-135M, batch 1, 256 cache slots, bf16: 2 (K, V) x 30 layers x 1 x 3 kv heads x 256 x 64 x 2 bytes
    = 5,898,240 bytes; batch 64 is 64 times that."""
    cfg = get_preset("smollm2-135m")
    assert gpu_train_check.kv_bytes_per_step(cfg, 1, 256, 2) == 5_898_240
    assert gpu_train_check.kv_bytes_per_step(cfg, 64, 256, 2) == 64 * 5_898_240


def test_device_tables():
    assert gpu_train_check.peak_for("NVIDIA H200") == 989.0
    assert gpu_train_check.peak_for("NVIDIA H200", gpu_train_check.PEAK_HBM_TBPS) == 4.8
    assert gpu_train_check.peak_for("cpu") is None


@pytest.mark.heavy
def test_tiny_run_of_train_and_decode(capsys):
    """Full and LoRA SFT with "cudnn" attention (run as "xla" on a CPU) and one remat choice, then decoding at
    batch 1: every record has its figures, none an error; the HBM fraction is bytes per step x steps per second
    over the bandwidth given."""
    gpu_train_check.main(["--tiny", "--parts", "train,decode", "--modes", "full,lora", "--attention", "cudnn",
                          "--remat", "full", "--warmup", "1", "--steps", "1", "--decode-shapes", "smollm2-135m",
                          "--decode-batches", "1", "--hbm-tbps", "0.05"])
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [(r["part"], r.get("mode")) for r in records] == [("train", "full"), ("train", "lora"), ("decode", None)]
    assert not [r for r in records if "error" in r]
    train, decode = records[:2], records[2]
    assert all(r["attention"] == "xla" and r["remat"] == "full" and r["tokens_per_s"] > 0 for r in train)
    assert train[1]["trainable"] < train[0]["trainable"]
    assert decode["shape"] == "tiny-smollm2-135m" and decode["batch"] == 1 and decode["tokens_per_s"] > 0
    steps_per_s = decode["tokens_per_s"] / decode["batch"]
    assert decode["fraction_of_hbm"] == pytest.approx(decode["bytes_per_step"] * steps_per_s / 0.05e12, rel=1e-2,
                                                      abs=1e-4)


def test_a_failing_part_reports_its_error_and_the_rest_runs(capsys, tmp_path):
    """The grpo part with no workloads.json where --shared points: an error record, not a crash."""
    gpu_train_check.main(["--tiny", "--parts", "grpo", "--shared", str(tmp_path)])
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert record["part"] == "grpo" and "workloads.json" in record["error"]


@pytest.mark.slow
def test_tiny_grpo_part(capsys):
    """The grpo part on the tiny shared workload (needs the shared bench folder next to the checkout)."""
    from bench import grpo_step

    gpu_train_check.main(["--tiny", "--parts", "grpo", "--shared", grpo_step.SHARED])
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert "error" not in record and record["s_per_step"] > 0
