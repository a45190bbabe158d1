"""Phi-3's fused checkpoint tensors (`tempax.models.fused`): split on loading, joined on saving."""

from __future__ import annotations

import numpy as np
import pytest

from tempax.errors import CheckpointError
from tempax.models.fused import fuse_tensors, fused_projections, split_fused_tensors
from tests.kit.models import tiny_config


def test_qkv_and_gate_up_split_by_hand():
    """tiny-phi3: 4 heads and 2 kv heads of 16 features, MLP width 96. qkv_proj [64 + 32 + 32, 64] splits into rows
    0-63 (q), 64-95 (k), 96-127 (v); gate_up_proj [192, 64] into rows 0-95 (gate) and 96-191 (up). The fused tensor
    is read once for its three parts; other tensors pass through untouched."""
    cfg = tiny_config("phi3")
    qkv = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    gate_up = -np.arange(192 * 64, dtype=np.float32).reshape(192, 64)
    norm = np.ones(64, np.float32)
    reads = []

    def loader(name, array):
        def load():
            reads.append(name)
            return array
        return load

    tensors = [("model.layers.0.self_attn.qkv_proj.weight", loader("qkv", qkv)),
               ("model.layers.0.mlp.gate_up_proj.weight", loader("gate_up", gate_up)),
               ("model.layers.0.input_layernorm.weight", loader("norm", norm))]
    split = {name: load() for name, load in split_fused_tensors(tensors, cfg)}
    assert list(split) == ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                           "model.layers.0.self_attn.v_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                           "model.layers.0.mlp.up_proj.weight", "model.layers.0.input_layernorm.weight"]
    np.testing.assert_array_equal(split["model.layers.0.self_attn.q_proj.weight"], qkv[:64])
    np.testing.assert_array_equal(split["model.layers.0.self_attn.k_proj.weight"], qkv[64:96])
    np.testing.assert_array_equal(split["model.layers.0.self_attn.v_proj.weight"], qkv[96:])
    np.testing.assert_array_equal(split["model.layers.0.mlp.gate_proj.weight"], gate_up[:96])
    np.testing.assert_array_equal(split["model.layers.0.mlp.up_proj.weight"], gate_up[96:])
    assert reads == ["qkv", "gate_up", "norm"]
    fused = dict(fuse_tensors(split.items(), cfg))
    assert set(fused) == {name for name, _ in tensors}
    np.testing.assert_array_equal(fused["model.layers.0.self_attn.qkv_proj.weight"], qkv)
    np.testing.assert_array_equal(fused["model.layers.0.mlp.gate_up_proj.weight"], gate_up)


def test_families_without_fused_files_pass_through():
    assert fused_projections(tiny_config("llama")) == {}
    tensors = [("model.layers.0.self_attn.q_proj.weight", np.zeros((64, 64)))]
    assert list(fuse_tensors(tensors, tiny_config("llama"))) == tensors


def test_a_fused_tensor_of_the_wrong_size_names_its_parts():
    cfg = tiny_config("phi3")
    tensors = [("model.layers.2.self_attn.qkv_proj.weight", lambda: np.zeros((100, 64), np.float32))]
    loads = [load for _, load in split_fused_tensors(tensors, cfg)]
    with pytest.raises(CheckpointError, match=r"'model.layers.2.self_attn.qkv_proj.weight' has 100 rows but the "
                                              r"config implies 64 \(q_proj\) \+ 32 \(k_proj\) \+ 32 \(v_proj\) = 128"):
        loads[0]()
    with pytest.raises(CheckpointError, match="lack some of their parts"):
        list(fuse_tensors([("model.layers.0.mlp.gate_proj.weight", np.zeros((96, 64)))], cfg))
