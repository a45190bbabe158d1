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
from tempax.train.offload import merge_params, select_params
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


def test_bf16_moments_store_bfloat16_and_train_like_float32(tmp_path):
    """The moments are bfloat16 on the device; three steps of AdamW (lr 1e-2) keep the loss within 1% of the
    float32-moment run's."""
    device = trained(tmp_path, "device")
    low = trained(tmp_path, "bf16_moments")
    assert {x.dtype for x in jax.tree.leaves(low.state.opt_state[1][0].mu)} == {jnp.dtype(jnp.bfloat16)}
    held_out = [random_batch(8, 16, vocab=128, seed=9)]
    assert low.evaluate(held_out)["loss"] == pytest.approx(device.evaluate(held_out)["loss"], rel=1e-2)
