"""Run dirs that cannot give a model (yet) say so in one line naming the dir and the command that makes one
(`tempax.train.run_model`); a run dir never loads as plain model files (`tempax.models.registry`). What the
commands print for them: tests/cli/test_generate.py."""

from __future__ import annotations

import pytest
import yaml

import tempax
from tempax.errors import CheckpointError, ConfigError
from tempax.train.run_model import RunHasNoModel, load_run, load_source, shape_source, training_command


def _run_dir(tmp_path, name: str, config: dict) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return str(folder)


def test_a_reward_model_run_is_not_a_policy(tmp_path):
    run = _run_dir(tmp_path, "rm", {"model": {"source": "smollm2-135m-instruct"}, "reward": {"margin": 0.0},
                                    "train": {}})
    with pytest.raises(RunHasNoModel, match=f"{run} is a reward-model run: .* score with `tempax score {run}`"):
        load_source(run)


def test_unfinished_distillation_and_ppo_runs_name_the_command_that_finishes_them(tmp_path):
    distill = _run_dir(tmp_path, "kd", {"teacher": {"source": "smollm2-135m-instruct"}, "student": {}})
    with pytest.raises(RunHasNoModel, match=rf"no student/ folder yet: .*`tempax distill --config {distill}/config.yaml`"):
        load_run(distill)
    with pytest.raises(RunHasNoModel, match="no student/ folder yet"):
        shape_source(distill)
    ppo = _run_dir(tmp_path, "ppo", {"model": {"source": "smollm2-135m-instruct"}, "lora": {"rank": 4}, "ppo": {}})
    with pytest.raises(RunHasNoModel, match=rf"PPO run without adapters/ yet.*`tempax ppo --config {ppo}/config.yaml`"):
        load_run(ppo)
    full = _run_dir(tmp_path, "ppo_full", {"model": {"source": "smollm2-135m-instruct"}, "lora": None, "ppo": {}})
    with pytest.raises(RunHasNoModel, match="full-weight PPO run: .* smollm2-135m-instruct"):
        load_run(full)


def test_the_continuing_command_is_named_from_the_config_shape(tmp_path):
    """config.yaml does not name its command; the section only one command has does (sft and pretrain by data)."""
    cases = {"grpo": {"grpo": {}}, "rft": {"rft": {}}, "dpo": {"dpo": {}}, "kto": {"kto": {}},
             "reward-model": {"reward": {}}, "distill": {"student": {}}, "ppo": {"ppo": {}},
             "sft": {"data": {"format": "auto"}}, "pretrain": {"data": {"format": "text"}}}
    for command, raw in cases.items():
        assert training_command("runs/x", raw) == f"tempax {command} --config runs/x/config.yaml"


def test_a_run_whose_source_leads_back_to_itself_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _run_dir(tmp_path, "a", {"model": {"source": str(b)}})
    _run_dir(tmp_path, "b", {"model": {"source": str(a)}})
    with pytest.raises(ConfigError, match="leads back to itself"):
        shape_source(str(a))
    with pytest.raises(ConfigError, match="leads back to itself"):
        load_run(str(a))


def test_tempax_load_of_a_run_dir_says_what_takes_it(tmp_path):
    run = _run_dir(tmp_path, "run", {"model": {"source": "preset:tiny-llama"}})
    with pytest.raises(CheckpointError, match=f"{run} is a training run's directory.*tempax export {run} OUT_DIR"):
        tempax.load(run)


def test_a_step_of_a_run_whose_model_is_a_final_folder_is_refused(tmp_path):
    distill = _run_dir(tmp_path, "kd", {"teacher": {"source": "smollm2-135m-instruct"}, "student": {}})
    (tmp_path / "kd" / "student").mkdir()
    (tmp_path / "kd" / "student" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="student/ folder it writes at its end, not a checkpoint step; drop --step"):
        load_run(distill, step=2)
