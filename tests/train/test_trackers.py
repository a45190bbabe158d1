"""train.report_to: W&B (offline) and MLflow (a local file store) runs written by a real training run and read back
through each library's own reader; the same metric names and values as metrics.jsonl; process 0 only."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tempax.algorithms.sft.main import make_sft_loss
from tempax.configlib import from_dict, parse_overrides
from tempax.errors import ConfigError
from tempax.train import loop as loop_module
from tempax.train import trackers
from tempax.train.config import CheckpointConfig, TrainConfig
from tempax.train.loop import Trainer
from tempax.train.metrics import read_metrics
from tests.train.helpers import TableLM, tiny_train_config
from tests.train.test_loop import VOCAB, _loader


@pytest.fixture
def local_stores(tmp_path, monkeypatch):
    """W&B offline (files under the run dir) and an MLflow file store in tmp_path: nothing leaves the machine."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "tempax-test")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's file store: no database migrations to wait for
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "tracker-test")
    return tmp_path


def _fit(run_dir, steps, report_to):
    cfg = tiny_train_config(
        run_dir, steps=steps, batch_size=4, seq_len=16, report_to=report_to, run_name="tiny-sft", eval_every=2,
        checkpoint=CheckpointConfig(every=0, save_at_end=True, async_save=False),
    )
    trainer = Trainer(TableLM(np.zeros((VOCAB, VOCAB))), make_sft_loss(), cfg)
    result = trainer.fit(_loader(), eval_batches=lambda: [next(iter(_loader()))])
    trainer.close()
    return result


def _jsonl_history(run_dir, key):
    return [(r["step"], r[key]) for r in read_metrics(run_dir) if key in r]


def _wandb_records(run_dir):
    """The records of the run's offline .wandb logs, as W&B's own inspector prints them."""
    out = []
    wandb_dir = os.path.join(run_dir, "wandb")
    for name in sorted(os.listdir(wandb_dir)):
        if name.startswith("offline-run-"):
            printed = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json",
                                      os.path.join(wandb_dir, name)], capture_output=True, text=True, check=True)
            out += [json.loads(line) for line in printed.stdout.splitlines() if line.strip()]
    return out


def test_wandb_offline_and_mlflow_runs_hold_the_config_and_metric_history(local_stores):
    """3 steps, then a resume to 5 (from the checkpoint at 3): one MLflow run and one W&B run id across both, with
    every metrics.jsonl number (train and eval/ keys) at its step and the config's keys."""
    run_dir = str(local_stores / "run")
    _fit(run_dir, 3, ("wandb", "mlflow"))
    ids = json.loads(open(os.path.join(run_dir, trackers.IDS_FILE)).read())
    resumed = _fit(run_dir, 5, ("wandb", "mlflow"))
    assert resumed.resumed_from == 3
    assert json.loads(open(os.path.join(run_dir, trackers.IDS_FILE)).read()) == ids  # the same runs continued
    assert not os.path.exists(os.path.join(run_dir, "tb"))  # report_to without tensorboard writes no events
    loss = _jsonl_history(run_dir, "loss")
    eval_loss = _jsonl_history(run_dir, "eval/loss")
    assert [s for s, _ in loss] == [1, 2, 3, 4, 5] and [s for s, _ in eval_loss] == [2, 3, 4, 5]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("tracker-test")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [ids["mlflow"]["run_id"]]
    run = runs[0]
    assert run.info.run_name == "tiny-sft" and run.info.status == "FINISHED"
    assert run.data.params["train.steps"] == "3"  # params are write-once: the first config's value stays
    assert run.data.params["train.optimizer.learning_rate"] == "0.01"
    for key, expected in (("loss", loss), ("eval/loss", eval_loss)):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert history == expected  # float64 in both files: exactly the same numbers
    # Every number of metrics.jsonl under the same name ("time" is the record's wall clock; trackers stamp their own).
    jsonl_keys = {k for r in read_metrics(run_dir) for k, v in r.items() if isinstance(v, float)} - {"time"}
    assert set(run.data.metrics) == jsonl_keys and {"loss", "grad_norm", "lr", "eval/loss"} <= jsonl_keys

    records = _wandb_records(run_dir)
    runs = [r["run"] for r in records if r["type"] == "run"]
    assert {r["run_id"] for r in runs} == {ids["wandb"]} and {r["project"] for r in runs} == {"tempax-test"}
    config = runs[0]["config"]["update"]
    assert config["train"]["steps"] == 3 and config["train"]["report_to"] == ["wandb", "mlflow"]
    history = {}
    for r in records:
        if r["type"] == "history":
            history.setdefault(int(r["history"]["step"]["num"]), {}).update(r["history"]["item"])
    assert sorted(history) == [1, 2, 3, 4, 5]
    assert [(s, history[s]["loss"]) for s in sorted(history)] == loss
    assert [(s, history[s]["eval/loss"]) for s in sorted(history) if "eval/loss" in history[s]] == eval_loss


def test_only_process_zero_reports(local_stores, monkeypatch):
    """A process other than 0 makes no MetricsWriter, so it opens no tracker run (and writes no metrics.jsonl)."""
    monkeypatch.setattr(loop_module, "is_writer", lambda: False)
    run_dir = str(local_stores / "run")
    _fit(run_dir, 2, ("mlflow",))
    assert not os.path.exists(os.path.join(run_dir, trackers.IDS_FILE))
    assert not os.path.exists(os.path.join(run_dir, "metrics.jsonl"))
    assert not os.path.exists(local_stores / "mlruns")


def test_default_is_tensorboard_and_none_reports_nowhere():
    assert TrainConfig().trackers == ("tensorboard",)
    assert TrainConfig(tensorboard=False).trackers == ()
    assert TrainConfig(report_to=("none",)).trackers == ()
    assert TrainConfig(report_to=("mlflow", "tensorboard", "mlflow")).trackers == ("mlflow", "tensorboard")


def test_unknown_or_missing_tracker_is_refused_when_the_config_is_read(monkeypatch):
    with pytest.raises(ConfigError, match=r"train.report_to names 'comet'.*choose from tensorboard, wandb, mlflow"):
        from_dict(TrainConfig, parse_overrides(["report_to=[comet]"], TrainConfig))
    real = trackers.importlib.util.find_spec
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name: None if name == "wandb" else real(name))
    with pytest.raises(ConfigError, match=r"names wandb but the wandb package is not installed: pip install "
                                          r"'tempax\[wandb\]' \(or drop wandb from train.report_to\)"):
        from_dict(TrainConfig, {"report_to": ["tensorboard", "wandb"]})
