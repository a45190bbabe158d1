"""Sharding as data: a ('data', 'fsdp', 'tensor') mesh and one table from logical axis names to its axes."""

from tempax.parallel.mesh import MESH_AXES, init_distributed, make_mesh
from tempax.parallel.rules import (
    DEFAULT_RULES,
    active_mesh,
    batch_sharding,
    logical_to_spec,
    named_sharding,
    param_shardings,
    shard,
    shard_params,
    use_mesh,
    variable_logical_names,
)

__all__ = [
    "DEFAULT_RULES",
    "MESH_AXES",
    "active_mesh",
    "batch_sharding",
    "init_distributed",
    "logical_to_spec",
    "make_mesh",
    "named_sharding",
    "param_shardings",
    "shard",
    "shard_params",
    "use_mesh",
    "variable_logical_names",
]
