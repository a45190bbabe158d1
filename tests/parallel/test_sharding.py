"""Tests for tempax.parallel: the rules table, divisibility fallback, the no-mesh no-op, and 8 fake CPU devices.

The multi-device checks run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8, because
the device count is fixed when JAX first initialises; that way they work whether or not this process already
has 8 fake devices.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from tempax.errors import ConfigError, TempaxError
from tempax.parallel import (
    DEFAULT_RULES,
    active_mesh,
    batch_sharding,
    init_distributed,
    logical_to_spec,
    make_mesh,
    shard,
    use_mesh,
)

MESH_222 = AbstractMesh((2, 2, 2), ("data", "fsdp", "tensor"))


def test_default_rules_table():
    """FSDP splits 'embed'; tensor splits 'mlp', heads and 'vocab'; the batch goes over ('data', 'fsdp')."""
    assert DEFAULT_RULES["embed"] == "fsdp"
    for name in ("mlp", "q_heads", "kv_heads", "vocab", "act_heads", "act_vocab"):
        assert DEFAULT_RULES[name] == "tensor"
    assert DEFAULT_RULES["batch"] == ("data", "fsdp")
    for name in ("norm", "head_dim", "layers", "seq", "act_embed"):
        assert DEFAULT_RULES[name] is None
    # Without a mesh the table is applied as written.
    assert logical_to_spec(("embed", "mlp")) == P("fsdp", "tensor")
    assert logical_to_spec(("vocab", "embed")) == P("tensor", "fsdp")
    assert logical_to_spec(("layers", "embed", "q_heads", "head_dim")) == P(None, "fsdp", "tensor", None)
    assert logical_to_spec(("batch", "seq", "act_embed")) == P(("data", "fsdp"), None, None)
    assert logical_to_spec(("norm",)) == P(None)
    assert logical_to_spec((None, "mlp")) == P(None, "tensor")


def test_size_one_mesh_axes_are_dropped():
    mesh = AbstractMesh((8, 1, 1), ("data", "fsdp", "tensor"))
    assert logical_to_spec(("embed", "mlp"), mesh=mesh) == P(None, None)
    assert logical_to_spec(("batch", "seq"), mesh=mesh) == P("data", None)
    mesh = AbstractMesh((1, 4, 2), ("data", "fsdp", "tensor"))
    assert logical_to_spec(("batch", "seq"), mesh=mesh) == P("fsdp", None)


def test_divisibility_fallback():
    """2 KV heads cannot split 4 ways: replicated. Batch 4 over data=2 x fsdp=4 (8 ways): 4 % 2 == 0 keeps
    'data', 4 % (2 * 4) != 0 drops 'fsdp'. A 16 x 6 kernel on fsdp=2 x tensor=4: 16 % 2 == 0, 6 % 4 != 0."""
    mesh = AbstractMesh((2, 4, 4), ("data", "fsdp", "tensor"))
    assert logical_to_spec(("embed", "kv_heads", "head_dim"), mesh=mesh, shape=(16, 2, 8)) == P("fsdp", None, None)
    assert logical_to_spec(("embed", "kv_heads", "head_dim"), mesh=mesh, shape=(16, 8, 8)) == P("fsdp", "tensor", None)
    assert logical_to_spec(("batch", "seq"), mesh=mesh, shape=(4, 10)) == P("data", None)
    assert logical_to_spec(("batch", "seq"), mesh=mesh, shape=(8, 10)) == P(("data", "fsdp"), None)
    assert logical_to_spec(("batch", "seq"), mesh=mesh, shape=(3, 10)) == P(None, None)
    mesh = AbstractMesh((1, 2, 4), ("data", "fsdp", "tensor"))
    assert logical_to_spec(("embed", "mlp"), mesh=mesh, shape=(16, 6)) == P("fsdp", None)


def test_a_mesh_axis_shards_at_most_one_dimension():
    """With both names mapped to 'fsdp', the first dimension claims it and the second stays whole."""
    rules = {"embed": "fsdp", "mlp": ("fsdp", "tensor")}
    assert logical_to_spec(("embed", "mlp"), rules) == P("fsdp", "tensor")
    assert logical_to_spec(("mlp", "embed"), rules) == P(("fsdp", "tensor"), None)
    assert logical_to_spec(("embed", "embed"), rules, mesh=MESH_222, shape=(4, 4)) == P("fsdp", None)


def test_bad_names_and_shapes_raise():
    with pytest.raises(ValueError, match="logical axis 'embd' has no sharding rule"):
        logical_to_spec(("embd", "mlp"))
    with pytest.raises(ValueError, match="do not match an array of shape"):
        logical_to_spec(("embed",), shape=(2, 3))
    with pytest.raises(ValueError, match="mesh axis the mesh lacks"):
        logical_to_spec(("embed",), {"embed": "model"}, mesh=MESH_222)


def test_shard_is_a_noop_without_a_mesh():
    x = jnp.arange(6.0).reshape(2, 3)
    assert active_mesh() is None
    assert shard(x, ("batch", "act_embed")) is x
    out = jax.jit(lambda a: shard(a, ("batch", "act_embed")) * 2)(x)
    assert (out == x * 2).all()
    with pytest.raises(ValueError, match="logical names"):
        shard(x, ("batch",))


def test_make_mesh_sizes_and_errors():
    devices = jax.devices()
    mesh = make_mesh()
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    assert dict(mesh.shape) == {"data": len(devices), "fsdp": 1, "tensor": 1}
    # Only the arithmetic is checked before devices are used, so a stand-in list of 6 suffices for the errors.
    six = [devices[0]] * 6
    with pytest.raises(ConfigError, match=r"multiple of 4 devices but there are 6") as info:
        make_mesh(fsdp=4, devices=six)
    assert isinstance(info.value, TempaxError)
    with pytest.raises(ConfigError, match=r"needs 4 devices but there are 6"):
        make_mesh(data=2, fsdp=2, devices=six)
    with pytest.raises(ConfigError, match="only one mesh axis may be -1"):
        make_mesh(data=-1, fsdp=-1, devices=six)
    with pytest.raises(ConfigError, match="'tensor' must be a positive int"):
        make_mesh(tensor=0, devices=six)


def test_use_mesh_on_one_device_and_batch_sharding():
    mesh = make_mesh(devices=jax.devices()[:1])
    assert batch_sharding(mesh).spec == P(None)  # every axis has size 1
    x = jnp.ones((2, 3))
    with use_mesh(mesh):
        assert active_mesh() is mesh
        assert (jax.jit(lambda a: shard(a, ("batch", "act_embed")))(x) == x).all()
    assert active_mesh() is None


def test_init_distributed_single_host_is_a_noop():
    assert init_distributed() is False
    assert init_distributed(num_processes=1) is False
    with pytest.raises(ConfigError, match="need coordinator_address, num_processes and process_id together"):
        init_distributed("10.0.0.1:1234", num_processes=2)
    with pytest.raises(ConfigError, match=r"process_id must be in \[0, 2\)"):
        init_distributed("10.0.0.1:1234", num_processes=2, process_id=2)


_EIGHT_DEVICE_SCRIPT = textwrap.dedent(
    """
    import json
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from tempax.parallel import batch_sharding, make_mesh, param_shardings, shard, shard_params, use_mesh

    assert jax.device_count() == 8, jax.devices()

    def build():
        with nnx.use_eager_sharding(False):
            model = nnx.Linear(
                16, 8, rngs=nnx.Rngs(0),
                kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(), ("embed", "mlp")),
                bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), ("mlp",)),
            )
        # Small integers: every product and partial sum is exact in float32, so any reduction order agrees.
        model.kernel.set_value((jnp.arange(16 * 8, dtype=jnp.float32) % 7 - 3).reshape(16, 8))
        model.bias.set_value(jnp.arange(8, dtype=jnp.float32) - 4)
        return model

    def spec_of(array):
        # JAX prints and trims specs differently across versions; compare one entry per dimension instead.
        spec = list(array.sharding.spec)
        return [list(e) if isinstance(e, tuple) else e for e in spec + [None] * (array.ndim - len(spec))]

    x = (jnp.arange(8 * 16, dtype=jnp.float32) % 5 - 2).reshape(8, 16)

    def forward(model, x):
        return shard(model(shard(x, ("batch", "act_embed"))), ("batch", "act_mlp"))

    reference = np.asarray(nnx.jit(forward)(build(), x))
    results = {}
    for sizes in ({"data": 8}, {"data": 1, "fsdp": 8}, {"data": 1, "fsdp": 4, "tensor": 2}):
        mesh = make_mesh(**sizes)
        graphdef, state = nnx.split(build())
        state = shard_params(state, mesh)
        with use_mesh(mesh):
            model = nnx.merge(graphdef, state)
            out = nnx.jit(forward)(model, jax.device_put(x, batch_sharding(mesh)))
        results[json.dumps(sizes)] = {
            "equal": bool((np.asarray(out) == reference).all()),
            "kernel": spec_of(state["kernel"].get_value()),
            "bias": spec_of(state["bias"].get_value()),
            "kernel_shards": len({str(s.index) for s in state["kernel"].get_value().addressable_shards}),
            "planned": str(param_shardings(state, mesh)["kernel"].get_value().spec),
            "actual": str(state["kernel"].get_value().sharding.spec),
            "out": spec_of(out),
        }
    print("RESULTS" + json.dumps(results))
    """
)


def test_sharded_linear_matches_unsharded_on_8_fake_devices():
    """y = x @ W + b with W [16, 8] named ('embed', 'mlp'): the same numbers on meshes (data=8), (fsdp=8) and
    (fsdp=4, tensor=2), with W split 1, 8 and 4 x 2 ways."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join([*flags, "--xla_force_host_platform_device_count=8"])
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-c", _EIGHT_DEVICE_SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULTS"))
    results = {tuple(json.loads(k).items()): v for k, v in json.loads(line.removeprefix("RESULTS")).items()}

    data8 = results[(("data", 8),)]
    assert data8["equal"]
    assert data8["kernel"] == [None, None] and data8["kernel_shards"] == 1  # replicated
    assert data8["out"] == ["data", None]

    fsdp8 = results[(("data", 1), ("fsdp", 8))]
    assert fsdp8["equal"]
    assert fsdp8["kernel"] == ["fsdp", None] and fsdp8["kernel_shards"] == 8
    assert fsdp8["bias"] == [None]
    assert fsdp8["out"] == ["fsdp", None]

    fsdp4_tp2 = results[(("data", 1), ("fsdp", 4), ("tensor", 2))]
    assert fsdp4_tp2["equal"]
    assert fsdp4_tp2["kernel"] == ["fsdp", "tensor"] and fsdp4_tp2["kernel_shards"] == 8
    assert fsdp4_tp2["bias"] == ["tensor"]
    assert fsdp4_tp2["planned"] == fsdp4_tp2["actual"]
    assert fsdp4_tp2["out"] == ["fsdp", "tensor"]


