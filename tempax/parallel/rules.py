"""Sharding as data: logical axis names, one table mapping them to mesh axes, and helpers that apply it.

Model code never names mesh axes. Parameters carry logical names in their metadata (`out_sharding`, set with
`nnx.with_partitioning(init, ("embed", "mlp"))` under `nnx.use_eager_sharding(False)`), and activations are
annotated with `shard(x, ("batch", "seq", "act_embed"))`. `DEFAULT_RULES` turns those names into mesh axes of
the ('data', 'fsdp', 'tensor') mesh from `mesh.py`. Without an active mesh (`use_mesh`) `shard` is a no-op, so
the same model runs on a laptop CPU and on a pod.

Turning names into a `PartitionSpec` (`logical_to_spec`), per dimension in order:
  1. look the name up in the rules (`None` as a name means "replicated");
  2. drop mesh axes an earlier dimension already uses (a mesh axis may shard only one dimension);
  3. drop mesh axes of size 1 (they change nothing and keep specs readable);
  4. drop mesh axes that would not divide the dimension evenly (e.g. 2 KV heads on tensor=4): that dimension
     falls back to fewer axes, at worst replicated, instead of failing to compile.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MeshAxes = str | tuple[str, ...] | None
Rules = Mapping[str, MeshAxes]
LogicalNames = Sequence[str | None]

DEFAULT_RULES: Rules = MappingProxyType(
    {
        # Parameters. FSDP splits the model dimension of every matrix; tensor parallelism splits the "wide" one.
        "vocab": "tensor",
        "embed": "fsdp",
        "q_heads": "tensor",
        "kv_heads": "tensor",
        "head_dim": None,
        "mlp": "tensor",
        "norm": None,
        # A mixture of experts' stacked kernels [L, E, embed, mlp]: expert parallelism on the FSDP axis where the
        # expert count divides it (each device keeps whole experts, the same bytes as FSDP's split), else the
        # expert axis stays whole and "embed" takes the FSDP axis (rule 4 below): FSDP over every expert.
        "expert": "fsdp",
        "layers": None,  # stacked (scanned) layers stay whole on every device
        "lora_rank": None,  # tiny; splitting it would only add communication
        # Activations. The batch is split over both data-parallel axes; the model dimension stays whole between
        # layers (FSDP gathers weights, not activations), while heads/mlp/vocab follow their tensor-split weights.
        "batch": ("data", "fsdp"),
        "seq": None,
        "act_embed": None,
        "act_heads": "tensor",
        "act_kv_heads": "tensor",
        "act_mlp": "tensor",
        "act_vocab": "tensor",
    }
)


def _axes_of(target: MeshAxes) -> tuple[str, ...]:
    if target is None:
        return ()
    return (target,) if isinstance(target, str) else tuple(target)


def logical_to_spec(
    names: LogicalNames,
    rules: Rules | None = None,
    *,
    mesh: Mesh | jax.sharding.AbstractMesh | None = None,
    shape: Sequence[int] | None = None,
) -> PartitionSpec:
    """The `PartitionSpec` for an array whose dimensions carry the logical `names`.

    With `mesh`, size-1 and unknown-to-the-mesh checks apply; with `shape` as well, mesh axes that do not divide
    a dimension are dropped for it (see the module docstring). Returns one entry per dimension.

    Raises:
        ValueError: a name has no rule, `shape` has a different rank, or a rule names an axis the mesh lacks.
    """
    rules = DEFAULT_RULES if rules is None else rules
    if shape is not None and len(shape) != len(names):
        raise ValueError(f"logical names {tuple(names)} do not match an array of shape {tuple(shape)}")
    sizes = dict(mesh.shape) if mesh is not None else None
    used: set[str] = set()
    spec: list[MeshAxes] = []
    for dim, name in enumerate(names):
        if name is None:
            spec.append(None)
            continue
        if name not in rules:
            raise ValueError(
                f"logical axis {name!r} has no sharding rule; add it to the rules table (known: {', '.join(rules)})"
            )
        kept: list[str] = []
        split = 1
        for axis in _axes_of(rules[name]):
            if axis in used:
                continue
            if sizes is not None:
                if axis not in sizes:
                    raise ValueError(f"rule {name!r} -> {axis!r} names a mesh axis the mesh lacks ({', '.join(sizes)})")
                if sizes[axis] == 1:
                    continue
                if shape is not None and shape[dim] % (split * sizes[axis]):
                    continue
                split *= sizes[axis]
            kept.append(axis)
        used.update(kept)
        spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*spec)


def named_sharding(mesh: Mesh, names: LogicalNames, shape: Sequence[int], rules: Rules | None = None) -> NamedSharding:
    """`NamedSharding` for an array of `shape` whose dimensions carry the logical `names`."""
    return NamedSharding(mesh, logical_to_spec(names, rules, mesh=mesh, shape=shape))


# --------------------------------------------------------------------------------------------------------------
# The active mesh


@dataclasses.dataclass(frozen=True)
class _Active:
    mesh: Mesh
    rules: Rules


_ACTIVE: contextvars.ContextVar[_Active | None] = contextvars.ContextVar("tempax_mesh", default=None)


@contextlib.contextmanager
def use_mesh(mesh: Mesh, rules: Rules | None = None) -> Iterator[Mesh]:
    """Make `mesh` and `rules` active: `shard` constrains inside this block and is a no-op outside it.

    Also enters `jax.set_mesh(mesh)`, whose mesh is part of jit's cache key, so a function traced without a mesh
    (no constraints) is traced again, with constraints, inside the block. Like `jax.set_mesh`, call it outside
    `jax.jit`.
    """
    token = _ACTIVE.set(_Active(mesh, DEFAULT_RULES if rules is None else rules))
    try:
        with jax.set_mesh(mesh):
            yield mesh
    finally:
        _ACTIVE.reset(token)


def active_mesh() -> Mesh | None:
    """The mesh made active by `use_mesh`, or None on a single device."""
    active = _ACTIVE.get()
    return None if active is None else active.mesh


def shard(x: jax.Array, logical_names: LogicalNames) -> jax.Array:
    """Constrain activation `x` to the sharding its logical names map to; a no-op without an active mesh.

    The rank is checked even without a mesh, so a wrong annotation fails on a laptop, not first on a pod.
    """
    if len(logical_names) != x.ndim:
        raise ValueError(f"shard: logical names {tuple(logical_names)} do not fit an array of shape {x.shape}")
    active = _ACTIVE.get()
    if active is None:
        return x
    spec = logical_to_spec(logical_names, active.rules, mesh=active.mesh, shape=x.shape)
    return jax.lax.with_sharding_constraint(x, NamedSharding(active.mesh, spec))


def batch_sharding(mesh: Mesh, rules: Rules | None = None) -> NamedSharding:
    """Sharding for [batch, ...] input arrays: the leading dimension split like the 'batch' logical axis.

    The batch size must be divisible by the product of the data-parallel axes (the data loader guarantees it).
    """
    return NamedSharding(mesh, logical_to_spec(("batch",), rules, mesh=mesh))


# --------------------------------------------------------------------------------------------------------------
# Parameters


def variable_logical_names(variable: nnx.Variable) -> tuple[str | None, ...] | None:
    """The logical names a Variable was created with (`nnx.with_partitioning`), or None when it has none."""
    names = variable.get_metadata().get("out_sharding")
    return tuple(names) if names else None


def _variable_sharding(path: tuple[Any, ...], variable: nnx.Variable, mesh: Mesh, rules: Rules) -> NamedSharding:
    shape = getattr(variable.get_value(), "shape", ())
    names = variable_logical_names(variable)
    if names is None:
        return NamedSharding(mesh, PartitionSpec())  # unannotated (RNG keys, counters, scalars): replicated
    if len(names) != len(shape):
        where = jax.tree_util.keystr(path)
        raise ValueError(f"parameter {where} has logical names {names} but shape {tuple(shape)}")
    return NamedSharding(mesh, logical_to_spec(names, rules, mesh=mesh, shape=shape))


def param_shardings(state: Any, mesh: Mesh, rules: Rules | None = None) -> Any:
    """A tree like `state` (an `nnx.State`, concrete or from `nnx.eval_shape`) whose values are `NamedSharding`s.

    Each Variable is sharded by its `out_sharding` logical names; Variables without names and bare arrays are
    replicated. The result can be passed to `jax.device_put` or as `out_shardings` of a jitted initialiser.
    """
    rules = DEFAULT_RULES if rules is None else rules

    def one(path: tuple[Any, ...], leaf: Any) -> Any:
        if isinstance(leaf, nnx.Variable):
            return leaf.replace(_variable_sharding(path, leaf, mesh, rules))
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree_util.tree_map_with_path(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_params(state: Any, mesh: Mesh, rules: Rules | None = None) -> Any:
    """`state` with every array placed on `mesh` according to `param_shardings`."""
    return jax.device_put(state, param_shardings(state, mesh, rules))
