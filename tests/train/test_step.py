"""The shared train step: hand-worked losses, masking, accumulation and sharding invariance, non-finite stops."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose

from tempax.algorithms.sft.main import make_sft_loss
from tempax.models.decoder import Decoder
from tempax.models.presets import PRESETS
from tempax.train.config import MeshConfig, OptimizerConfig
from tempax.train.loop import Trainer, TrainingDiverged
from tests.train.helpers import hand_batch, host, random_batch, table_lm, tiny_train_config

from flax import nnx


def sgd(lr: float) -> OptimizerConfig:
    return OptimizerConfig(name="sgd", learning_rate=lr, schedule="constant", weight_decay=0.0, grad_clip_norm=None)


def test_step_loss_is_the_hand_worked_cross_entropy():
    """Token mean over the 3 supervised tokens: (ln 2 + ln 3 + ln 4) / 3 = ln 24 / 3 = 1.059351.
    With SGD at lr 1: table row 1 gets the gradient of position (row 0, t1) only: (softmax - onehot(0)) / 3 =
    ([1/3, 1/3, 1/3] - [1, 0, 0]) / 3 = [-2/9, 1/9, 1/9], so the new row 1 is [2/9, -1/9, -1/9]."""
    trainer = Trainer(table_lm(), make_sft_loss(), tiny_train_config(batch_size=2, seq_len=3, optimizer=sgd(1.0)))
    metrics = host(trainer.train_step(hand_batch()))
    assert_allclose(metrics["loss"], math.log(24) / 3, rtol=1e-6)
    assert_allclose(metrics["num_tokens"], 3.0)
    assert_allclose(host(trainer.state.params)["table"][1], [2 / 9, -1 / 9, -1 / 9], rtol=1e-5)


def test_masked_tokens_contribute_nothing():
    """Changing targets and tokens at masked positions changes neither the loss nor the update."""
    base = hand_batch()
    other = {k: v.copy() for k, v in base.items()}
    other["targets"][0, 2], other["targets"][1, 1:] = 0, [2, 0]
    other["tokens"][1, 2] = 2
    results = []
    for batch in (base, other):
        trainer = Trainer(table_lm(), make_sft_loss(), tiny_train_config(batch_size=2, seq_len=3, optimizer=sgd(1.0)))
        loss = host(trainer.train_step(batch))["loss"]
        results.append((loss, host(trainer.state.params)["table"]))
    assert_allclose(results[0][0], results[1][0], rtol=0, atol=0)
    assert_allclose(results[0][1], results[1][1], rtol=0, atol=0)


@pytest.fixture(scope="module")
def tiny_model_cfg():
    # One layer: the invariances are per layer, and XLA:CPU compile time grows with depth.
    return PRESETS["tiny-llama"].replace(num_layers=1)


@pytest.fixture(scope="module")
def one_device_reference(tiny_model_cfg):
    return _one_step(tiny_model_cfg, random_batch(8, 16, seed=1))


def _decoder(cfg, seed=0):
    return Decoder(cfg, rngs=nnx.Rngs(seed))


_SHARED: dict = {}


def _shared_decoder(cfg):
    # Trainer never changes the arrays of the model it is given (it trains copies), so tests that neither set
    # precision nor remat can share one eagerly initialised model.
    if cfg not in _SHARED:
        _SHARED[cfg] = _decoder(cfg)
    return _SHARED[cfg]


def _one_step(cfg, batch, *, loss_fn=None, **train_kw):
    # SGD at lr 1: the update is exactly minus the gradient, so comparing parameters compares gradients. (Adam's
    # m / sqrt(v) turns float rounding of a ~0 gradient into a +-lr step and would hide what is being tested.)
    model = _decoder(cfg) if train_kw.get("remat") or train_kw.get("precision") else _shared_decoder(cfg)
    trainer = Trainer(model, loss_fn or make_sft_loss(), tiny_train_config(optimizer=sgd(1.0), **train_kw))
    metrics = host(trainer.train_step(batch))
    return metrics, host(trainer.state.params)


def _recording_sft_loss(seen: list):
    """The SFT loss, plus a host callback that records the tokens of every micro-batch it is run on."""
    sft = make_sft_loss()

    def loss_fn(model, batch):
        jax.debug.callback(lambda tokens: seen.append(np.asarray(tokens)), batch["tokens"])
        return sft(model, batch)

    return loss_fn


def test_micro_batch_accumulation_equals_one_pass(tiny_model_cfg):
    """8 micro-batches of 1 row (rows with different token counts) give the same token-mean loss, grad norm and
    AdamW update as one pass over the 8 rows."""
    batch = random_batch(8, 16)
    full_seen, acc_seen = [], []
    full_m, full_p = _one_step(tiny_model_cfg, batch, loss_fn=_recording_sft_loss(full_seen))
    acc_m, acc_p = _one_step(tiny_model_cfg, batch, loss_fn=_recording_sft_loss(acc_seen), micro_batch_size=1)
    # The passes that actually ran: one of 8 rows, and 8 of 1 row that together are the batch's rows, each once.
    assert [t.shape[0] for t in full_seen] == [8]
    assert [t.shape[0] for t in acc_seen] == [1] * 8
    assert sorted(map(bytes, np.concatenate(acc_seen))) == sorted(map(bytes, np.asarray(batch["tokens"])))
    assert_allclose(acc_m["loss"], full_m["loss"], rtol=1e-6)
    assert_allclose(acc_m["grad_norm"], full_m["grad_norm"], rtol=1e-5)
    assert_allclose(acc_m["num_tokens"], full_m["num_tokens"])
    assert_allclose(acc_m["token_accuracy"], full_m["token_accuracy"], rtol=1e-6)
    for key in full_p:
        assert_allclose(acc_p[key], full_p[key], atol=1e-6, err_msg=key)


@pytest.mark.parametrize("mesh", [dict(data=1, fsdp=8), dict(data=1, fsdp=4, tensor=2)], ids=["fsdp8", "fsdp4xtp2"])
def test_sharded_step_matches_one_device(tiny_model_cfg, one_device_reference, mesh):
    """A train step on 8 (fake CPU) devices under FSDP / FSDP x tensor gives the 1-device loss and update."""
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    batch = random_batch(8, 16, seed=1)
    ref_m, ref_p = one_device_reference
    trainer = Trainer(_shared_decoder(tiny_model_cfg), make_sft_loss(),
                      tiny_train_config(optimizer=sgd(1.0), mesh=MeshConfig(num_devices=8, **mesh)))
    metrics = host(trainer.train_step(batch))
    kernel = trainer.state.params["layers.mlp.up_proj.kernel"]
    assert len(kernel.sharding.device_set) == 8
    assert not kernel.sharding.is_fully_replicated
    assert_allclose(metrics["loss"], ref_m["loss"], atol=1e-5)
    assert_allclose(metrics["grad_norm"], ref_m["grad_norm"], rtol=1e-4)
    params = host(trainer.state.params)
    for key in ref_p:
        assert_allclose(params[key], ref_p[key], atol=1e-5, err_msg=key)


def test_nonfinite_loss_stops_with_the_step_and_keeps_finite_params(tmp_path):
    """A loss that turns NaN at the 3rd step stops the run naming step 3; parameters keep their step-2 values,
    and no checkpoint is written after it."""

    def loss_fn(model, batch):
        logits, _ = model(batch["tokens"])
        loss = jnp.mean(logits[..., 0] ** 2)
        return jnp.where(batch["poison"][0] > 0, jnp.nan, loss), {}

    def batches():
        for i in range(10):
            b = hand_batch()
            b["poison"] = np.full((2,), 1 if i == 2 else 0, np.int32)
            yield b

    cfg = tiny_train_config(tmp_path, steps=6, batch_size=2, seq_len=3, optimizer=sgd(0.1), log_every=4,
                            checkpoint=tiny_train_config().checkpoint.__class__(every=2, async_save=False))
    trainer = Trainer(table_lm(), loss_fn, cfg)
    seen = []
    from tempax.train.hooks import every

    with pytest.raises(TrainingDiverged, match=r"step 3\b.*checkpoints/2"):
        trainer.fit(batches(), hooks=[every(1, lambda info: seen.append(host(info.trainer.state.params)))])
    assert np.all(np.isfinite(host(trainer.state.params)["table"]))
    assert_allclose(host(trainer.state.params)["table"], seen[1]["table"])
    assert sorted(trainer.checkpointer.all_steps()) == [2]
    trainer.close()


@pytest.mark.slow
def test_remat_gives_the_same_update_and_bf16_keeps_float32_masters(tiny_model_cfg):
    """remat=full recomputes activations in the backward pass: same loss and gradients as no remat. bf16 compute
    keeps float32 master weights and optimizer state, and its loss is close to the float32 one."""
    batch = random_batch(8, 16, seed=3)
    ref_m, ref_p = _one_step(tiny_model_cfg, batch)
    remat_m, remat_p = _one_step(tiny_model_cfg, batch, remat="full")
    assert_allclose(remat_m["loss"], ref_m["loss"], rtol=1e-6)
    for key in ref_p:
        assert_allclose(remat_p[key], ref_p[key], atol=1e-6, err_msg=key)
    trainer = Trainer(_decoder(tiny_model_cfg), make_sft_loss(), tiny_train_config(precision="bf16"))
    metrics = host(trainer.train_step(batch))
    assert_allclose(metrics["loss"], ref_m["loss"], rtol=2e-2)
    assert all(v.dtype == jnp.float32 for v in jax.tree.leaves(trainer.state.params))
    assert all(v.dtype == jnp.float32 for v in jax.tree.leaves(trainer.state.opt_state) if v.ndim)
    assert trainer.model.config.dtype == "bfloat16"


def test_a_mixture_of_experts_step_reports_and_trains_the_router_aux_loss(tmp_path):
    """tiny-qwen3-moe (one layer) under SFT's loss: the step reports moe_aux_loss and moe_max_load; with
    `train_aux_loss` its loss is the token loss plus router_aux_loss_coef * moe_aux_loss (0.5 here, so the term is
    visible), without it the token loss alone, and only then do the router's weights move differently."""
    cfg = PRESETS["tiny-qwen3-moe"].replace(num_layers=1)
    batch = random_batch(4, 8, seed=3)
    results = {}
    for train in (False, True):
        moe = dataclasses.replace(cfg.moe, train_aux_loss=train, router_aux_loss_coef=0.5)
        trainer = Trainer(Decoder(cfg.replace(moe=moe), rngs=nnx.Rngs(0)), make_sft_loss(),
                          tiny_train_config(tmp_path, batch_size=4, seq_len=8, optimizer=sgd(1.0)))
        metrics = host(trainer.train_step(batch))
        results[train] = metrics, host(trainer.state.params)["layers.mlp.gate.kernel"]
    (off, router_off), (on, router_on) = results[False], results[True]
    assert 1.0 <= off["moe_max_load"] <= 3.0 and off["moe_aux_loss"] > 0
    assert_allclose(on["moe_aux_loss"], off["moe_aux_loss"], rtol=1e-6)
    assert_allclose(on["loss"], off["loss"] + 0.5 * off["moe_aux_loss"], rtol=1e-6)
    assert not np.allclose(router_on, router_off)
