"""A run dir read through the registry (`tempax.algorithms.run_dirs`): config.yaml names the run's command, the
command's record says where the run keeps its model, and a run saved before config.yaml named its command is
recognised from its config's shape, once, here. The layouts themselves: tests/train/test_run_model.py; a trained
run loaded with and without its `command:` line: tests/cli/test_train_cmds.py."""

from __future__ import annotations

import pytest

from tempax.algorithms import registry
from tempax.algorithms.run_dirs import describe, infer_command, load_run, load_source, shape_source
from tempax.configlib import dump_yaml
from tempax.errors import ConfigError
from tempax.train.run_model import RunHasNoModel
from tests.train.test_run_model import _run_dir


def _written(tmp_path, name: str, command: str, *, record_command: bool) -> str:
    """A run dir whose config.yaml is `command`'s default config, as start_run writes it (with its `command:`
    line) or as it wrote it before (without)."""
    cfg = registry.load_recipe(command)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.yaml").write_text(dump_yaml(cfg, command=command if record_command else None))
    return str(folder)


@pytest.mark.parametrize("command", sorted(registry.algorithms()))
def test_every_command_is_read_back_from_its_run_dir_recorded_or_not(tmp_path, command):
    """Every registered command: the `command:` line names it, and without the line (a run saved before it) the
    config's shape does (sft and pretrain, of one shape, by their defaults)."""
    recorded = _written(tmp_path, "new", command, record_command=True)
    older = _written(tmp_path, "old", command, record_command=False)
    for run_dir in (recorded, older):
        kind = describe(run_dir)
        assert (kind.command, kind.model) == (command, registry.get(command).model), run_dir


def test_an_older_run_with_a_partial_config_is_named_by_the_section_only_its_command_has():
    """Hand-written and cut-short configs of older runs: the section one command's config alone has names it."""
    assert infer_command({"model": {"source": "x"}, "reward": {"margin": 0.0}, "train": {}}) == "reward-model"
    assert infer_command({"teacher": {"source": "x"}, "student": {}}) == "distill"
    assert infer_command({"model": {"source": "x"}, "lora": {"rank": 4}, "ppo": {}}) == "ppo"
    assert infer_command({"grpo": {}}) == "grpo" and infer_command({"kto": {}}) == "kto"
    assert infer_command({"no_such_section": {}}) is None


def test_a_run_of_an_unknown_command_or_of_no_known_shape_is_one_clear_error(tmp_path):
    unknown = _run_dir(tmp_path, "plugin", {"command": "myalgo", "model": {"source": "x"}})
    with pytest.raises(ConfigError, match=r"is a run of `tempax myalgo`, which is not a training command here; "
                                          r"available: .*sft"):
        describe(unknown)
    shapeless = _run_dir(tmp_path, "odd", {"no_such_section": {}})
    with pytest.raises(ConfigError, match=r"names no command \(`command:`\) .* add a line `command: <the command"):
        describe(shapeless)


@pytest.mark.parametrize("record_command", [True, False])
def test_runs_without_a_model_yet_name_the_command_that_makes_one(tmp_path, record_command):
    """What the records say, recorded or inferred: a reward model has no policy; an unfinished distillation has
    no student/ folder yet; a LoRA PPO run has no adapters/ until it finishes, a full-weight one none at all."""
    def run(name: str, command: str, **sections) -> str:
        folder = _written(tmp_path, name, command, record_command=record_command)
        if sections:
            import yaml

            path = f"{folder}/config.yaml"
            raw = yaml.safe_load(open(path))
            raw.update(sections)
            open(path, "w").write(yaml.safe_dump(raw, sort_keys=False))
        return folder

    rm = run("rm", "reward-model")
    with pytest.raises(RunHasNoModel, match=f"{rm} is a reward-model run: .* score with `tempax score {rm}`"):
        load_source(rm)
    kd = run("kd", "distill")
    with pytest.raises(RunHasNoModel, match=rf"no student/ folder yet: .*`tempax distill --config {kd}/config.yaml`"):
        load_run(kd)
    with pytest.raises(RunHasNoModel, match="no student/ folder yet"):
        shape_source(kd)
    ppo = run("ppo", "ppo", lora={"rank": 4, "alpha": 8.0})
    with pytest.raises(RunHasNoModel, match=rf"has no adapters/ yet: .*value head.*`tempax ppo --config {ppo}/config.yaml`"):
        load_run(ppo)
    full = run("ppo_full", "ppo", lora=None)
    with pytest.raises(RunHasNoModel, match="full-weight run with no model of its own: .* smollm2-135m-instruct"):
        load_run(full)
