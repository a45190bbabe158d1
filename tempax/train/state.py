"""The training state and the split of a model into trainable parameters and everything else.

A Flax NNX model is split once, outside jit, with the trainable-parameter filter (`nnx.Param` for full
fine-tuning, `lora_filter` for adapters):

    graphdef  static structure (Python, part of the jit cache key)
    params    the trainable arrays as a flat dict {"layers.0.mlp.up_proj.kernel": array}: what gets gradients,
              optimizer state, donation and checkpoints. Flat string keys keep optimizer states and Orbax
              checkpoints free of integer dict keys (the decoder's layer list) and readable in logs.
    rest      every other Variable (frozen base weights, quantized weights, RNG counters) as an `nnx.State`;
              passed to the step as a non-donated input and never checkpointed (it is rebuilt from the model
              source).

`ModelParts.merge(params, rest)` rebuilds the model inside the traced step; it costs nothing at run time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tempax.parallel.rules import Rules, logical_to_spec, param_shardings, variable_logical_names
from tempax.models.decoder import as_dtype
from tempax.ops import BF16, keep_kernel_dtype, projection_dot

Params = dict[str, jax.Array]


def path_key(path: tuple[Any, ...]) -> str:
    """'layers.0.self_attn.q_proj.kernel' for the path ('layers', 0, 'self_attn', 'q_proj', 'kernel')."""
    return ".".join(str(p) for p in path)


@dataclass(frozen=True)
class ModelParts:
    """A model split into a static graph, trainable flat params and the other state (see the module docstring).

    Attributes:
      graphdef: the NNX graph definition.
      templates: for each trainable key, (path, Variable) with abstract value, to rebuild the State.
      rest: the non-trainable state (an `nnx.State` of arrays).
    """

    graphdef: Any
    templates: dict[str, tuple[tuple[Any, ...], nnx.Variable]]
    rest: Any

    @classmethod
    def split(cls, model: nnx.Module, trainable: Any = nnx.Param) -> tuple["ModelParts", Params]:
        """Splits `model` with the filter `trainable`; returns (parts, params)."""
        graphdef, train_state, rest = nnx.split(model, trainable, ...)
        templates: dict[str, tuple[tuple[Any, ...], nnx.Variable]] = {}
        params: Params = {}
        for path, var in nnx.to_flat_state(train_state):
            key = path_key(path)
            value = var.get_value()
            templates[key] = (tuple(path), var.replace(jax.ShapeDtypeStruct(value.shape, value.dtype)))
            params[key] = value
        if not params:
            raise ValueError("the trainable-parameter filter selected no parameters")
        return cls(graphdef, templates, rest), params

    def train_state(self, params: Params) -> nnx.State:
        return nnx.from_flat_state([(path, var.replace(params[key])) for key, (path, var) in self.templates.items()])

    def merge(self, params: Params, rest: Any | None = None) -> nnx.Module:
        """The model with `params` as its trainable arrays (inside or outside jit)."""
        return nnx.merge(self.graphdef, self.train_state(params), self.rest if rest is None else rest)

    def logical_names(self) -> dict[str, tuple[str | None, ...] | None]:
        return {key: variable_logical_names(var) for key, (_, var) in self.templates.items()}

    def param_shardings(self, mesh: Mesh, rules: Rules | None = None) -> dict[str, NamedSharding]:
        """Per trainable key, the sharding its logical axis names map to on `mesh` (replicated when unnamed)."""
        out = {}
        for key, (_, var) in self.templates.items():
            names = variable_logical_names(var)
            shape = var.get_value().shape
            spec = PartitionSpec() if names is None else logical_to_spec(names, rules, mesh=mesh, shape=shape)
            out[key] = NamedSharding(mesh, spec)
        return out

    def rest_shardings(self, mesh: Mesh, rules: Rules | None = None) -> Any:
        return param_shardings(self.rest, mesh, rules)

    def num_params(self) -> int:
        return sum(int(var.get_value().size) for _, var in self.templates.values())


def count_params(tree: Any) -> int:
    return sum(int(getattr(x, "size", 0)) for x in jax.tree.leaves(tree))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class TrainState:
    """Everything the jitted step reads and writes (donated every step).

    Attributes:
      step: int32 scalar, optimizer updates done so far.
      params: trainable arrays (float32 master copies under bf16 precision), flat dict.
      opt_state: the optax state for `params`.
      rng: uint32 [2] key data; the step's randomness is `fold_in(rng, step)`, so a resumed run draws the same.
      bad_step: int32 scalar, the first step whose loss or gradients were not finite (-1: none). Once set, updates
        stop, so the parameters and optimizer state keep their last finite values until the loop notices.
    """

    step: jax.Array
    params: Params
    opt_state: optax.OptState
    rng: jax.Array
    bad_step: jax.Array

    def replace(self, **changes: Any) -> "TrainState":
        return dataclasses.replace(self, **changes)


def init_state(params: Params, optimizer: optax.GradientTransformation, seed: int) -> TrainState:
    """A fresh state (step 0); call inside jit with out_shardings to create sharded optimizer state directly."""
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        rng=jax.random.key_data(jax.random.key(seed)),
        bad_step=jnp.full((), -1, jnp.int32),
    )


def state_shardings(
    abstract: TrainState, optimizer: optax.GradientTransformation, param_shardings: dict[str, NamedSharding],
    mesh: Mesh,
) -> TrainState:
    """Shardings of a `TrainState`: optimizer moments follow their parameter, everything else is replicated."""
    replicated = NamedSharding(mesh, PartitionSpec())
    opt = optax.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        abstract.opt_state,
        param_shardings,
        transform_non_params=lambda _: replicated,
    )
    return TrainState(step=replicated, params=param_shardings, opt_state=opt, rng=replicated, bad_step=replicated)


# --------------------------------------------------------------------------------------------------------------
# Precision


def set_compute_dtype(model: nnx.Module, dtype: str) -> None:
    """Makes every layer of `model` compute in `dtype` (weights keep their storage dtype).

    NNX layers cast their weights and inputs to their `dtype` attribute when called, so bf16 compute over
    float32 master weights is this attribute on every Linear/Embed plus the decoder's config. Under bfloat16 each
    `nnx.Linear` computes through `tempax.ops.projection_dot` with its kernel left float32 (bf16
    operands, float32 accumulation and weight gradient, in the layouts XLA:CPU runs at bf16 speed). Done once,
    before the model is split for training.
    """
    target = as_dtype(dtype)
    for _, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Module) and hasattr(node, "dtype") and not isinstance(node, nnx.Variable):
            if getattr(node, "dtype", None) is not None:
                node.dtype = target
                custom = getattr(node, "dot_general_cls", None) is not None
                if isinstance(node, nnx.Linear) and jnp.dtype(target) == BF16 and not custom:
                    node.dot_general = projection_dot
                    node.promote_dtype = keep_kernel_dtype
        cfg = getattr(node, "config", None) if isinstance(node, nnx.Module) else None
        if cfg is not None and hasattr(cfg, "replace") and hasattr(cfg, "param_dtype"):
            node.config = cfg.replace(dtype=dtype)


def training_view(
    model: nnx.Module, *, remat: str | None = None, precision: str = "fp32", trunks: tuple[str, ...] = ()
) -> nnx.Module:
    """A new module graph over the same arrays (nothing is copied) with per-layer `remat` and `precision`
    applied, so the trainer never changes the model object its caller holds (its config, its layers' dtypes).

    `remat` goes on the config of each decoder named in `trunks` (attribute names of `model`, an absent one
    skipped: a PPO model without a separate critic); empty `trunks`: on `model`'s own config."""
    graphdef, state = nnx.split(model)
    view = nnx.merge(graphdef, state)
    if remat is not None:
        decoders = [getattr(view, name) for name in trunks] if trunks else [view]
        for decoder in decoders:
            cfg = getattr(decoder, "config", None)
            if cfg is not None and hasattr(cfg, "remat"):
                decoder.config = cfg.replace(remat=remat)
    if precision == "bf16":
        set_compute_dtype(view, "bfloat16")
    return view


def cast_params(params: Params, dtype: Any) -> Params:
    """Floating-point arrays cast to `dtype` (the float32 master copy for bf16 training)."""
    return {k: v.astype(dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v for k, v in params.items()}


def init_sharded(build: Any, mesh: Mesh, rules: Rules | None = None) -> nnx.Module:
    """Runs the model constructor `build()` under jit so every weight is created directly in its shard.

    One compiled initialiser instead of one eager dispatch per weight, and a model larger than one device's
    memory never exists whole anywhere. Its compile time grows with the model's depth (every weight's random
    draw is part of the one program); for a `Decoder` use `tempax.models.init.init_decoder`, which gives the
    same weights from three programs compiled once each.
    """
    abstract = nnx.eval_shape(build)
    graphdef, abstract_state = nnx.split(abstract)
    shardings = param_shardings(abstract_state, mesh, rules)

    def make() -> Any:
        return nnx.split(build())[1]

    state = jax.jit(make, out_shardings=shardings)()
    return nnx.merge(graphdef, state)
