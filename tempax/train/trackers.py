"""Experiment trackers: the records of metrics.jsonl sent on to TensorBoard, Weights & Biases and MLflow.

`train.report_to` names them as TRL's `report_to` does: `[tensorboard]` (the default), `[tensorboard, wandb,
mlflow]`, or `[]` / `[none]` for metrics.jsonl alone. Every tracker gets the same metric names as metrics.jsonl
(`loss`, `grad_norm`, `lr`, `tokens_per_s`, `eval/loss`, ...) at the same optimizer step, finite numbers only
(event records and text stay in metrics.jsonl), and the run's resolved config (`<run_dir>/config.yaml`).

Where each one writes, chosen by the library's own environment variables as TRL leaves it:

  * tensorboard: event files in `<run_dir>/tb` (tensorboardX, a core dependency).
  * wandb (`pip install 'tempax[wandb]'`): `wandb.init(project=$WANDB_PROJECT or "tempax", dir=<run_dir>)`;
    `WANDB_MODE=offline` writes the run under `<run_dir>/wandb/` for a later `wandb sync`, no network needed.
  * mlflow (`pip install 'tempax[mlflow]'`): `$MLFLOW_TRACKING_URI` (MLflow's default otherwise, a SQLite file
    in the working directory), experiment `$MLFLOW_EXPERIMENT_NAME` or "tempax".

A resumed run continues the tracker runs it started: their ids are kept in `<run_dir>/trackers.json`. Only the
process that writes the run's files (process 0) opens trackers, because only it makes a `MetricsWriter`.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from typing import Any, Mapping, Sequence

from tempax.errors import ConfigError
from tempax.train.run_identity import CONFIG_FILE, flatten

TRACKERS = ("tensorboard", "wandb", "mlflow")
# The pip extra that installs each optional tracker (tensorboardX is a core dependency).
_PACKAGES = {"wandb": ("wandb", "tempax[wandb]"), "mlflow": ("mlflow", "tempax[mlflow]")}
IDS_FILE = "trackers.json"
DEFAULT_PROJECT = "tempax"


def check_report_to(names: Sequence[str], key: str = "train.report_to") -> tuple[str, ...]:
    """The tracker names of `report_to` ("none" dropped), each known and installed; raises `ConfigError` otherwise.

    Checked when the config is parsed, so a missing package stops the run before any step is trained.
    """
    out = []
    for name in names:
        if name == "none":
            continue
        if name not in TRACKERS:
            raise ConfigError(f"{key} names {name!r}, which is not a tracker tempax reports to; choose from "
                              f"{', '.join(TRACKERS)} (or none)")
        if name in _PACKAGES:
            module, extra = _PACKAGES[name]
            if importlib.util.find_spec(module) is None:
                raise ConfigError(f"{key} names {name} but the {module} package is not installed: "
                                  f"pip install '{extra}' (or drop {name} from {key})")
        if name not in out:
            out.append(name)
    return tuple(out)


def finite_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The entries a tracker can plot: finite numbers (bools, text and NaN/inf stay in metrics.jsonl only)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value)):
            out[key] = float(value)
    return out


def run_config(run_dir: str, fallback: Mapping[str, Any] | None) -> dict[str, Any]:
    """The run's resolved config (`<run_dir>/config.yaml`, written by `start_run`), else `fallback`."""
    path = os.path.join(run_dir, CONFIG_FILE)
    if os.path.isfile(path):
        import yaml

        with open(path) as f:
            loaded = yaml.safe_load(f)
        if isinstance(loaded, dict):
            return loaded
    return dict(fallback or {})


class Tracker:
    """One destination of metric records; `log` gets finite scalars of one step."""

    def log(self, step: int, scalars: dict[str, float]) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        """Pushes what is buffered (trackers that write as they go need nothing)."""

    def close(self) -> None:
        """Ends the tracker's run."""


