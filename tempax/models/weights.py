"""Mapping between Hugging Face tensor names and tempax parameters, and filling a model tensor by tensor.

Hugging Face Linear weights are [out, in]; tempax kernels are [in, out], so linear weights are transposed on
the way in and out. Everything else keeps its shape. Loading fills an abstract model (no memory allocated
up front) one tensor at a time, so peak host memory stays near the model's own size.

A mixture-of-experts layer's tensors (`tempax.models.moe`: per-expert ones for Qwen3-MoE and Mixtral, fused ones
for gpt-oss) fill slots of the stacked expert arrays [L, E, in, out] (`hf_moe_tensor_to_path`); export writes the
names transformers' `save_pretrained` writes (`moe_params_to_hf_tensors`).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tempax.errors import CheckpointError
from tempax.models.config import LAYER_STACKS, ModelConfig
from tempax.models.decoder import Decoder, DecoderLayer, PerLayerInputs, abstract_stack, as_dtype, is_stacked
from tempax.models.moe import (MoeTensorSlot, fill_slot, hf_moe_tensor_to_path, moe_params_to_hf_tensors,
                               moe_path_to_hf)

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")



def text_model_name(name: str) -> str:
    """A multimodal checkpoint's text-model tensor under the causal LM's name (Qwen3.5's published checkpoints:
    `model.language_model.layers.0...` -> `model.layers.0...`); other names unchanged (the vision tower's and the
    multi-token-prediction head's are then not weights of the model, and are skipped)."""
    prefix = "model.language_model."
    return "model." + name[len(prefix):] if name.startswith(prefix) else name


def hf_to_path(name: str) -> tuple[tuple[Any, ...], bool] | None:
    """(parameter path in the nnx model, transpose?) for a Hugging Face tensor name; None if not a weight we use."""
    if name == "model.embed_tokens.weight":
        return ("embed_tokens", "embedding"), False
    if name == "model.norm.weight":
        return ("norm", "weight"), False
    if name == "lm_head.weight":
        return ("lm_head", "kernel"), True
    if name in _PER_LAYER_INPUTS:
        return _PER_LAYER_INPUTS[name]
    m = _LAYER.match(name)
    if not m:
        return None
    i, rest = int(m.group(1)), m.group(2)
    parts = rest.split(".")
    if parts[-1] == "weight" and (parts[-2].endswith("_proj") or parts[-2].startswith("in_proj_")):
        return ("layers", i, *parts[:-1], "kernel"), True
    if parts[-1] == "bias" and parts[-2].endswith("_proj"):
        return ("layers", i, *parts[:-1], "bias"), False
    if parts[-1] == "weight" and parts[-2].endswith("norm"):
        return ("layers", i, *parts), False
    if parts == ["self_attn", "sinks"]:  # gpt-oss's attention sinks [num_heads]
        return ("layers", i, *parts), False
    if parts in (["per_layer_input_gate", "weight"], ["per_layer_projection", "weight"]):  # Gemma 4's
        return ("layers", i, parts[0], "kernel"), True
    if parts == ["layer_scalar"]:  # Gemma 4's per-layer output scale [1]
        return ("layers", i, "layer_scalar"), False
    if parts in (["linear_attn", "dt_bias"], ["linear_attn", "A_log"], ["linear_attn", "conv1d", "weight"]):
        return ("layers", i, *parts), False  # Qwen3.5's Gated DeltaNet (the conv weight loses its middle axis)
    return None


# Gemma 4's per-layer inputs (`tempax.models.decoder.PerLayerInputs`): (path, transpose) of each tensor
_PER_LAYER_INPUTS: dict[str, tuple[tuple[Any, ...], bool]] = {
    "model.embed_tokens_per_layer.weight": (("per_layer_inputs", "embed_tokens_per_layer", "embedding"), False),
    "model.per_layer_model_projection.weight": (("per_layer_inputs", "per_layer_model_projection", "kernel"), True),
    "model.per_layer_projection_norm.weight": (("per_layer_inputs", "per_layer_projection_norm", "weight"), False),
}


def absent_from_checkpoint(cfg: ModelConfig) -> frozenset[tuple[Any, ...]]:
    """Per-layer paths of weights tempax's layer stack holds but the family's checkpoints do not: a Gemma 4
    KV-shared layer's key/value projections and key norm, a value projection of a layer whose values are its keys
    (`attention_k_eq_v`). The model never reads them: loading fills them with zeros, export leaves them out."""
    absent = set()
    for i in range(cfg.num_layers):
        names = []
        if cfg.kv_reused(i):
            names += ["k_proj", "v_proj", "k_norm"]
        elif cfg.values_from_keys(i):
            names.append("v_proj")
        for name in names:
            leaves = ["weight"] if name.endswith("norm") else ["kernel", "bias"] if cfg.qkv_bias else ["kernel"]
            absent.update(("layers", i, "self_attn", name, leaf) for leaf in leaves)
    return frozenset(absent)


_MOE_BLOCK = ("layers", "mlp")  # where a decoder layer's SparseMoeBlock sits in the model


def hf_moe_slots(name: str, cfg: ModelConfig) -> tuple[int, tuple[MoeTensorSlot, ...]] | None:
    """(layer index, slots in that layer's `SparseMoeBlock`) of a Hugging Face tensor of a mixture-of-experts
    layer, or None for any other tensor (and for every tensor of a dense model)."""
    if cfg.moe is None:
        return None
    m = _LAYER.match(name)
    if not m:
        return None
    slots = hf_moe_tensor_to_path(m.group(2), cfg.family)  # type: ignore[arg-type]
    return None if slots is None else (int(m.group(1)), slots)


def path_to_hf(path: tuple[Any, ...]) -> tuple[str, bool]:
    """Inverse of `hf_to_path`."""
    if path == ("embed_tokens", "embedding"):
        return "model.embed_tokens.weight", False
    if path == ("norm", "weight"):
        return "model.norm.weight", False
    if path == ("lm_head", "kernel"):
        return "lm_head.weight", True
    for name, (mapped, transpose) in _PER_LAYER_INPUTS.items():
        if path == mapped:
            return name, transpose
    if path[0] == "layers":
        *mods, leaf = path[2:]
        if not mods:  # a tensor of the layer itself (Gemma 4's layer_scalar)
            return f"model.layers.{path[1]}.{leaf}", False
        name = f"model.layers.{path[1]}." + ".".join(str(m) for m in mods)
        if leaf == "kernel":
            return name + ".weight", True
        return name + "." + leaf, False
    raise KeyError(f"no Hugging Face name for parameter {path}")


def _hf_name_for_message(layer_path: tuple[Any, ...], cfg: ModelConfig) -> str:
    """A Hugging Face name of a per-layer path, for messages: an MoE parameter's first tensor name."""
    if cfg.moe is not None and layer_path[0] == "layers" and layer_path[2] == "mlp":
        try:
            first = moe_path_to_hf(tuple(layer_path[3:]), cfg.family, cfg.moe.num_experts)[0][0]  # type: ignore
            return f"model.layers.{layer_path[1]}.{first}"
        except (KeyError, CheckpointError):
            pass
    return path_to_hf(layer_path)[0]


def abstract_model(cfg: ModelConfig) -> Decoder:
    """A model whose parameters are shapes only (no memory), to be filled by `fill_params`.

    One layer is traced and its shapes stacked `num_layers` deep (`abstract_stack`), inside a decoder shell traced
    with one layer: tracing grows with the depth nowhere, so `tempax generate` starts as fast for a deep model as
    for a shallow one. A hybrid model (Qwen3.5) gets its linear-attention stack the same way.
    """
    shell = cfg.replace(num_layers=1, layer_types=cfg.layer_types[:1], nope_layers=(), linear_attention_layers=(),
                        kv_shared_layers=0, per_layer_input_size=0, global_head_dim=0, global_kv_heads=0,
                        wide_shared_mlp=False)
    model = nnx.eval_shape(lambda: Decoder(shell, rngs=nnx.Rngs(0)))
    with nnx.use_eager_sharding(False):  # as `Decoder.__init__` builds its layers
        if cfg.per_layer_input_size:  # Gemma 4's per-layer inputs: tables as wide as all layers' inputs
            model.per_layer_inputs = nnx.data(nnx.eval_shape(lambda: PerLayerInputs(cfg, rngs=nnx.Rngs(0))))
        stacks = cfg.layer_stacks()
        layer = nnx.eval_shape(lambda: DecoderLayer(cfg, rngs=nnx.Rngs(0)))
        model.layers = abstract_stack(layer, len(stacks["layers"]))
        for name in ("full_layers", "shared_layers", "shared_full_layers"):  # Gemma 4's stacks of other shapes
            if name in stacks:
                other = nnx.eval_shape(lambda: DecoderLayer(cfg.stack_config(name), rngs=nnx.Rngs(0)))
                setattr(model, name, nnx.data(abstract_stack(other, len(stacks[name]))))
        if cfg.linear_attention_layers:
            linear = nnx.eval_shape(lambda: DecoderLayer(cfg, rngs=nnx.Rngs(0), linear=True))
            model.linear_layers = nnx.data(abstract_stack(linear, len(cfg.linear_attention_layers)))
    model.config = cfg
    return model


def _stack_layers(stack: str, cfg: ModelConfig | None) -> tuple[int, ...] | None:
    """The model's layer indices of a layer stack's entries (`ModelConfig.layer_stacks`: the attention layers of
    "layers" and the linear-attention ones of "linear_layers" in a hybrid model, the sliding and the full layers
    of a Gemma 4 model whose full layers have a shape of their own); None where entry j is layer j."""
    if cfg is None:
        return None
    stacks = cfg.layer_stacks()
    return None if len(stacks) == 1 else stacks[stack]


def param_table(model: Decoder) -> dict[tuple[Any, ...], nnx.Variable]:
    """{path: Param} of the model; the layer stack's paths carry no layer index (one Param holds every layer)."""
    table = {}
    for path, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Param):
            table[tuple(path)] = var
    return table


