"""Run identity: a resume with a trajectory-changing config difference is refused with the list; bookkeeping
differences and allowed changes are recorded with their step; config.yaml is never replaced silently."""

from __future__ import annotations

import json
import os

import pytest

from tempax.algorithms.registry import command_of
from tempax.algorithms.sft.main import PretrainConfig, SFTConfig
from tempax.configlib import from_dict, read_yaml, to_dict
from tempax.errors import ConfigError
from tempax.train.run_identity import Change, check_resume, config_changes, flatten, save_run_config


def test_flatten_and_changes_by_kind():
    saved = {"train": {"steps": 4, "log_every": 1, "optimizer": {"learning_rate": 0.1}, "mesh": {"fsdp": 1}},
             "data": {"path": "a.jsonl"}, "model": {"overrides": {}}}
    new = {"train": {"steps": 6, "log_every": 5, "optimizer": {"learning_rate": 0.2}, "mesh": {"fsdp": 2}},
           "data": {"path": "a.jsonl"}, "model": {"overrides": {"num_layers": 1}}}
    assert flatten(saved)["train.optimizer.learning_rate"] == 0.1 and flatten(saved)["model.overrides"] == {}
    assert [(c.key, c.trajectory) for c in config_changes(saved, new)] == [
        ("model.overrides", True), ("model.overrides.num_layers", True), ("train.log_every", False),
        ("train.mesh.fsdp", False), ("train.optimizer.learning_rate", True), ("train.steps", False)]
    assert config_changes({"a": 1}, {"a": 1.0}) == []  # 1 and 1.0 are the same number
    assert str(Change("train.seq_len", 16, 32, True)) == "train.seq_len: 16 -> 32"


def test_check_resume_refuses_with_the_list_and_both_ways_out():
    saved, new = {"train": {"seq_len": 16, "log_every": 1}}, {"train": {"seq_len": 32, "log_every": 2}}
    with pytest.raises(ConfigError) as info:
        check_resume(saved, new, step=3, allow=False, run_dir="runs/x")
    msg = str(info.value)
    assert "runs/x was trained to step 3 with another config" in msg
    assert "  train.seq_len: 16 -> 32\n" in msg and "log_every" not in msg
    assert "set train.run_dir to a new folder" in msg and "train.allow_config_change=true" in msg
    assert [c.key for c in check_resume(saved, new, step=3, allow=True)] == ["train.log_every", "train.seq_len"]


def save(run_dir: str, cfg, **options):
    """`save_run_config` as `start_run` calls it: with the command whose record names the config's class."""
    return save_run_config(run_dir, cfg, command=command_of(cfg), **options)


def _cfg(tmp_path, *overrides):
    base = {"train": {"run_dir": str(tmp_path), "optimizer": {"learning_rate": 0.1}}}
    for o in overrides:
        key, value = o.split("=")
        node = base
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = json.loads(value)
    return from_dict(SFTConfig, base)


def test_save_run_config_records_allowed_changes_with_their_step(tmp_path):
    said = []
    save(str(tmp_path), _cfg(tmp_path), say=said.append)  # a fresh run: nothing to compare
    os.makedirs(tmp_path / "checkpoints" / "3")
    with pytest.raises(ConfigError, match=r"train.optimizer.learning_rate: 0.1 -> 0.2"):
        save(str(tmp_path), _cfg(tmp_path, "train.optimizer.learning_rate=0.2"), say=said.append)
    assert read_yaml(tmp_path / "config.yaml")["train"]["optimizer"]["learning_rate"] == 0.1  # untouched
    assert not (tmp_path / "config_changes.jsonl").exists()
    save(str(tmp_path), _cfg(tmp_path, "train.optimizer.learning_rate=0.2",
                                        "train.allow_config_change=true", "train.steps=200"), say=said.append)
    assert read_yaml(tmp_path / "config.yaml")["train"]["optimizer"]["learning_rate"] == 0.2
    (record,) = [json.loads(line) for line in (tmp_path / "config_changes.jsonl").read_text().splitlines()]
    assert record["step"] == 3
    assert [(c["key"], c["old"], c["new"], c["trajectory"]) for c in record["changes"]] == [
        ("train.optimizer.learning_rate", 0.1, 0.2, True),
        ("train.steps", 100, 200, False)]
    assert ("config change after step 3: train.steps: 100 -> 200 (the cosine schedule's remaining learning "
            "rates follow the new length) [run length]") in said
    assert to_dict(_cfg(tmp_path))["train"]["allow_config_change"] is False


