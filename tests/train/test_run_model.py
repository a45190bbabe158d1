"""A run dir as a model source (`tempax.train.run_model`), told by `describe` what the run is: each layout a record
can state, and a run dir that cannot give a model (yet) in one line naming the dir and the command that makes one;
a run dir never loads as plain model files (`tempax.models.registry`). The `describe` the commands use, which reads
the run's command and its record: tests/algorithms/test_run_dirs.py; what the commands print:
tests/cli/test_generate.py."""

from __future__ import annotations

import pytest
import yaml

import tempax
from tempax.algorithms.registry import RunModel
from tempax.errors import CheckpointError, ConfigError
from tempax.train.run_model import RunHasNoModel, RunKind, load_run, load_source, shape_source


def _run_dir(tmp_path, name: str, config: dict) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return str(folder)


def told(command: str, model: RunModel = RunModel()):
    """A `describe` that says every run dir is a run of `command` keeping its model as `model` states."""
    return lambda run_dir: RunKind(command, model)


NO_MODEL = RunModel("none", note="it has none; use {source} or look in {run_dir}")
FOLDER = RunModel("folder", "final", note="the run writes it there when it finishes")
ADAPTERS = RunModel("adapters", "adapters", note="its checkpoints hold the policy with a head")


def test_a_run_that_keeps_no_model_says_why_in_the_words_of_its_record(tmp_path):
    run = _run_dir(tmp_path, "none", {"model": {"source": "smollm2-135m-instruct"}, "train": {}})
    with pytest.raises(RunHasNoModel, match=f"^{run} is a scorer run: it has none; use smollm2-135m-instruct or "
                                            f"look in {run}$"):
        load_source(run, describe=told("scorer", NO_MODEL))
    with pytest.raises(RunHasNoModel, match="is a scorer run"):
        shape_source(run, describe=told("scorer", NO_MODEL))


def test_unfinished_runs_whose_model_is_a_final_folder_name_the_command_that_finishes_them(tmp_path):
    folder = _run_dir(tmp_path, "kd", {"model": {"source": "smollm2-135m-instruct"}})
    with pytest.raises(RunHasNoModel, match=rf"^{folder} has no final/ folder yet: the run writes it there when it "
                                            rf"finishes; finish it with `tempax kd --config {folder}/config.yaml`$"):
        load_run(folder, describe=told("kd", FOLDER))
    with pytest.raises(RunHasNoModel, match="no final/ folder yet"):
        shape_source(folder, describe=told("kd", FOLDER))
    lora = _run_dir(tmp_path, "rl", {"model": {"source": "smollm2-135m-instruct"}, "lora": {"rank": 4}})
    with pytest.raises(RunHasNoModel, match=rf"{lora} has no adapters/ yet: its checkpoints hold the policy with a "
                                            rf"head, and a LoRA run writes .*`tempax rl --config {lora}/config.yaml`"):
        load_run(lora, describe=told("rl", ADAPTERS))
    full = _run_dir(tmp_path, "rl_full", {"model": {"source": "smollm2-135m-instruct"}, "lora": None})
    with pytest.raises(RunHasNoModel, match="full-weight run with no model of its own: .* smollm2-135m-instruct$"):
        load_run(full, describe=told("rl", ADAPTERS))


def test_a_run_without_a_checkpoint_names_the_command_that_trains_it(tmp_path):
    run = _run_dir(tmp_path, "fresh", {"model": {"source": "smollm2-135m-instruct"}})
    with pytest.raises(RunHasNoModel, match=rf"{run} has no checkpoint yet: .*`tempax mine --config {run}/config.yaml`"):
        load_run(run, describe=told("mine"))


def test_a_run_whose_source_leads_back_to_itself_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _run_dir(tmp_path, "a", {"model": {"source": str(b)}})
    _run_dir(tmp_path, "b", {"model": {"source": str(a)}})
    with pytest.raises(ConfigError, match="leads back to itself"):
        shape_source(str(a), describe=told("mine"))
    with pytest.raises(ConfigError, match="leads back to itself"):
        load_run(str(a), describe=told("mine"))


def test_tempax_load_of_a_run_dir_says_what_takes_it(tmp_path):
    run = _run_dir(tmp_path, "run", {"model": {"source": "preset:tiny-llama"}})
    with pytest.raises(CheckpointError, match=f"{run} is a training run's directory.*tempax export {run} OUT_DIR"):
        tempax.load(run)


def test_a_step_of_a_run_whose_model_is_a_final_folder_is_refused(tmp_path):
    run = _run_dir(tmp_path, "kd", {"model": {"source": "smollm2-135m-instruct"}})
    (tmp_path / "kd" / "final").mkdir()
    (tmp_path / "kd" / "final" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="final/ folder it writes at its end, not a checkpoint step; drop --step"):
        load_run(run, step=2, describe=told("kd", FOLDER))
    with pytest.raises(ConfigError, match="adapters/ folder it writes at its end"):
        load_run(run, step=2, describe=told("rl", ADAPTERS))