def per_layer_paths(table: dict[tuple[Any, ...], nnx.Variable], cfg: ModelConfig | None = None,
                    ) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...], int | None]]:
    """(per-layer path, path in the model, index in its stack or None) for every weight: a stacked weight once per
    layer as ("layers", i, ...) with i the model's layer index, the form Hugging Face names and tempax's checkpoints
    before the layer stack take. A hybrid model's stacks (`cfg`) map their entries to the layers they hold."""
    for path, var in table.items():
        if path and path[0] in LAYER_STACKS and is_stacked(var):
            layers = _stack_layers(path[0], cfg)
            for i in range(var.shape[0]):
                yield ("layers", i if layers is None else layers[i], *path[1:]), path, i
        else:
            yield path, path, None


def stacked_path(path: tuple[Any, ...], cfg: ModelConfig | None = None) -> tuple[tuple[Any, ...], int | None]:
    """(path in the model, index in its stack) of a per-layer path ("layers", i, ...); other paths unchanged,
    None. In a hybrid model (`cfg`) layer i is in "layers" or "linear_layers"."""
    if len(path) > 1 and path[0] == "layers" and isinstance(path[1], int):
        stacks = {} if cfg is None or not 0 <= path[1] < cfg.num_layers else cfg.layer_stacks()
        if len(stacks) > 1:
            stack = next(name for name, members in stacks.items() if path[1] in members)
            return (stack, *path[2:]), stacks[stack].index(path[1])
        return ("layers", *path[2:]), path[1]
    return tuple(path), None


