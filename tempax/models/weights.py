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
from tempax.models.decoder import Decoder, DecoderLayer, as_dtype

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

    Each layer is traced on its own and put into a layer-less `Decoder` (the same structure as tracing the whole
    constructor; tests compare the two). One trace of the whole constructor takes time quadratic in the depth:
    every random draw advances a traced counter, flax compares that counter's `sharding`, and on a tracer JAX
    answers with an AttributeError whose message walks the whole trace so far. For SmolLM2-135M (30 layers)
    that was most of the abstract model's time, a cost every `tempax generate` paid at start
    (`docs/measurements/performance-history.md`, "Start-up").

    Layers differ only by their kind (`cfg.layer_type(i)`: full or sliding attention) and that kind's rotary
    setting, so one layer of each kind is traced and the others are copies of it (`nnx.clone` of shapes is a
    graph copy, about a tenth of a trace's CPU time).
    """
    model = nnx.eval_shape(lambda: Decoder(cfg.replace(num_layers=0, layer_types=()), rngs=nnx.Rngs(0)))
    model.config = cfg
    traced: dict[tuple[str, Any], DecoderLayer] = {}
    layers = []
    with nnx.use_eager_sharding(False):  # as `Decoder.__init__` builds its layers
        for i in range(cfg.num_layers):
            kind = (cfg.layer_type(i), cfg.rope_for(i))
            if kind not in traced:
                traced[kind] = layer = nnx.eval_shape(lambda i=i: DecoderLayer(cfg, i, rngs=nnx.Rngs(0)))
            else:
                layer = nnx.clone(traced[kind])
            layers.append(layer)
    model.layers = nnx.List(layers)
    return model


def param_table(model: Decoder) -> dict[tuple[Any, ...], nnx.Variable]:
    table = {}
    for path, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Param):
            table[tuple(path)] = var
    return table


def fill_params(
    model: Decoder,
    tensors: Iterable[tuple[str, Callable[[], np.ndarray]]],
    *,
    source: str,
    progress: Callable[[int], None] | None = None,
) -> Decoder:
    """Assigns Hugging Face-named tensors to an (abstract) model, checking names and shapes.

    `tensors` yields (name, loader) pairs; each loader is called once, right before its tensor is needed, so
    only one source tensor is in host memory at a time.
    """
    cfg = model.config
    dtype = as_dtype(cfg.param_dtype)
    table = param_table(model)
    filled: set[tuple[Any, ...]] = set()
    for name, load in tensors:
        mapped = hf_to_path(name)
        if mapped is None:
            continue
        path, transpose = mapped
        if path not in table:
            if path == ("lm_head", "kernel") and cfg.tie_word_embeddings:
                continue  # some tied checkpoints also store the head; the embedding is the truth
            raise CheckpointError(
                f"{source}: tensor {name!r} has no place in a {cfg.family} model with this config "
                f"({cfg.num_layers} layers, qkv_bias={cfg.qkv_bias}, qk_norm={cfg.qk_norm}, "
                f"post_norms={cfg.post_norms}); the checkpoint and its config disagree."
            )
        var = table[path]
        array = load()
        if transpose:
            array = array.T
        if tuple(array.shape) != tuple(var.shape):
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {tuple(array.shape)} (after transpose: {transpose}) but "
                f"the config implies {tuple(var.shape)}; the config (config.json or GGUF metadata) and the weights "
                "disagree."
            )
        var.set_value(jnp.asarray(array, dtype=dtype))
        filled.add(path)
        if progress is not None:
            progress(array.nbytes)
    missing = [p for p in table if p not in filled]
    if missing:
        names = [path_to_hf(p)[0] for p in missing[:5]]
        raise CheckpointError(
            f"{source}: {len(missing)} weights of the model are missing from the checkpoint, e.g. {names}. "
            "The file may be truncated or belong to another architecture."
        )
    return model


def iter_hf_tensors(model: Decoder) -> Iterator[tuple[str, np.ndarray]]:
    """(Hugging Face name, numpy array [out, in] for linears) for every parameter of the model."""
    for path, var in param_table(model).items():
        name, transpose = path_to_hf(path)
        array = np.asarray(jax.device_get(var[...]))
        yield name, (array.T if transpose else array)
