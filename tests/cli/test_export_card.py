"""`tempax export` of a trained run to a Hugging Face folder and a GGUF file, each with its model card.

One tiny LoRA SFT run (the `workspace` recipe: 8 rows, 3 steps) gets a held-out before/after summary in the
layout `Run.report_held_out` writes; both exports must carry the run's facts, and the GGUF must hold the same
merged model as the folder.
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from tempax.cli.main import main
from tests.cli.test_train_cmds import workspace  # noqa: F401  (the fixture: a tiny LoRA recipe)

EVAL_SUMMARY = {"before": {"loss": 5.9911, "accuracy": 0.125}, "after": {"loss": 5.7984, "accuracy": 0.25}}


@pytest.fixture(scope="module")
def trained_run(workspace, tmp_path_factory):  # noqa: F811
    root, recipe, _ = workspace
    run = tmp_path_factory.mktemp("card") / "run"
    assert main(["sft", "--config", str(recipe), f"train.run_dir={run}"]) == 0
    (run / "eval_summary.json").write_text(json.dumps(EVAL_SUMMARY))
    return run


def _front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text[4:].split("\n---\n", 1)[0])


def test_hf_folder_has_a_model_card(trained_run, tmp_path):
    out = tmp_path / "hf"
    assert main(["export", str(trained_run), str(out)]) == 0
    text = (out / "README.md").read_text()
    front = _front_matter(text)
    assert front == {"library_name": "transformers", "tags": ["tempax", "sft", "lora"],
                     "pipeline_tag": "text-generation"}  # a preset base: no Hub repo, no license to name
    assert "# preset:tiny-llama fine-tuned with tempax sft" in text
    assert "trained by tempax sft with LoRA (rank 4, alpha 8.0, merged) for 3 steps." in text
    data_path = yaml.safe_load((trained_run / "config.yaml").read_text())["data"]["path"]
    assert f"| `{data_path}` | 8 | 8 |" in text
    assert "| optimizer.learning_rate | 0.05 |" in text and "| steps | 3 |" in text
    assert "| loss | 5.991 | 5.798 |" in text and "| accuracy | 0.125 | 0.25 |" in text
    assert "- jax " in text and "- tempax " in text
    assert "tempax sft --config tempax_config.yaml" in text
    assert f"tempax export {trained_run} {out}" in text
    assert (out / "tempax_config.yaml").read_text() == (trained_run / "config.yaml").read_text()


def test_gguf_has_the_card_and_the_merged_model(trained_run, tmp_path):
    from tempax.models.gguf_io import load_gguf, read_gguf_header
    from tempax.models.registry import load

    assert main(["export", str(trained_run), str(tmp_path / "hf")]) == 0
    assert main(["export", str(trained_run), str(tmp_path / "m.gguf"), "--quant", "f32"]) == 0
    meta = read_gguf_header(tmp_path / "m.gguf").metadata
    assert meta["general.name"] == "preset:tiny-llama fine-tuned with tempax sft"
    assert list(meta["general.tags"]) == ["tempax", "sft", "lora"]
    assert meta["general.base_model.0.name"] == "preset:tiny-llama"
    assert meta["general.training.algorithm"] == "sft" and meta["general.training.steps"] == 3
    assert meta["general.training.recipe"] == (trained_run / "config.yaml").read_text()
    assert json.loads(meta["general.training.evaluation"]) == EVAL_SUMMARY
    (data,) = json.loads(meta["general.training.data"])
    assert data["rows"] == 8 and data["rows_after_cleaning"] == 8
    assert meta["general.dataset.0.name"] == data["path"]
    assert json.loads(meta["general.training.hyperparameters"])["optimizer.learning_rate"] == 0.05
    assert "jax" in json.loads(meta["general.training.framework_versions"])
    assert meta["general.training.command"] == "tempax sft --config config.yaml"
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    folder_model, folder_tok = load(str(tmp_path / "hf"))
    gguf_model, gguf_tok = load(str(tmp_path / "m.gguf"))
    ids = jnp.asarray([folder_tok.encode("What is the capital of France?")])
    np.testing.assert_allclose(np.asarray(gguf_model(ids)[0]), np.asarray(folder_model(ids)[0]), rtol=1e-6,
                               atol=1e-6)
    assert gguf_tok.encode("Hi there! 123") == folder_tok.encode("Hi there! 123")


def test_a_gguf_under_any_file_name_loads_back(trained_run, tmp_path):
    """`--gguf` writes the name the user gives; `tempax.load` and the tokenizer know the file by its magic."""
    from tempax.models.registry import load

    assert main(["export", str(trained_run), str(tmp_path / "m.gguf"), "--quant", "f32"]) == 0
    assert main(["export", str(trained_run), str(tmp_path / "model.bin"), "--gguf", "--quant", "f32"]) == 0
    named_model, named_tok = load(str(tmp_path / "m.gguf"))
    bin_model, bin_tok = load(str(tmp_path / "model.bin"))
    ids = jnp.asarray([named_tok.encode("What is the capital of France?")])
    np.testing.assert_array_equal(np.asarray(bin_model(ids)[0]), np.asarray(named_model(ids)[0]))
    assert bin_tok.encode("Hi there! 123") == named_tok.encode("Hi there! 123")


def test_export_from_a_model_source_and_bad_requests(trained_run, tmp_path, capfd):
    hf = tmp_path / "hf"
    assert main(["export", str(trained_run), str(hf)]) == 0
    assert main(["export", str(hf), str(tmp_path / "again.gguf")]) == 0  # any model source, not only runs
    capfd.readouterr()
    assert main(["export", str(hf), str(tmp_path / "x"), "--quant", "q8_0"]) == 2
    assert "--quant applies to GGUF files; add --gguf" in capfd.readouterr().err
    assert main(["export", "preset:tiny-gemma2", str(tmp_path / "g.gguf")]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "cannot export this gemma2 model to GGUF: query_pre_attn_scalar=24" in err
