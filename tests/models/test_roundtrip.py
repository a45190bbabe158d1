"""Checkpoint round trips with transformers: tempax save -> transformers load, transformers save -> tempax load.

Logits are compared in float32 at the parity tolerance (1e-4); weights that only pass through files must come
back bit-identical (or exactly bfloat16-rounded for a bfloat16 save).
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tempax.models.hf_io import load_hf_checkpoint, save_hf_checkpoint  # noqa: E402
from tempax.models.weights import iter_hf_tensors  # noqa: E402
from tests.kit.models import TINY_FAMILIES, TINY_MOE_FAMILIES, family_cases, hf_reference_pair, random_ids  # noqa: E402
from tests.models.test_gguf import perturbed_model  # noqa: E402

TOL = 1e-4
pytestmark = pytest.mark.needs_torch


def _torch_logits(ref, ids) -> np.ndarray:
    with torch.no_grad():
        return ref(torch.tensor(ids, dtype=torch.long)).logits.float().numpy()


def _tempax_logits(model, ids) -> np.ndarray:
    return np.asarray(model(jnp.asarray(ids))[0])


def _weights(model) -> dict[str, np.ndarray]:
    return dict(iter_hf_tensors(model))


@pytest.mark.parametrize("family", family_cases(TINY_FAMILIES + TINY_MOE_FAMILIES))
def test_tempax_save_loads_in_transformers(tmp_path, family):
    """save_hf_checkpoint -> AutoModelForCausalLM.from_pretrained gives the tempax logits; loading back is exact.
    Mixture-of-experts layers are written as transformers' save_pretrained writes them (per-expert tensors for
    Qwen3-MoE and Mixtral, fused interleaved ones for gpt-oss)."""
    model = perturbed_model(family)
    save_hf_checkpoint(model, str(tmp_path))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    ids = random_ids((2, 11))  # longer than the tiny sliding window (4)
    np.testing.assert_allclose(_torch_logits(ref, ids), _tempax_logits(model, ids), atol=TOL, rtol=0)
    back = load_hf_checkpoint(str(tmp_path))
    assert back.config == model.config
    want, got = _weights(model), _weights(back)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_sharded_save_round_trips(tmp_path):
    """A 64 KiB shard limit splits the tiny llama (~436 KB) into several files plus an index both libraries read."""
    model = perturbed_model("llama")
    save_hf_checkpoint(model, str(tmp_path), max_shard_bytes=64 * 2**10)
    shards = sorted(n for n in os.listdir(tmp_path) if n.endswith(".safetensors"))
    assert len(shards) > 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    with open(tmp_path / "model.safetensors.index.json") as f:
        index = json.load(f)
    assert set(index["weight_map"]) == set(_weights(model))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    ids = random_ids((2, 9))
    np.testing.assert_allclose(_torch_logits(ref, ids), _tempax_logits(model, ids), atol=TOL, rtol=0)
    back = load_hf_checkpoint(str(tmp_path))
    for name, w in _weights(model).items():
        np.testing.assert_array_equal(_weights(back)[name], w, err_msg=name)


def test_bfloat16_save(tmp_path):
    """dtype="bfloat16" writes bfloat16 tensors (each weight rounded once) that both libraries load alike."""
    model = perturbed_model("qwen3")
    save_hf_checkpoint(model, str(tmp_path), dtype="bfloat16")
    with open(tmp_path / "config.json") as f:
        assert json.load(f)["torch_dtype"] == "bfloat16"
    back = load_hf_checkpoint(str(tmp_path))  # upcast to the config's float32 param dtype
    for name, w in _weights(model).items():
        rounded = w.astype(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_array_equal(_weights(back)[name], rounded, err_msg=name)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    ids = random_ids((2, 9))
    np.testing.assert_allclose(_torch_logits(ref, ids), _tempax_logits(back, ids), atol=TOL, rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_transformers_sharded_save_loads_in_tempax(tmp_path, dtype):
    """transformers' own sharded save (and a bfloat16 one) -> tempax gives transformers' logits."""
    ref, _ = hf_reference_pair("gemma2")
    ref = ref.to(getattr(torch, dtype))
    ref.save_pretrained(str(tmp_path), max_shard_size="100KB")
    assert os.path.isfile(tmp_path / "model.safetensors.index.json")
    model = load_hf_checkpoint(str(tmp_path), param_dtype="float32")
    ref32 = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    ids = random_ids((2, 11))
    np.testing.assert_allclose(_tempax_logits(model, ids), _torch_logits(ref32, ids), atol=TOL, rtol=0)
