"""`tempax export` of a run whose latest checkpoint is damaged: one line naming the file and the intact steps;
`tempax generate` of that run dir reads the newest intact one instead."""

from __future__ import annotations

import glob
import os

import pytest

from tempax.cli.main import main
from tests.cli.test_train_cmds import workspace  # noqa: F401  (the fixture: a tiny LoRA recipe)


@pytest.mark.heavy
def test_export_names_the_damaged_file_and_the_intact_steps(workspace, tmp_path, capfd):  # noqa: F811
    root, recipe, _ = workspace
    run = tmp_path / "run"
    assert main(["sft", "--config", str(recipe), "train.steps=3", f"train.run_dir={run}",
                 "train.checkpoint.every=1", "train.checkpoint.keep=3"]) == 0
    (data_file,) = glob.glob(os.path.join(run, "checkpoints", "3", "params", "d", "*"))
    with open(data_file, "r+b") as f:
        f.truncate(5)
    capfd.readouterr()
    assert main(["export", str(run), str(tmp_path / "out")]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"checkpoint step 3 is damaged: {data_file} is truncated: 5 bytes on disk" in err
    assert "intact checkpoints: 2, 1; choose one with --step 2" in err
    assert main(["export", str(run), str(tmp_path / "out"), "--step", "2"]) == 0
    assert main(["export", str(run), str(tmp_path / "out9"), "--step", "9"]) == 2
    assert "has no checkpoint of step 9; its steps: 1, 2, 3" in capfd.readouterr().err
    # generating from the run dir takes the newest intact checkpoint, says which it skipped, and moves nothing
    assert main(["generate", str(run), "--prompt", "hi", "--max-new-tokens", "2"]) == 0
    err = capfd.readouterr().err
    assert f"skipping checkpoint step 3 of {run}: checkpoint step 3 is damaged: {data_file}" in err, err
    assert os.path.isfile(data_file) and sorted(os.listdir(run / "checkpoints")) == ["1", "2", "3"]
