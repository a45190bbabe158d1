"""A run dir as a model source (`tempax.train.run_model`), told by `describe` what the run is: each layout a record
can state, and a run dir that cannot give a model (yet) in one line naming the dir and the command that makes one;
a run dir never loads as plain model files (`tempax.models.registry`). The `describe` the commands use, which reads
the run's command and its record: tests/algorithms/test_run_dirs.py; what the commands print:
tests/cli/test_generate.py."""

from __future__ import annotations

import numpy as np
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


# -- what loading a trained run computes -------------------------------------------------------------------------


def _trained_run(tmp_path, name: str, lora: dict | None, *, seed: int = 3) -> tuple[str, dict]:
    """A run dir of `preset:tiny-llama` (seed `seed`) trained one step, LoRA when `lora` is given, its checkpoint
    saved; (run dir, the trainer's float32 trainable arrays)."""
    import jax
    from flax import nnx

    from tempax.algorithms.sft.main import make_sft_loss
    from tempax.configlib import from_dict
    from tempax.models.init import init_decoder
    from tempax.models.lora import LoraConfig, apply_lora, lora_filter
    from tempax.models.presets import get_preset
    from tempax.train.config import CheckpointConfig
    from tempax.train.loop import Trainer
    from tests.train.helpers import random_batch, tiny_train_config

    folder = _run_dir(tmp_path, name, {"model": {"source": "preset:tiny-llama"}, "lora": lora,
                                       "train": {"seed": seed}})
    model = init_decoder(get_preset("tiny-llama"), seed)
    if lora is not None:
        model = apply_lora(model, from_dict(LoraConfig, lora), rngs=nnx.Rngs(seed + 1))
    trainer = Trainer(model, make_sft_loss(), tiny_train_config(
        folder, steps=1, checkpoint=CheckpointConfig(every=0, save_at_end=True, async_save=False)),
        trainable=nnx.Param if lora is None else lora_filter)
    trainer.fit([random_batch(8, 16, seed=1)])
    params = {k: np.asarray(jax.device_get(v)) for k, v in trainer.params.items()}
    trainer.close()
    return folder, params


def _flat(model) -> dict:
    import jax
    from flax import nnx

    return {k: np.asarray(jax.device_get(v.get_value())) for k, v in nnx.to_flat_state(nnx.state(model))}


@pytest.mark.heavy
def test_a_lora_run_loads_as_applying_restoring_and_merging_eagerly_would_in_one_program(tmp_path, monkeypatch):
    """The merged model of a LoRA run equals, bit for bit, the base with adapters applied, the checkpoint's
    adapters put in and `merge_lora` run eagerly (the reference below); the merge runs traced (one compiled
    program, not an eager operation per weight), and unmerged the adapters are the trainer's."""
    import jax
    from flax import nnx

    from tempax.models import lora as lora_module
    from tempax.models.init import init_decoder
    from tempax.models.lora import LoraConfig, apply_lora, lora_filter, merge_lora
    from tempax.models.presets import get_preset
    from tempax.train.state import ModelParts

    run, trained = _trained_run(tmp_path, "lora", {"rank": 4, "alpha": 8.0})
    parts, params = ModelParts.split(apply_lora(init_decoder(get_preset("tiny-llama"), 3), LoraConfig(rank=4, alpha=8.0),
                                                rngs=nnx.Rngs(0)), lora_filter)
    want = _flat(merge_lora(parts.merge({k: jax.numpy.asarray(v).astype(params[k].dtype) for k, v in trained.items()})))
    traced = []
    original = lora_module.merge_lora

    def recording_merge(model):
        traced.append(isinstance(model.embed_tokens.embedding.get_value(), jax.core.Tracer))
        return original(model)

    monkeypatch.setattr(lora_module, "merge_lora", recording_merge)
    got = _flat(load_run(run, describe=told("sft")).model)
    assert traced == [True]
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=str(key))
    adapters = load_run(run, describe=told("sft"), merge=False).model
    unmerged = {k: np.asarray(v) for k, v in ModelParts.split(adapters, lora_filter)[1].items()}
    assert unmerged.keys() == trained.keys()
    for key in trained:
        np.testing.assert_array_equal(unmerged[key], trained[key], err_msg=key)


def test_a_full_run_over_a_preset_restores_every_weight_without_drawing_the_base(tmp_path, monkeypatch):
    """A full fine-tune's checkpoint holds every weight, so its random `preset:` base is never initialised (the
    initialiser is not called); the loaded weights are the trainer's."""
    from tempax.models import init as model_init

    run, trained = _trained_run(tmp_path, "full", None)
    calls = []
    monkeypatch.setattr(model_init, "init_decoder", lambda *a, **k: calls.append(a))
    got = _flat(load_run(run, describe=told("sft")).model)
    assert calls == []
    assert {".".join(map(str, k)) for k in got} == set(trained)
    for key, value in got.items():
        np.testing.assert_array_equal(value, trained[".".join(map(str, key))].astype(value.dtype), err_msg=str(key))


@pytest.mark.heavy
def test_a_run_with_its_own_tokenizer_folder_loads_only_that_tokenizer(tmp_path, monkeypatch):
    """The run's tokenizer/ folder is the tokenizer; the model section's `tokenizer` is not loaded beside it."""
    from tempax.models import registry
    from tests.kit.tokenizers import tiny_chat_tokenizer

    run, _ = _trained_run(tmp_path, "tok", {"rank": 2, "alpha": 4.0})
    tiny_chat_tokenizer().hf.save_pretrained(f"{run}/tokenizer")
    config = yaml.safe_load(open(f"{run}/config.yaml"))
    config["model"]["tokenizer"] = "smollm2-135m-instruct"
    (tmp_path / "tok" / "config.yaml").write_text(yaml.safe_dump(config))
    loaded = []
    original = registry.load_tokenizer
    monkeypatch.setattr(registry, "load_tokenizer", lambda source: loaded.append(source) or original(source))
    trained = load_run(run, describe=told("sft"))
    assert loaded == [f"{run}/tokenizer"]
    assert trained.tokenizer.vocab_size == tiny_chat_tokenizer().vocab_size
