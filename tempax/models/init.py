"""Random initialisation of a `Decoder` whose start-up does not grow with the number of layers.

Compiling the whole constructor as one program (`jax.jit(lambda: nnx.split(Decoder(cfg, rngs))[1])`) costs
compile time in proportion to the depth: every weight's random draw is its own piece of the program, and XLA
optimises and generates code for each of them, on a CPU and on a GPU alike (`docs/measurements/
performance-history.md`, "Start-up and a 1B shape on a CPU"; `docs/measurements/gpu-h200.md`). `init_decoder`
compiles three small programs instead and calls the per-layer one once per layer, with weights equal to the
one-program constructor's bit for bit (it says how).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tempax.models.config import ModelConfig
from tempax.models.decoder import Decoder, DecoderLayer, make_embedding, make_head
from tempax.models.weights import abstract_model
from tempax.parallel.rules import Rules, param_shardings


def _program(make: Any, mesh: Mesh | None, rules: Rules | None, rngs_state: Any) -> Any:
    """jit of `rngs_state -> (state of make(rngs), rngs_state after)`, outputs placed by their logical names."""

    def run(rngs_state: Any) -> tuple[Any, Any]:
        rngs = nnx.merge(rngs_graph, rngs_state)
        with nnx.use_eager_sharding(False):
            module = make(rngs)
        return nnx.state(module), nnx.state(rngs)

    rngs_graph = nnx.graphdef(nnx.Rngs(0))
    if mesh is None:
        return jax.jit(run)
    abstract_state, abstract_rngs = jax.eval_shape(run, rngs_state)
    replicated = jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), abstract_rngs)
    return jax.jit(run, out_shardings=(param_shardings(abstract_state, mesh, rules), replicated))


class _Head(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.norm, self.lm_head = make_head(cfg, rngs)


def decoder_programs(cfg: ModelConfig, seed: int, mesh: Mesh | None = None, rules: Rules | None = None) -> dict:
    """The three jitted initialisers (`embedding`, `layer`, `head`) and the stream's first state (`rngs`)."""
    rngs_state = nnx.state(nnx.Rngs(seed))
    return {
        "rngs": rngs_state,
        "embedding": _program(lambda r: make_embedding(cfg, r), mesh, rules, rngs_state),
        "layer": _program(lambda r: DecoderLayer(cfg, rngs=r), mesh, rules, rngs_state),
        "head": _program(lambda r: _Head(cfg, r), mesh, rules, rngs_state),
    }


def _stack_writer(abstract_layers: Any, mesh: Mesh | None, rules: Rules | None) -> tuple[Any, Any]:
    """(empty stacked weights, jitted `(stacked, layer, i) -> stacked with layer i written`), the stack donated so
    that each layer is written in place: the stack never exists twice."""
    flat = {tuple(path): var for path, var in nnx.to_flat_state(nnx.state(abstract_layers))}
    shapes = {path: jax.ShapeDtypeStruct(var.shape, var.dtype) for path, var in flat.items()}
    shardings = None
    if mesh is not None:
        state = nnx.from_flat_state(list(flat.items()))
        shardings = {tuple(path): var.get_value()
                     for path, var in nnx.to_flat_state(param_shardings(state, mesh, rules))}
    zeros = jax.jit(lambda: {p: jnp.zeros(s.shape, s.dtype) for p, s in shapes.items()}, out_shardings=shardings)

    def put(stacked: dict, layer: dict, i: jax.Array) -> dict:
        return {p: jax.lax.dynamic_update_index_in_dim(stacked[p], layer[p].astype(stacked[p].dtype), i, 0)
                for p in stacked}

    return zeros(), jax.jit(put, donate_argnums=0, out_shardings=shardings)


def init_decoder(cfg: ModelConfig, seed: int, mesh: Mesh | None = None, rules: Rules | None = None) -> Decoder:
    """`Decoder(cfg, rngs=nnx.Rngs(seed))` with equal weights, built by three compiled programs:

        embedding(rngs)      -> embedding weights, rngs advanced
        layer(rngs)          -> one DecoderLayer's weights, rngs advanced   (compiled once, called num_layers times)
        head(rngs)           -> final norm (+ untied LM head)

    and each layer's weights are written into the decoder's stacked weights in place (a donated update, compiled
    once).

    `nnx.Rngs` draws the key `fold_in(key, count)` and increments `count`, in construction order. Passing the stream's
    state (key, count) from one program to the next therefore reproduces the draws of `Decoder.__init__` exactly: the
    weights equal those of the one-program constructor bit for bit, on any mesh. Layers never differ in their
    parameters' shapes, so one compiled layer initialiser serves them all. Each program writes its outputs directly in
    their shards (`out_shardings`), so no weight exists whole on one device, and only one layer's program is ever live.

    With `mesh`, every weight is created in the shard its logical axis names map to (replicated on no mesh:
    the default device). Each layer's weights are written into the stacked weights in place.
    """
    model = abstract_model(cfg)  # shapes only: the draws come from the programs below
    graphdef, abstract = nnx.split(model)
    programs = decoder_programs(cfg, seed, mesh, rules)
    values: dict[tuple[Any, ...], Any] = {}

    def collect(prefix: tuple[Any, ...], state: Any) -> None:
        for path, var in nnx.to_flat_state(state):
            values[prefix + tuple(path)] = var.get_value()

    embedding, rngs = programs["embedding"](programs["rngs"])
    collect(("embed_tokens",), embedding)
    stacked, put = _stack_writer(model.layers, mesh, rules)
    for i in range(cfg.num_layers):
        layer, rngs = programs["layer"](rngs)
        stacked = put(stacked, {tuple(p): v.get_value() for p, v in nnx.to_flat_state(layer)}, jnp.int32(i))
    values.update({("layers", *path): value for path, value in stacked.items()})
    head, _ = programs["head"](rngs)
    collect((), head)
    flat = [(path, var.replace(values.pop(tuple(path)))) for path, var in nnx.to_flat_state(abstract)]
    if values:
        raise AssertionError(f"initialised weights the decoder does not have: {sorted(values)[:3]}")
    return nnx.merge(graphdef, nnx.from_flat_state(flat))
