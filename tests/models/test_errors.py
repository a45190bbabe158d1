"""Broken inputs give a TempaxError whose message names the file or name and the problem."""

from __future__ import annotations

import json
import os
import shutil

import gguf
import numpy as np
import pytest

from tempax.errors import CheckpointError, TempaxError
from tempax.models.gguf_io import load_gguf, read_gguf_header
from tempax.models.hf_io import save_hf_checkpoint
from tempax.models.registry import load_model
from tests.models.test_gguf import perturbed_model, write_gguf


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("good"))
    save_hf_checkpoint(perturbed_model("llama"), folder)
    return folder


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    return write_gguf(str(tmp_path_factory.mktemp("gguf") / "tiny.gguf"), perturbed_model("llama"), qtype="Q8_0")


def _copy(folder: str, tmp_path) -> str:
    dst = str(tmp_path / "ckpt")
    shutil.copytree(folder, dst)
    return dst


def _edit_config(folder: str, **changes) -> None:
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        hf = json.load(f)
    hf.update(changes)
    with open(path, "w") as f:
        json.dump(hf, f)


def _truncate(path: str, keep: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(keep)


def test_missing_config_json(hf_folder, tmp_path):
    folder = _copy(hf_folder, tmp_path)
    os.remove(os.path.join(folder, "config.json"))
    with pytest.raises(CheckpointError, match="config.json not found") as e:
        load_model(folder)
    assert folder in str(e.value)


def test_invalid_config_json(hf_folder, tmp_path):
    folder = _copy(hf_folder, tmp_path)
    with open(os.path.join(folder, "config.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(CheckpointError, match="is not valid JSON") as e:
        load_model(folder)
    assert os.path.join(folder, "config.json") in str(e.value)


def test_unsupported_architecture_in_config_json(hf_folder, tmp_path):
    folder = _copy(hf_folder, tmp_path)
    _edit_config(folder, model_type="mamba", architectures=["MambaForCausalLM"])
    with pytest.raises(CheckpointError, match=r"unsupported architecture model_type='mamba'.*supports: llama") as e:
        load_model(folder)
    assert os.path.join(folder, "config.json") in str(e.value)


def test_unsupported_architecture_in_gguf(tmp_path):
    path = str(tmp_path / "mamba.gguf")
    w = gguf.GGUFWriter(path, "mamba")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match=r"unsupported architecture general.architecture='mamba'") as e:
        load_model(path)
    assert path in str(e.value)


def test_config_and_tensor_shapes_disagree(hf_folder, tmp_path):
    folder = _copy(hf_folder, tmp_path)
    _edit_config(folder, intermediate_size=128)  # the weights were saved with 96
    with pytest.raises(CheckpointError, match=r"has shape .* but the config implies") as e:
        load_model(folder)
    msg = str(e.value)
    assert folder in msg and "mlp" in msg and "128" in msg


def test_gguf_metadata_and_tensor_shapes_disagree(tmp_path):
    path = write_gguf(str(tmp_path / "bad.gguf"), perturbed_model("qwen2"))
    header = read_gguf_header(path)
    # Rewrite the file with a wrong feed_forward_length; tensors untouched.
    reader = gguf.GGUFReader(path)
    w = gguf.GGUFWriter(str(tmp_path / "bad2.gguf"), "qwen2")
    for key, value in header.metadata.items():
        if key.startswith("qwen2."):
            field = reader.fields[key]
            if key == "qwen2.feed_forward_length":
                value = 128
            w.add_key_value(key, value, field.types[0])
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match=r"ffn|mlp") as e:
        load_gguf(str(tmp_path / "bad2.gguf"))
    assert "bad2.gguf" in str(e.value) and "128" in str(e.value)


def test_missing_tensor(hf_folder, tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = _copy(hf_folder, tmp_path)
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path)
    with pytest.raises(CheckpointError, match=r"1 weights of the model are missing.*layers.1.mlp.up_proj") as e:
        load_model(folder)
    assert folder in str(e.value)


def test_truncated_safetensors(hf_folder, tmp_path):
    folder = _copy(hf_folder, tmp_path)
    path = os.path.join(folder, "model.safetensors")
    _truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(CheckpointError, match="is truncated") as e:
        load_model(folder)
    assert path in str(e.value)
    _truncate(path, 5)
    with pytest.raises(CheckpointError, match="too short for a safetensors header"):
        load_model(folder)


@pytest.mark.parametrize("keep", ["half", "header", 100, 10])
def test_truncated_gguf(gguf_file, tmp_path, keep):
    """Cut in the tensor data, right after the header, inside the metadata, inside the magic/version."""
    path = str(tmp_path / "cut.gguf")
    shutil.copy(gguf_file, path)
    size = os.path.getsize(path)
    first = min(t.offset for t in read_gguf_header(path).tensors.values())
    _truncate(path, {"half": size // 2, "header": first}.get(keep, keep))
    with pytest.raises(CheckpointError, match="truncated") as e:
        load_model(path)
    assert path in str(e.value)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(CheckpointError, match="is not a GGUF file") as e:
        load_model(str(path))
    assert str(path) in str(e.value)


def test_corrupt_gguf_counts(gguf_file, tmp_path):
    """A header claiming 2^60 metadata entries fails cleanly instead of allocating."""
    path = str(tmp_path / "corrupt.gguf")
    shutil.copy(gguf_file, path)
    with open(path, "r+b") as f:
        f.seek(16)  # magic(4) version(4) n_tensors(8) -> n_kv
        f.write((2**60).to_bytes(8, "little"))
    with pytest.raises(CheckpointError, match="truncated or corrupt") as e:
        load_model(path)
    assert path in str(e.value)


def test_unknown_model_name():
    with pytest.raises(TempaxError, match=r"unknown model 'smolm2-135m-instruct'\. Did you mean smollm2-135m-instruct"):
        load_model("smolm2-135m-instruct")


def test_a_plain_file_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 10)
    with pytest.raises(CheckpointError, match=r"weights.bin is a file but not a GGUF file"):
        load_model(str(path))
