"""Mapping between Hugging Face tensor names and tempax parameters, and filling a model tensor by tensor.

Hugging Face Linear weights are [out, in]; tempax kernels are [in, out], so linear weights are transposed on
the way in and out. Everything else keeps its shape. Loading fills an abstract model (no memory allocated
up front) one tensor at a time, so peak host memory stays near the model's own size.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tempax.errors import CheckpointError
from tempax.models.config import ModelConfig
from tempax.models.decoder import Decoder, DecoderLayer, abstract_stack, as_dtype, is_stacked

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def hf_to_path(name: str) -> tuple[tuple[Any, ...], bool] | None:
    """(parameter path in the nnx model, transpose?) for a Hugging Face tensor name; None if not a weight we use."""
    if name == "model.embed_tokens.weight":
        return ("embed_tokens", "embedding"), False
    if name == "model.norm.weight":
        return ("norm", "weight"), False
    if name == "lm_head.weight":
        return ("lm_head", "kernel"), True
    m = _LAYER.match(name)
    if not m:
        return None
    i, rest = int(m.group(1)), m.group(2)
    parts = rest.split(".")
    if parts[-1] == "weight" and parts[-2].endswith("_proj"):
        return ("layers", i, *parts[:-1], "kernel"), True
    if parts[-1] == "bias" and parts[-2].endswith("_proj"):
        return ("layers", i, *parts[:-1], "bias"), False
    if parts[-1] == "weight" and parts[-2].endswith("norm"):
        return ("layers", i, *parts), False
    return None


def path_to_hf(path: tuple[Any, ...]) -> tuple[str, bool]:
    """Inverse of `hf_to_path`."""
    if path == ("embed_tokens", "embedding"):
        return "model.embed_tokens.weight", False
    if path == ("norm", "weight"):
        return "model.norm.weight", False
    if path == ("lm_head", "kernel"):
        return "lm_head.weight", True
    if path[0] == "layers":
        *mods, leaf = path[2:]
        name = f"model.layers.{path[1]}." + ".".join(str(m) for m in mods)
        if leaf == "kernel":
            return name + ".weight", True
        return name + "." + leaf, False
    raise KeyError(f"no Hugging Face name for parameter {path}")


def abstract_model(cfg: ModelConfig) -> Decoder:
    """A model whose parameters are shapes only (no memory), to be filled by `fill_params`.

    One layer is traced and its shapes stacked `num_layers` deep (`abstract_stack`), inside a decoder shell traced
    with one layer: tracing grows with the depth nowhere, so `tempax generate` starts as fast for a deep model as
    for a shallow one.
    """
    shell = cfg.replace(num_layers=1, layer_types=cfg.layer_types[:1])
    model = nnx.eval_shape(lambda: Decoder(shell, rngs=nnx.Rngs(0)))
    with nnx.use_eager_sharding(False):  # as `Decoder.__init__` builds its layers
        layer = nnx.eval_shape(lambda: DecoderLayer(cfg, rngs=nnx.Rngs(0)))
    model.config = cfg
    model.layers = abstract_stack(layer, cfg.num_layers)
    return model


def param_table(model: Decoder) -> dict[tuple[Any, ...], nnx.Variable]:
    """{path: Param} of the model; the layer stack's paths carry no layer index (one Param holds every layer)."""
    table = {}
    for path, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Param):
            table[tuple(path)] = var
    return table


def per_layer_paths(table: dict[tuple[Any, ...], nnx.Variable]) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...], int | None]]:
    """(per-layer path, path in the model, layer index or None) for every weight: a stacked weight once per layer
    as ("layers", i, ...), the form Hugging Face names and tempax's checkpoints before the layer stack take."""
    for path, var in table.items():
        if path and path[0] == "layers" and is_stacked(var):
            for i in range(var.shape[0]):
                yield ("layers", i, *path[1:]), path, i
        else:
            yield path, path, None


def stacked_path(path: tuple[Any, ...]) -> tuple[tuple[Any, ...], int | None]:
    """(path in the model, layer index) of a per-layer path ("layers", i, ...); other paths unchanged, None."""
    if len(path) > 1 and path[0] == "layers" and isinstance(path[1], int):
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
    filled: set[tuple[Any, ...]] = set()
    for name, load in tensors:
        mapped = hf_to_path(name)
        if mapped is None:
            continue
        layer_path, transpose = mapped
        path, index = stacked_path(layer_path)
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
    missing = [p for p, _, _ in per_layer_paths(table) if p not in filled]
    if missing:
        names = [path_to_hf(p)[0] for p in missing[:5]]
        raise CheckpointError(
            f"{source}: {len(missing)} weights of the model are missing from the checkpoint, e.g. {names}. "
            "The file may be truncated or belong to another architecture."
        )
    return model


def iter_hf_tensors(model: Decoder) -> Iterator[tuple[str, np.ndarray]]:
    """(Hugging Face name, numpy array [out, in] for linears) for every parameter of the model."""
    table = param_table(model)
    for layer_path, path, index in per_layer_paths(table):
        name, transpose = path_to_hf(layer_path)
        value = table[path][...]
        array = np.asarray(jax.device_get(value if index is None else value[index]))
        yield name, (array.T if transpose else array)