def test_config_yaml_names_its_command_and_a_resume_with_another_is_refused(tmp_path):
    """config.yaml is a recipe of the run's command (`command:` first, so `tempax sft --config RUN/config.yaml`
    continues it); resuming it with another command changes the trajectory; a config.yaml written before it named
    its command resumes as the command that continues it, and names it from then on."""
    save(str(tmp_path), _cfg(tmp_path))
    text = (tmp_path / "config.yaml").read_text()
    assert text.startswith("command: sft\n") and read_yaml(tmp_path / "config.yaml")["command"] == "sft"
    os.makedirs(tmp_path / "checkpoints" / "3")
    pretrain = from_dict(PretrainConfig, to_dict(_cfg(tmp_path)))  # the same settings, another command
    with pytest.raises(ConfigError, match=r"\n  command: \"sft\" -> \"pretrain\"\n"):
        save(str(tmp_path), pretrain)
    (tmp_path / "config.yaml").write_text(text.removeprefix("command: sft\n"))  # as an older run wrote it
    assert save(str(tmp_path), _cfg(tmp_path)) == []
    assert (tmp_path / "config.yaml").read_text() == text


def test_a_key_renamed_since_the_run_started_is_the_same_setting_on_resume(tmp_path):
    """An RFT run saved when `rft.group_size` was `rft.samples_per_problem` and `eval.group_size` was
    `eval.num_samples` resumes with no difference; changing the value is still refused, under the new name; and
    config.yaml then holds the new names."""
    from tempax.algorithms.rft.config import RFTConfig

    def rft(group_size):
        return from_dict(RFTConfig, {"train": {"run_dir": str(tmp_path)}, "rft": {"group_size": group_size},
                                     "eval": {"group_size": 2, "ks": [1, 2]}})

    save(str(tmp_path), rft(4))
    saved = read_yaml(tmp_path / "config.yaml")
    saved["rft"] = {("samples_per_problem" if k == "group_size" else k): v for k, v in saved["rft"].items()}
    saved["eval"] = {("num_samples" if k == "group_size" else k): v for k, v in saved["eval"].items()}
    (tmp_path / "config.yaml").write_text(json.dumps(saved))  # JSON is YAML: an old run's dump
    os.makedirs(tmp_path / "checkpoints" / "3")
    with pytest.raises(ConfigError, match=r"\n  rft.group_size: 4 -> 6\n") as refused:
        save(str(tmp_path), rft(6))
    assert "samples_per_problem" not in str(refused.value) and "num_samples" not in str(refused.value)
    said = []
    assert save(str(tmp_path), rft(4), say=said.append) == [] and said == []
    assert read_yaml(tmp_path / "config.yaml")["rft"]["group_size"] == 4
    assert "samples_per_problem" not in read_yaml(tmp_path / "config.yaml")["rft"]


def test_a_config_class_names_the_held_out_keys_that_change_its_trajectory(tmp_path):
    """PPO's held-out prompts size its rollout rows, so `data.eval_path` and `eval.num_prompts` (bookkeeping for
    every other command) are refused on resume, while `eval.batch_size` stays bookkeeping; a run saved when they
    were `prompts.eval_path` / `prompts.num_eval` (and `ppo.samples_per_prompt`) resumes unchanged."""
    from tempax.algorithms.ppo.config import PPOConfig

    def ppo(**eval_section):
        return from_dict(PPOConfig, {"train": {"run_dir": str(tmp_path)}, "eval": eval_section})

    save(str(tmp_path), ppo())
    saved = read_yaml(tmp_path / "config.yaml")
    saved["prompts"] = saved.pop("data")
    saved["prompts"]["num_eval"] = saved["eval"].pop("num_prompts")
    saved["ppo"]["samples_per_prompt"] = saved["ppo"].pop("group_size")
    (tmp_path / "config.yaml").write_text(json.dumps(saved))
    os.makedirs(tmp_path / "checkpoints" / "2")
    assert save(str(tmp_path), ppo()) == []
    with pytest.raises(ConfigError, match=r"\n  eval.num_prompts: 64 -> 8\n"):
        save(str(tmp_path), ppo(num_prompts=8))
    assert [(c.key, c.trajectory) for c in save(str(tmp_path), ppo(batch_size=4))] == [
        ("eval.batch_size", False)]
    saved, new = {"data": {"eval_path": "a.jsonl"}}, {"data": {"eval_path": "b.jsonl"}}
    assert [c.trajectory for c in config_changes(saved, new)] == [False]
    assert [c.trajectory for c in config_changes(saved, new, trajectory_keys=PPOConfig.TRAJECTORY_KEYS)] == [True]


def test_a_failed_start_leaves_nothing_behind(tmp_path):
    from tempax.train.run_identity import clean_failed_start

    run = tmp_path / "run"
    with pytest.raises(ConfigError):
        with clean_failed_start(str(run)):
            save(str(run), _cfg(run))
            os.makedirs(run / "tokenizer")
            (run / "metrics.jsonl").write_text("")  # opened, never written
            raise ConfigError("the data is too small")
    assert not run.exists()
    # A run dir with training in it keeps everything, old and new.
    os.makedirs(run / "checkpoints" / "2")
    (run / "keep.txt").write_text("x")
    with pytest.raises(ConfigError):
        with clean_failed_start(str(run)):
            (run / "new.txt").write_text("y")
            raise ConfigError("later failure")
    assert sorted(os.listdir(run)) == ["checkpoints", "keep.txt", "new.txt"]
