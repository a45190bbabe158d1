"""Training state in host memory (train.memory=offload_optimizer / offload_optimizer_and_master) and in bfloat16
(bf16_moments): where the arrays live, that the step streams one parameter at a time, and that training matches
the state held on the device (on XLA:CPU the moves compile to nothing, so the numbers must agree)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose

from tempax.algorithms.sft.main import make_sft_loss
from tempax.train.checkpoint import Checkpointer
from tempax.train.config import CheckpointConfig, OptimizerConfig
from tempax.train.loop import Trainer
from tempax.train import offload
from tempax.train.offload import merge_params, select_params, stream_pieces
from tests.kit.models import tiny_tempax_model
from tests.train.helpers import random_batch, tiny_train_config

BATCHES = [random_batch(8, 16, vocab=128, seed=i) for i in range(3)]


def trained(tmp_path, memory: str, **kw) -> Trainer:
    trainer = Trainer(tiny_tempax_model("llama"), make_sft_loss(), tiny_train_config(tmp_path / memory, memory=memory,
                                                                                    **kw))
    for batch in BATCHES:
        trainer.train_step(batch)
    return trainer


def kinds(tree) -> set[str]:
    return {x.sharding.memory_kind for x in jax.tree.leaves(tree) if getattr(x, "ndim", 0)}


def test_a_part_of_an_optimizer_state_and_back():
    """AdamW's state cut to one parameter holds that parameter's moments and the shared counts; the parts of
    every parameter merge back into the whole state."""
    cfg = OptimizerConfig(learning_rate=0.1, weight_decay=0.1)
    params = {"a": jnp.ones((2, 3)), "b": jnp.full((4,), 2.0)}
    opt = cfg.build(10)
    state = opt.update(params, opt.init(params), params)[1]
    keys = frozenset(params)
    parts = [select_params(state, (k,), keys) for k in params]
    assert set(parts[0][1][0].mu) == {"a"} and parts[0][1][0].count == state[1][0].count
    merged = merge_params(parts, keys)
    assert jax.tree.structure(merged) == jax.tree.structure(state)
    for x, y in zip(jax.tree.leaves(merged), jax.tree.leaves(state)):
        assert_allclose(np.asarray(x), np.asarray(y))


@pytest.mark.heavy
@pytest.mark.parametrize("memory", ["offload_optimizer", "offload_optimizer_and_master"])
def test_offloaded_state_lives_in_host_memory_and_trains_as_on_the_device(tmp_path, memory):
    """The moments (and with the master the weights) are pinned_host arrays between steps; three steps give the
    weights the device-resident state gives (the same update, one parameter at a time); the weights a source
    reads (`params`) and the held-out loss come from the device."""
    device = trained(tmp_path, "device")
    offloaded = trained(tmp_path, memory)
    assert kinds(offloaded.state.opt_state[1][0].mu) == {"pinned_host"}
    assert kinds(offloaded.state.params) == ({"pinned_host"} if memory.endswith("master") else {"device"})
    assert kinds(offloaded.params) == {"device"}
    want, got = jax.device_get(device.params), jax.device_get(offloaded.params)
    for key in want:
        assert_allclose(got[key], want[key], atol=1e-6, err_msg=key)
    held_out = [random_batch(8, 16, vocab=128, seed=9)]
    assert offloaded.evaluate(held_out)["loss"] == pytest.approx(device.evaluate(held_out)["loss"], rel=1e-6)


def test_a_parameter_streams_in_blocks_of_rows_of_bounded_size():
    """A weight stacked on the layers axis streams one layer at a time when a layer is the most the device takes
    at once, a matrix in the fewest blocks of rows that divide it within the bound, a small or device-split one
    whole (the Llama-3.2-1B shape at the default bound of 2^24 elements: its MLP kernels per layer, its
    embedding in 16 blocks of 8016 rows)."""
    assert stream_pieces((16, 2048, 8192)) == 16
    assert stream_pieces((16, 8192, 2048)) == 16
    assert stream_pieces((128256, 2048)) == 16 and 128256 // 16 * 2048 <= 2**24 < 128256 // 8 * 2048
    assert stream_pieces((16, 2048)) == 1 and stream_pieces((2048,)) == 1 and stream_pieces(()) == 1
    assert stream_pieces((16, 2048, 8192), ("fsdp", None, None)) == 1
    assert stream_pieces((16, 2048, 8192), (None, "fsdp", None)) == 16


@pytest.mark.heavy
@pytest.mark.parametrize("memory", ["offload_optimizer", "offload_optimizer_and_master"])
def test_a_stacked_model_streamed_in_pieces_trains_as_on_the_device(tmp_path, monkeypatch, memory):
    """With a bound of 2048 elements a piece, the 4 layers' stacked kernels ([4, 64, 96]) stream one layer at a
    time, the embedding and the head in 4 blocks of rows, the norms whole; AdamW with weight decay (a mask by
    ndim, which a block keeps) and clipping gives, over three steps, the weights and moments of the update on the
    device, and the update count of one step per step."""
    monkeypatch.setattr(offload, "PIECE_ELEMENTS", 2048)
    opt = OptimizerConfig(learning_rate=1e-2, schedule="constant", weight_decay=0.1, grad_clip_norm=0.5)

    def run(memory: str) -> Trainer:
        trainer = Trainer(tiny_tempax_model("llama", num_layers=4), make_sft_loss(),
                          tiny_train_config(tmp_path / memory, memory=memory, optimizer=opt))
        for batch in BATCHES:
            trainer.train_step(batch)
        return trainer

    shapes = {k: v.shape for k, v in run("device").state.params.items()}
    assert stream_pieces(shapes["layers.mlp.up_proj.kernel"]) == 4
    assert stream_pieces(shapes["embed_tokens.embedding"]) == 4 == stream_pieces(shapes["lm_head.kernel"])
    assert stream_pieces(shapes["layers.input_layernorm.weight"]) == 1
    device, streamed = run("device"), run(memory)
    want, got = jax.device_get(device.params), jax.device_get(streamed.params)
    for key in want:
        assert_allclose(got[key], want[key], atol=1e-6, err_msg=key)
    want_adam, got_adam = jax.device_get(device.state.opt_state[1][0]), jax.device_get(streamed.state.opt_state[1][0])
    assert int(got_adam.count) == int(want_adam.count) == 3
    for key in want:
        assert_allclose(got_adam.mu[key], want_adam.mu[key], atol=1e-7, err_msg=key)
        assert_allclose(got_adam.nu[key], want_adam.nu[key], atol=1e-9, err_msg=key)
    jaxpr = str(jax.make_jaxpr(streamed._step)(streamed.state, streamed.rest, streamed.put_batch(BATCHES[0])))
    assert jaxpr.count("scan[") >= 4  # the stacked kernels' loops, and the embedding's and head's


def test_the_update_brings_in_one_parameter_after_another(tmp_path):
    """Streamed, parameter i + 1's state goes to the device only after parameter i's has gone back: the step's
    program chains them with one optimization barrier per parameter after the first (beyond those the
    device-resident step has), and moves each part of the state to the device and back."""
    def program(memory: str) -> tuple[Trainer, str]:
        trainer = Trainer(tiny_tempax_model("llama"), make_sft_loss(), tiny_train_config(tmp_path, memory=memory))
        return trainer, str(jax.make_jaxpr(trainer._step)(trainer.state, trainer.rest, trainer.put_batch(BATCHES[0])))

    trainer, streamed = program("offload_optimizer")
    _, resident = program("device")
    extra = streamed.count("optimization_barrier") - resident.count("optimization_barrier")
    assert extra == len(trainer.trainable_keys) - 1
    assert "memory_kind=pinned_host" in streamed and "memory_kind=device" in streamed
    assert "pinned_host" not in resident


@pytest.mark.heavy
def test_offloaded_state_checkpoints_and_resumes(tmp_path):
    """A run with its state in host memory saves a checkpoint and resumes from it into host memory; the resumed
    run ends where a device-resident run resumed from the same step ends."""
    ckpt = CheckpointConfig(every=2, save_at_end=True, async_save=False)

    def run(memory: str, steps: int, where) -> Trainer:
        trainer = Trainer(tiny_tempax_model("llama"), make_sft_loss(),
                          tiny_train_config(where, memory=memory, steps=steps, checkpoint=ckpt))
        trainer.fit(list(BATCHES))
        trainer.close()
        return trainer

    run("offload_optimizer_and_master", 2, tmp_path / "host")
    host = run("offload_optimizer_and_master", 3, tmp_path / "host")
    run("device", 2, tmp_path / "device")
    device = run("device", 3, tmp_path / "device")
    assert host.step == 3 and kinds(host.state.params) == {"pinned_host"}
    assert Checkpointer(str(tmp_path / "host" / "checkpoints")).latest_step() == 3
    want, got = jax.device_get(device.params), jax.device_get(host.params)
    for key in want:
        assert_allclose(got[key], want[key], atol=1e-6, err_msg=key)


@pytest.mark.heavy
def test_bf16_moments_store_bfloat16_and_train_like_float32(tmp_path):
    """The moments are bfloat16 on the device; three steps of AdamW (lr 1e-2) keep the loss within 1% of the
    float32-moment run's."""
    device = trained(tmp_path, "device")
    low = trained(tmp_path, "bf16_moments")
    assert {x.dtype for x in jax.tree.leaves(low.state.opt_state[1][0].mu)} == {jnp.dtype(jnp.bfloat16)}
    held_out = [random_batch(8, 16, vocab=128, seed=9)]
    assert low.evaluate(held_out)["loss"] == pytest.approx(device.evaluate(held_out)["loss"], rel=1e-2)