class TensorBoardTracker(Tracker):
    """Event files in `<run_dir>/tb`; a resumed run purges its events after the checkpoint's step."""

    def __init__(self, run_dir: str, *, resume_step: int | None):
        from tensorboardX import SummaryWriter

        purge = None if resume_step is None else resume_step + 1
        self._writer = SummaryWriter(os.path.join(run_dir, "tb"), purge_step=purge)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbTracker(Tracker):
    """A Weights & Biases run (offline with `WANDB_MODE=offline`); continues the run id saved in trackers.json.

    W&B keeps a run's steps increasing: after a resume from step k it drops the records of steps it has already
    seen past k (metrics.jsonl, TensorBoard and MLflow keep the re-run values).
    """

    def __init__(self, run_dir: str, *, config: dict[str, Any], run_name: str, run_id: str | None):
        import wandb

        try:
            self._run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT), name=run_name, dir=run_dir,
                config=config, id=run_id, resume="allow" if run_id else None,
            )
        except Exception as e:  # wandb raises its own types (no API key, no network) from several layers
            raise ConfigError(
                f"Weights & Biases could not start a run ({type(e).__name__}: {e}). Log in with `wandb login`, or "
                f"set WANDB_MODE=offline to write the run under {run_dir}/wandb and `wandb sync` it later"
            ) from e
        self.run_id = self._run.id

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowTracker(Tracker):
    """An MLflow run in `$MLFLOW_TRACKING_URI` (MLflow's default store otherwise); the config as dotted params.

    Uses `MlflowClient` (no process-global active run), so a library user's own MLflow runs are left alone.
    """

    _PARAM_VALUE_LIMIT = 6000  # MLflow refuses longer parameter values
    _BATCH_PARAMS = 100  # MLflow's limit per log_batch call

    def __init__(self, *, config: dict[str, Any], run_name: str, saved: Mapping[str, Any]):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or None)
        self.tracking_uri = self._client.tracking_uri
        # The run this run_dir started before, if it lives in the store in use now.
        run_id = saved.get("run_id") if saved.get("tracking_uri") == self.tracking_uri else None
        if run_id is not None:
            self.run_id = run_id
            self._client.update_run(run_id, status="RUNNING")
            known = self._client.get_run(run_id).data.params
        else:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", DEFAULT_PROJECT)
            experiment = self._client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else self._client.create_experiment(name)
            self.run_id = self._client.create_run(experiment_id, run_name=run_name).info.run_id
            known = {}
        # A resume may change bookkeeping keys; MLflow params are write-once, so only new keys are added.
        params = [Param(k, str(v)[: self._PARAM_VALUE_LIMIT]) for k, v in flatten(config).items() if k not in known]
        for i in range(0, len(params), self._BATCH_PARAMS):
            self._client.log_batch(self.run_id, params=params[i:i + self._BATCH_PARAMS])

    def log(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in scalars.items()])

    def close(self) -> None:
        self._client.set_terminated(self.run_id, "FINISHED")


def open_trackers(
    names: Sequence[str],
    run_dir: str,
    *,
    config: Mapping[str, Any] | None = None,
    run_name: str | None = None,
    resume_step: int | None = None,
) -> list[Tracker]:
    """The trackers of `names` (see `check_report_to`), started for `run_dir`; W&B and MLflow run ids are read
    from and saved to `<run_dir>/trackers.json` so that a resumed run (or a later evaluation) continues them."""
    names = check_report_to(names)
    if not names:
        return []
    ids_path = os.path.join(run_dir, IDS_FILE)
    ids: dict[str, Any] = {}
    if os.path.isfile(ids_path):
        with open(ids_path) as f:
            ids = json.load(f)
    full_config = run_config(run_dir, config) if {"wandb", "mlflow"} & set(names) else {}
    name = run_name or os.path.basename(os.path.abspath(run_dir))
    trackers: list[Tracker] = []
    for tracker in names:
        if tracker == "tensorboard":
            trackers.append(TensorBoardTracker(run_dir, resume_step=resume_step))
        elif tracker == "wandb":
            wb = WandbTracker(run_dir, config=full_config, run_name=name, run_id=ids.get("wandb"))
            ids["wandb"] = wb.run_id
            trackers.append(wb)
        else:
            ml = MlflowTracker(config=full_config, run_name=name, saved=ids.get("mlflow") or {})
            ids["mlflow"] = {"run_id": ml.run_id, "tracking_uri": ml.tracking_uri}
            trackers.append(ml)
    if {"wandb", "mlflow"} & set(names):
        tmp = ids_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(ids, f, indent=1)
        os.replace(tmp, ids_path)
    return trackers