def fill_params(
    model: Decoder,
    tensors: Iterable[tuple[str, Callable[[], np.ndarray]]],
    *,
    source: str,
    progress: Callable[[int], None] | None = None,
) -> Decoder:
    """Assigns Hugging Face-named tensors to an (abstract) model, checking names and shapes.

    `tensors` yields (name, loader) pairs; each loader is called once, right before its tensor is needed, so
    only one source tensor is in host memory at a time besides the host buffer of the layer-stacked weight it
    goes into (handed to the device as soon as its last layer is in).
    """
    cfg = model.config
    dtype = as_dtype(cfg.param_dtype)
    np_dtype = np.dtype(dtype)
    table = param_table(model)
    buffers: dict[tuple[Any, ...], np.ndarray] = {}
    pending: dict[tuple[Any, ...], set[int]] = {}
    moe_pending: dict[tuple[Any, ...], dict[int, set[int | None]]] = {}
    filled: set[tuple[Any, ...]] = set()
    absent = absent_from_checkpoint(cfg)
    for layer_path in absent:  # weights the checkpoint has no tensor for: zeros, never read
        path, index = stacked_path(layer_path, cfg)
        var = table.get(path)
        if var is None:  # an adapter-wrapped or otherwise renamed stack: left to the missing-weights check
            continue
        if path not in buffers:
            buffers[path] = np.zeros(tuple(var.shape), np_dtype)
            pending[path] = set(range(var.shape[0]))
        pending[path].discard(index)
        filled.add(layer_path)
    for name, load in tensors:
        name = text_model_name(name)
        moe = hf_moe_slots(name, cfg)
        if moe is not None:
            nbytes = _fill_moe_tensor(table, buffers, moe_pending, filled, name, load, *moe, cfg=cfg, source=source,
                                      np_dtype=np_dtype)
            if progress is not None:
                progress(nbytes)
            continue
        mapped = hf_to_path(name)
        if mapped is None:
            continue
        layer_path, transpose = mapped
        if layer_path in absent:  # a checkpoint that still holds such a tensor: the model does not read it
            continue
        path, index = stacked_path(layer_path, cfg)
        var = table.get(path)
        if var is None or (index is not None and index >= var.shape[0]):
            if path == ("lm_head", "kernel") and cfg.tie_word_embeddings:
                continue  # some tied checkpoints also store the head; the embedding is the truth
            raise CheckpointError(
                f"{source}: tensor {name!r} has no place in a {cfg.family} model with this config "
                f"({cfg.num_layers} layers, qkv_bias={cfg.qkv_bias}, qk_norm={cfg.qk_norm}, "
                f"post_norms={cfg.post_norms}); the checkpoint and its config disagree."
            )
        array = load()
        if transpose:
            array = array.T
        if path[-2:] == ("conv1d", "weight") and array.ndim == 3:  # Conv1d's [C, 1, K] -> [C, K]
            array = array[:, 0, :]
        want = tuple(var.shape) if index is None else tuple(var.shape[1:])
        if tuple(array.shape) != want:
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {tuple(array.shape)} (after transpose: {transpose}) but "
                f"the config implies {want}; the config (config.json or GGUF metadata) and the weights "
                "disagree."
            )
        if index is None:
            var.set_value(jnp.asarray(array, dtype=dtype))
        else:
            if path not in buffers:
                buffers[path] = np.empty(tuple(var.shape), np_dtype)
                pending[path] = set(range(var.shape[0]))
            buffers[path][index] = np.asarray(array).astype(np_dtype, copy=False)
            pending[path].discard(index)
            if not pending[path]:
                var.set_value(jnp.asarray(buffers.pop(path)))
        filled.add(layer_path)
        if progress is not None:
            progress(array.nbytes)
    for path in [p for p, waiting in pending.items() if not waiting and p in buffers]:  # only absent entries
        table[path].set_value(jnp.asarray(buffers.pop(path)))
    missing = [p for p, _, _ in per_layer_paths(table, cfg) if p not in filled]
    if missing:
        names = [_hf_name_for_message(p, cfg) for p in missing[:5]]
        raise CheckpointError(
            f"{source}: {len(missing)} weights of the model are missing from the checkpoint, e.g. {names}. "
            "The file may be truncated or belong to another architecture."
        )
    return model