def test_expert_kernels_take_the_fsdp_axis_where_the_expert_count_divides_it():
    """Stacked expert kernels [L, E, embed, mlp] on the (2, 2, 2) mesh: 6 experts split over fsdp (expert
    parallelism) with mlp over tensor; 3 experts do not divide fsdp = 2, so embed takes it (FSDP); the router
    [L, embed, E] keeps FSDP on embed."""
    names = ("layers", "expert", "embed", "mlp")
    assert logical_to_spec(names, mesh=MESH_222, shape=(2, 6, 16, 8)) == P(None, "fsdp", None, "tensor")
    assert logical_to_spec(names, mesh=MESH_222, shape=(2, 3, 16, 8)) == P(None, None, "fsdp", "tensor")
    assert logical_to_spec(("layers", "embed", None), mesh=MESH_222, shape=(2, 16, 6)) == P(None, "fsdp", None)


@pytest.mark.heavy
def test_a_mixture_of_experts_step_on_8_devices_matches_one_device(tmp_path):
    """One SFT step (SGD, lr 1) of tiny-qwen3-moe (6 experts) on 8 fake CPU devices, data 2 x fsdp 2 x tensor 2:
    the experts are split over fsdp and their inner dimension over tensor, and the loss, the router's auxiliary
    loss and every updated weight equal the one-device step's."""
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    from numpy.testing import assert_allclose

    from tempax.models.presets import PRESETS
    from tests.train.helpers import one_and_eight_device_sgd_steps

    cfg = PRESETS["tiny-qwen3-moe"].replace(num_layers=2)
    (one_m, one_p, _), (eight_m, eight_p, eight_state) = one_and_eight_device_sgd_steps(cfg, tmp_path)
    experts = eight_state.params["layers.mlp.experts.gate_proj"]
    assert experts.sharding.spec == P(None, "fsdp", None, "tensor")
    for key in ("loss", "moe_aux_loss", "moe_max_load"):
        assert_allclose(eight_m[key], one_m[key], rtol=1e-5, err_msg=key)
    for key in one_p:
        assert_allclose(eight_p[key], one_p[key], atol=1e-5, err_msg=key)
