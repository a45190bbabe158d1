"""Checkpoints across mesh shapes, and the depth-independent initialiser (`tempax.models.init`)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from numpy.testing import assert_allclose

from tempax.algorithms.sft.main import make_sft_loss
from tempax.models import init as model_init
from tempax.models.decoder import Decoder
from tempax.models.init import init_decoder
from tempax.models.presets import PRESETS, TINY_FAMILIES, tiny_preset_name
from tempax.parallel import make_mesh, use_mesh
from tempax.parallel.process import host_array, process_rows
from tempax.parallel.rules import batch_sharding
from tempax.train.config import CheckpointConfig, MeshConfig
from tempax.train.loop import Trainer
from tempax.train.state import init_sharded
from tests.kit.models import family_cases
from tests.train.helpers import random_batch, tiny_train_config

needs_8 = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 host devices (tests/conftest.py sets them)")


def _flat(model):
    return {k: np.asarray(jax.device_get(v.get_value())) for k, v in nnx.to_flat_state(nnx.state(model))}


@needs_8
@pytest.mark.parametrize("family", family_cases(TINY_FAMILIES))
def test_layerwise_init_equals_the_one_program_constructor(family):
    """Every weight of `init_decoder` on a 2 x 2 (fsdp x tensor) mesh equals, bit for bit, the one-program jitted
    constructor (`init_sharded`): the same random draws in the same order; and each lands in its shard."""
    cfg = PRESETS[tiny_preset_name(family)]
    mesh = make_mesh(fsdp=2, tensor=2, devices=jax.devices()[:4])
    new = init_decoder(cfg, 7, mesh)
    old = _flat(init_sharded(lambda: Decoder(cfg, rngs=nnx.Rngs(7)), mesh))
    got = _flat(new)
    assert got.keys() == old.keys()
    for key in old:
        np.testing.assert_array_equal(got[key], old[key], err_msg=str(key))
    up = new.layers.mlp.up_proj.kernel.get_value()
    assert up.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")


def test_layer_program_is_traced_once_whatever_the_depth(monkeypatch):
    """Six layers: the per-layer initialiser is traced (hence compiled) once, not six times."""
    traces = []
    original = model_init.DecoderLayer

    def counting_layer(*args, **kwargs):
        traces.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(model_init, "DecoderLayer", counting_layer)
    model = init_decoder(PRESETS["tiny-llama"].replace(num_layers=6), 0)
    assert model.layers.mlp.up_proj.kernel.shape[0] == 6
    assert len(traces) == 1  # without a mesh there is no abstract pass for the output shardings: one trace



def test_every_layer_is_drawn_by_one_call_whatever_the_depth(monkeypatch):
    """Six layers: each of the three programs (embedding, layers, head) runs once; the layers' weights come out
    stacked from that one call, equal bit for bit to the one-program jitted constructor's."""
    calls = []
    original = model_init.decoder_programs

    def counting_programs(*args, **kwargs):
        programs = original(*args, **kwargs)
        counted = lambda name, run: lambda *a: calls.append(name) or run(*a)  # noqa: E731
        return {name: counted(name, p) if callable(p) else p for name, p in programs.items()}

    monkeypatch.setattr(model_init, "decoder_programs", counting_programs)
    cfg = PRESETS["tiny-llama"].replace(num_layers=6)
    got = _flat(init_decoder(cfg, 5))
    assert sorted(calls) == ["embedding", "head", "layers"]
    want = _flat(nnx.jit(lambda: Decoder(cfg, rngs=nnx.Rngs(5)))())
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=str(key))


@needs_8
@pytest.mark.heavy
def test_checkpoint_saved_on_8_fsdp_restores_onto_2x2_fsdp_tensor_with_equal_logits(tmp_path):
    """Two steps on 8 devices (fsdp=8), checkpoint; a new trainer on 4 devices (fsdp=2 x tensor=2) restores it:
    parameters are resharded to the new mesh and the model's logits equal the saved model's (atol 1e-5)."""
    cfg = PRESETS["tiny-llama"].replace(num_layers=2)
    batch = random_batch(8, 16, seed=3)
    train = dict(checkpoint=CheckpointConfig(every=0, save_at_end=True, async_save=False), steps=2)
    first = Trainer(init_decoder(cfg, 0), make_sft_loss(),
                    tiny_train_config(tmp_path, mesh=MeshConfig(num_devices=8, fsdp=8), **train))
    first.fit([batch, batch])
    tokens = batch["tokens"]
    with use_mesh(first.mesh):
        before = host_array(jax.jit(lambda m, t: m(t)[0])(first.model, tokens))
    kernel = first.state.params["layers.mlp.up_proj.kernel"]  # [L, embed, mlp]: the layer axis stays whole
    assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", None)
    first.close()

    second = Trainer(init_decoder(cfg, 1), make_sft_loss(),  # other seed: every value must come from the checkpoint
                     tiny_train_config(tmp_path, mesh=MeshConfig(num_devices=4, fsdp=2, tensor=2), **train))
    second.restore()
    assert second.step == 2
    restored = second.state.params["layers.mlp.up_proj.kernel"]
    assert restored.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    assert len(restored.sharding.device_set) == 4
    with use_mesh(second.mesh):
        after = host_array(jax.jit(lambda m, t: m(t)[0])(second.model, tokens))
    assert_allclose(after, before, atol=1e-5)
    second.close()


@needs_8
def test_process_rows_cover_the_batch_once():
    """Batch sharding on an 8-device mesh (data 2 x fsdp 2 x tensor 2): the devices' rows partition the batch,
    and the single process owns all 8 rows."""
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    sharding = batch_sharding(mesh)
    assert process_rows(8, sharding) == list(range(8))
    per_device = [range(8)[idx[0]] for idx in sharding.devices_indices_map((8,)).values()]
    assert sorted({r for rows in per_device for r in rows}) == list(range(8))
