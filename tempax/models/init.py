"""Random initialisation of a `Decoder` whose start-up does not grow with the number of layers.

Compiling the whole constructor as one program (`jax.jit(lambda: nnx.split(Decoder(cfg, rngs))[1])`) costs
compile time in proportion to the depth: every weight's random draw is its own piece of the program, and XLA
optimises and generates code for each of them, on a CPU and on a GPU alike (`docs/measurements/
performance-history.md`, "Start-up and a 1B shape on a CPU"; `docs/measurements/gpu-h200.md`). `init_decoder`
compiles three small programs instead, the layers' one a scan over one layer's initialiser, with weights equal to
the one-program constructor's bit for bit (it says how).
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tempax.models.config import ModelConfig
from tempax.models.decoder import Decoder, DecoderLayer, PerLayerInputs, make_embedding, make_head
from tempax.models.weights import abstract_model
from tempax.parallel.rules import Rules, param_shardings


def _program(make: Any, mesh: Mesh | None, rules: Rules | None, rngs_state: Any) -> Any:
    """jit of `rngs_state -> (state of make(rngs), rngs_state after)`, outputs placed by their logical names."""
    run = _initialiser(make)
    if mesh is None:
        return jax.jit(run)
    abstract_state, abstract_rngs = jax.eval_shape(run, rngs_state)
    return jax.jit(run, out_shardings=(param_shardings(abstract_state, mesh, rules), _replicated(abstract_rngs, mesh)))


def _initialiser(make: Any) -> Any:
    """`rngs_state -> (nnx.state(make(rngs)), rngs_state after)`: the module's random draws from the stream's state."""
    rngs_graph = nnx.graphdef(nnx.Rngs(0))

    def run(rngs_state: Any) -> tuple[Any, Any]:
        rngs = nnx.merge(rngs_graph, rngs_state)
        with nnx.use_eager_sharding(False):
            module = make(rngs)
        return nnx.state(module), nnx.state(rngs)

    return run


def _replicated(tree: Any, mesh: Mesh) -> Any:
    return jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), tree)


def _layers_program(cfg: ModelConfig, mesh: Mesh | None, rules: Rules | None, abstract_layers: Any,
                    linear: bool = False, count: int | None = None) -> Any:
    """jit of `rngs_state -> ({path: weight stacked over the layers}, rngs_state after)`: one `DecoderLayer`'s
    initialiser under `jax.lax.scan`, the stream's state carried from layer to layer. The scan writes each layer's
    weights into the stack as it draws them, so the program is one layer's code whatever the depth and the stack
    is never copied; `abstract_layers` (the decoder's stacked layers, shapes only) gives each weight's dtype and,
    with `mesh`, its shard. `linear`: the stack of a hybrid model's linear-attention layers; `count`: the stack's
    layers (default: the linear-attention layers, or the softmax-attention layers of `cfg.layer_stacks()`)."""
    layer = _initialiser(lambda r: DecoderLayer(cfg, rngs=r, linear=linear))
    if count is None:
        count = len(cfg.linear_attention_layers if linear else cfg.layer_stacks()["layers"])
    flat = {tuple(path): var for path, var in nnx.to_flat_state(nnx.state(abstract_layers))}

    def run(rngs_state: Any) -> tuple[dict, Any]:
        def one(carry: Any, _: Any) -> tuple[Any, dict]:
            state, carry = layer(carry)
            return carry, {tuple(p): v.get_value().astype(flat[tuple(p)].dtype) for p, v in nnx.to_flat_state(state)}

        rngs_after, stacked = jax.lax.scan(one, rngs_state, None, length=count)
        return stacked, rngs_after

    if mesh is None:
        return jax.jit(run)
    state = nnx.from_flat_state(list(flat.items()))
    shardings = {tuple(path): var.get_value() for path, var in nnx.to_flat_state(param_shardings(state, mesh, rules))}
    rngs_state = nnx.state(nnx.Rngs(0))
    return jax.jit(run, out_shardings=(shardings, _replicated(rngs_state, mesh)))


class _Head(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.norm, self.lm_head = make_head(cfg, rngs)
        # Gemma 4's per-layer inputs, drawn after the head as `Decoder.__init__` draws them
        self.per_layer_inputs = nnx.data(PerLayerInputs(cfg, rngs=rngs) if cfg.per_layer_input_size else None)


def decoder_programs(cfg: ModelConfig, seed: int, mesh: Mesh | None = None, rules: Rules | None = None) -> dict:
    """The three jitted initialisers (`embedding`, `layers`, `head`) and the stream's first state (`rngs`)."""
    rngs_state = nnx.state(nnx.Rngs(seed))
    abstract = abstract_model(cfg)
    programs = {
        "rngs": rngs_state,
        "embedding": _program(lambda r: make_embedding(cfg, r), mesh, rules, rngs_state),
        "layers": _layers_program(cfg, mesh, rules, abstract.layers),
        "head": _program(lambda r: _Head(cfg, r), mesh, rules, rngs_state),
    }
    if abstract.linear_layers is not None:
        programs["linear_layers"] = _layers_program(cfg, mesh, rules, abstract.linear_layers, linear=True)
    stacks = cfg.layer_stacks()
    for name in ("full_layers", "shared_layers", "shared_full_layers"):  # Gemma 4's stacks of other shapes
        if name in stacks:
            programs[name] = _layers_program(cfg.stack_config(name), mesh, rules, getattr(abstract, name),
                                             count=len(stacks[name]))
    return programs


def init_decoder(cfg: ModelConfig, seed: int, mesh: Mesh | None = None, rules: Rules | None = None) -> Decoder:
    """`Decoder(cfg, rngs=nnx.Rngs(seed))` with equal weights, built by three compiled programs:

        embedding(rngs)      -> embedding weights, rngs advanced
        layers(rngs)         -> every DecoderLayer's weights, stacked, rngs advanced   (one layer's code under a scan)
        head(rngs)           -> final norm (+ untied LM head)

    `nnx.Rngs` draws the key `fold_in(key, count)` and increments `count`, in construction order. Passing the stream's
    state (key, count) from one program to the next, and from one layer to the next inside the scan, therefore
    reproduces the draws of `Decoder.__init__` exactly: the weights equal those of the one-program constructor bit for
    bit, on any mesh. Layers never differ in their parameters' shapes, so one scanned layer initialiser serves them
    all, and the scan writes each layer into the stacked weights in place: no per-layer call, no second copy of the
    stack. Each program writes its outputs directly in their shards (`out_shardings`), so no weight exists whole on one
    device (replicated on no mesh: the default device).
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
    stacked, rngs = programs["layers"](rngs)
    values.update({("layers", *path): value for path, value in stacked.items()})
    for second in ("linear_layers", "full_layers", "shared_layers", "shared_full_layers"):  # in Decoder's order
        if second in programs:
            stacked, rngs = programs[second](rngs)
            values.update({(second, *path): value for path, value in stacked.items()})
    head, _ = programs["head"](rngs)
    collect((), head)
    flat = [(path, var.replace(values.pop(tuple(path)))) for path, var in nnx.to_flat_state(abstract)]
    if values:
        raise AssertionError(f"initialised weights the decoder does not have: {sorted(values)[:3]}")
    return nnx.merge(graphdef, nnx.from_flat_state(flat))
