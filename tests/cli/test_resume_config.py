"""Resuming a run dir with another learning rate: refused with the difference listed and both ways out;
config.yaml untouched; with train.allow_config_change=true it continues and records the change with its step."""

from __future__ import annotations

import json
import os

import pytest

from tempax.cli.main import main
from tempax.configlib import read_yaml
from tests.cli.test_train_cmds import workspace  # noqa: F401  (the fixture: a tiny LoRA recipe)


@pytest.mark.heavy
def test_changed_learning_rate_on_resume_is_refused_then_recorded(workspace, tmp_path, capfd):  # noqa: F811
    root, recipe, _ = workspace
    run = tmp_path / "run"
    base = ["sft", "--config", str(recipe), f"train.run_dir={run}"]
    assert main(base + ["train.steps=2"]) == 0
    saved = (run / "config.yaml").read_text()
    capfd.readouterr()
    assert main(base + ["train.steps=3", "train.optimizer.learning_rate=0.01"]) == 2
    err = capfd.readouterr().err
    assert f"{run} was trained to step 2 with another config" in err
    assert "  train.optimizer.learning_rate: 0.05 -> 0.01\n" in err and "train.steps" not in err
    assert "set train.run_dir to a new folder" in err and "add train.allow_config_change=true" in err
    assert (run / "config.yaml").read_text() == saved and not (run / "config_changes.jsonl").exists()
    assert sorted(os.listdir(run / "checkpoints")) == ["2"]  # nothing trained, nothing removed
    assert main(base + ["train.steps=3", "train.optimizer.learning_rate=0.01", "train.allow_config_change=true"]) == 0
    err = capfd.readouterr().err
    assert ("config change after step 2: train.optimizer.learning_rate: 0.05 -> 0.01 [changes the trajectory, "
            "allowed by train.allow_config_change]") in err
    assert read_yaml(run / "config.yaml")["train"]["optimizer"]["learning_rate"] == 0.01
    (record,) = [json.loads(line) for line in (run / "config_changes.jsonl").read_text().splitlines()]
    assert record["step"] == 2
    assert {c["key"] for c in record["changes"]} == {"train.optimizer.learning_rate", "train.steps"}
    # An allowed change that cannot resume (another LoRA rank: the checkpoint's shapes differ) is refused by the
    # checkpoint, and config.yaml / config_changes.jsonl keep describing the checkpoints that are there.
    saved, changes = (run / "config.yaml").read_text(), (run / "config_changes.jsonl").read_text()
    assert main(base + ["train.steps=4", "train.optimizer.learning_rate=0.01", "lora.rank=8",
                        "train.allow_config_change=true"]) == 2
    assert "was written for another model, trainable set or optimizer" in capfd.readouterr().err
    assert (run / "config.yaml").read_text() == saved and (run / "config_changes.jsonl").read_text() == changes


def test_failed_start_leaves_no_run_dir(workspace, tmp_path, capfd):  # noqa: F811
    root, recipe, _ = workspace
    run = tmp_path / "never"
    assert main(["sft", "--config", str(recipe), f"train.run_dir={run}", "train.batch_size=16"]) == 2
    assert "fewer than one batch of train.batch_size=16" in capfd.readouterr().err
    assert not run.exists()