def _fill_moe_tensor(table: dict[tuple[Any, ...], nnx.Variable], buffers: dict[tuple[Any, ...], np.ndarray],
                     pending: dict[tuple[Any, ...], dict[int, set[int | None]]], filled: set[tuple[Any, ...]],
                     name: str,
                     load: Callable[[], np.ndarray], layer: int, slots: tuple[MoeTensorSlot, ...], *,
                     cfg: ModelConfig, source: str, np_dtype: np.dtype) -> int:
    """Writes one Hugging Face tensor of layer `layer`'s MoE block into the host buffers of the stacked parameters
    it fills (each [L, ...], an expert's tensor one [E] row of its layer), handing a buffer to the model once
    every layer (and every expert) of it is in. Returns the tensor's size in bytes."""
    array = load()
    for slot in slots:
        path, index = stacked_path((_MOE_BLOCK[0], layer, *_MOE_BLOCK[1:], *slot.path), cfg)
        var = table.get(path)
        if var is None or index >= var.shape[0]:
            raise CheckpointError(
                f"{source}: tensor {name!r} has no place in a {cfg.family} model with this config "
                f"({cfg.num_layers} layers, moe={cfg.moe}); the checkpoint and its config disagree.")
        if path not in buffers:
            buffers[path] = np.zeros(tuple(var.shape), np_dtype)
            units = list(range(var.shape[1])) if slot.path[0] == "experts" else [None]  # [L, E, ...]: per expert
            pending[path] = {i: set(units) for i in range(var.shape[0])}
        fill_slot(buffers[path][index], slot, array, name=f"{source}: tensor {name!r}")
        waiting = pending[path].get(index, set())
        if slot.expert is None:
            waiting.clear()
        else:
            waiting.discard(slot.expert)
        if not waiting:
            pending[path].pop(index, None)
            filled.add(("layers", layer, *path[1:]))
        if not pending[path]:
            var.set_value(jnp.asarray(buffers.pop(path)))
    return array.nbytes


def iter_hf_tensors(model: Decoder) -> Iterator[tuple[str, np.ndarray]]:
    """(Hugging Face name, numpy array [out, in] for linears) for every parameter of the model; a mixture of
    experts' block as transformers' `save_pretrained` writes its family's tensors, one layer at a time."""
    table = param_table(model)
    cfg = model.config
    moe_paths = [p for p in table if cfg.moe is not None and p[0] in LAYER_STACKS and p[1] == "mlp"]
    absent = absent_from_checkpoint(cfg)
    for layer_path, path, index in per_layer_paths(table, cfg):
        if path in moe_paths or layer_path in absent:
            continue
        name, transpose = path_to_hf(layer_path)
        value = table[path][...]
        array = np.asarray(jax.device_get(value if index is None else value[index]))
        if path[-2:] == ("conv1d", "weight"):  # back to Conv1d's [C, 1, K]
            array = array[:, None, :]
        yield name, (array.T if transpose else array)
    for i in range(cfg.num_layers if moe_paths else 0):
        stack, index = stacked_path(("layers", i), cfg)
        block = {tuple(p[2:]): np.asarray(jax.device_get(table[p][...][index])) for p in moe_paths if p[0] == stack[0]}
        for name, array in moe_params_to_hf_tensors(block, cfg.family).items():  # type: ignore[arg-type]
            yield f"model.layers.{i}.{name}", array
