"""Projections a family's checkpoints store fused: Phi-3's `qkv_proj` (the q, k and v rows stacked) and `gate_up_proj`
(the gate rows, then the up rows).

tempax keeps them as separate projections (`q_proj`, `k_proj`, `v_proj`, `gate_proj`, `up_proj`), so LoRA targets,
QLoRA, sharding rules and the ops see one layout for every family; the fused form exists only in the files.
Loading splits each fused tensor into its parts (`split_fused_tensors`, streaming: one fused tensor in memory at a
time) and saving joins them again (`fuse_tensors`), both in Hugging Face's [out, in] layout, where the parts are
consecutive row blocks. llama.cpp's Phi-3 files fuse the same way (`attn_qkv`, and `ffn_up` holding gate then up).
"""

from __future__ import annotations

import re
from typing import Callable, Container, Iterable, Iterator

import numpy as np

from tempax.errors import CheckpointError
from tempax.models.config import ModelConfig

_LAYER_TENSOR = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
Part = tuple[str, int]  # (layer-relative module name, output rows)


def fused_projections(cfg: ModelConfig) -> dict[str, tuple[Part, ...]]:
    """{fused module: its parts in row order} of the model's family (empty when its checkpoints fuse nothing)."""
    if cfg.family != "phi3":
        return {}
    q, kv, m = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    return {
        "self_attn.qkv_proj": (("self_attn.q_proj", q), ("self_attn.k_proj", kv), ("self_attn.v_proj", kv)),
        "mlp.gate_up_proj": (("mlp.gate_proj", m), ("mlp.up_proj", m)),
    }


def _layer_module(name: str, modules: Container[str]) -> tuple[str, str, str] | None:
    """(layer, module, "weight" or "bias") of a decoder-layer tensor whose module is one of `modules`, else None."""
    m = _LAYER_TENSOR.match(name)
    return m.groups() if m and m.group(2) in modules else None


class _SharedLoad:
    """One fused tensor read once and handed out as row blocks, then released after the last block."""

    def __init__(self, name: str, load: Callable[[], np.ndarray], parts: tuple[Part, ...]):
        self.name, self.load, self.parts = name, load, parts
        self.array: np.ndarray | None = None
        self.left = len(parts)

    def rows(self, start: int, stop: int) -> np.ndarray:
        if self.array is None:
            self.array = self.load()
            want = sum(rows for _, rows in self.parts)
            if self.array.shape[0] != want:
                sizes = " + ".join(f"{rows} ({module.rsplit('.', 1)[-1]})" for module, rows in self.parts)
                raise CheckpointError(f"fused tensor {self.name!r} has {self.array.shape[0]} rows but the config "
                                      f"implies {sizes} = {want}; the config and the weights disagree")
        block = np.array(self.array[start:stop])
        self.left -= 1
        if not self.left:
            self.array = None
        return block


def split_fused_tensors(tensors: Iterable[tuple[str, Callable[[], np.ndarray]]],
                        cfg: ModelConfig) -> Iterator[tuple[str, Callable[[], np.ndarray]]]:
    """(name, loader) pairs with every fused tensor of the family replaced by its parts' (one loader each, in row
    order; the fused tensor is read by the first and dropped after the last). Other tensors pass through."""
    fused = fused_projections(cfg)
    for name, load in tensors:
        found = _layer_module(name, fused)
        if found is None:
            yield name, load
            continue
        layer, module, kind = found
        shared = _SharedLoad(name, load, fused[module])
        start = 0
        for part, rows in fused[module]:
            yield f"model.layers.{layer}.{part}.{kind}", (lambda a=start, b=start + rows, s=shared: s.rows(a, b))
            start += rows


def fuse_tensors(tensors: Iterable[tuple[str, np.ndarray]], cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
    """(name, array) pairs with each group of parts joined into the family's fused tensor, as its checkpoints store
    it (inverse of `split_fused_tensors`); a fused tensor is yielded once its last part has passed."""
    fused = fused_projections(cfg)
    owner = {part: (module, i) for module, parts in fused.items() for i, (part, _) in enumerate(parts)}
    pending: dict[tuple[str, str, str], dict[int, np.ndarray]] = {}
    for name, array in tensors:
        found = _layer_module(name, owner)
        if found is None:
            yield name, array
            continue
        layer, part, kind = found
        module, index = owner[part]
        group = pending.setdefault((layer, module, kind), {})
        group[index] = array
        if len(group) == len(fused[module]):
            del pending[(layer, module, kind)]
            yield f"model.layers.{layer}.{module}.{kind}", np.concatenate([group[i] for i in range(len(group))])
    if pending:
        missing = sorted(f"model.layers.{layer}.{module}.{kind}" for layer, module, kind in pending)
        raise CheckpointError(f"fused tensors {missing[:4]} lack some of their parts")
