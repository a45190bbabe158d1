"""The memory plan: hand-worked byte counts and the fixes it names when a step cannot fit."""

from __future__ import annotations

import pytest

from tempax.models.config import ModelConfig
from tempax.models.presets import PRESETS
from tempax.train import memory as mem

SMALL = ModelConfig(vocab_size=100, hidden_size=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4,
                    intermediate_size=16)


def test_plan_matches_hand_count():
    """P = 2 layers x (attn 8*8 + 2*8*4 + 8*8 = 192, mlp 3*8*16 = 384, norms 16) + embed 800 + final norm 8 = 1992.
    fp32 AdamW, 1 device, micro-batch 2 x seq 4 = 8 tokens, no remat:
      weights 1992*4 = 7968, gradients 7968, optimizer 2*7968 = 15936,
      per layer and token (5*8 + 3*2*4 + 4*1*4 + 4*16)*4 + 2*4*(4+4) = 640 bytes;
      activations 8 * (640*2 + 4*8*4) = 11264; logits 8 * 100 * 12 = 9600;
      total (7968 + 7968 + 15936 + 11264 + 9600) * 1.1 = 58009."""
    assert SMALL.num_params() == 1992
    plan = mem.plan_memory(mem.PlanInputs(model=SMALL, micro_batch_size=2, seq_len=4))
    assert (plan.weights, plan.gradients, plan.optimizer, plan.activations, plan.logits) == (
        7968, 7968, 15936, 11264, 9600)
    assert plan.total == 58009
    # Full remat keeps only each layer's input (8 * 4 bytes) plus one layer being recomputed:
    # 8 * (32 * 2 + 640 + 128) = 6656.
    assert mem.plan_memory(mem.PlanInputs(model=SMALL, micro_batch_size=2, seq_len=4, remat="full")).activations == 6656
    # A chunked loss holds logits for 3 positions of each of the 2 rows: 6 * 100 * 12 = 7200; a reward model's
    # scalar head (loss_chunk_len 0) none.
    chunked = mem.PlanInputs(model=SMALL, micro_batch_size=2, seq_len=4, loss_chunk_len=3)
    assert mem.plan_memory(chunked).logits == 7200
    assert mem.plan_memory(mem.PlanInputs(model=SMALL, micro_batch_size=2, seq_len=4, loss_chunk_len=0)).logits == 0


def test_lora_and_sharding_shrink_the_plan():
    """LoRA: only the adapters get gradients and Adam moments; FSDP over 4 devices splits weights by 4."""
    base = mem.PlanInputs(model=PRESETS["bench-small"], micro_batch_size=8, seq_len=256)
    full = mem.plan_memory(base)
    lora = mem.plan_memory(mem.PlanInputs(**{**base.__dict__, "trainable_params": 1_000_000}))
    assert lora.optimizer == 8_000_000 and lora.gradients == 4_000_000
    fsdp = mem.plan_memory(mem.PlanInputs(**{**base.__dict__, "mesh_shape": (("data", 1), ("fsdp", 4))}))
    assert fsdp.weights == full.weights // 4
    assert fsdp.activations < full.activations


def test_too_big_names_settings_that_fit():
    """bench-small (135M) full fine-tuning of 64 x 512 tokens cannot fit 8 GiB; the error names a micro-batch
    (and the other knobs) that would."""
    p = mem.PlanInputs(model=PRESETS["bench-small"], micro_batch_size=64, seq_len=512, num_micro_batches=1)
    capacity = 8 * mem.GiB
    with pytest.raises(mem.OutOfMemoryPlan, match=r"train\.micro_batch_size=\d+") as info:
        mem.check_fits(p, batch_size=64, capacity=capacity)
    assert "GiB" in str(info.value) and "remat" in str(info.value)
    best = mem.largest_fitting_micro_batch(p, 64, capacity)
    assert best is not None and best < 64
    fits = mem.plan_memory(mem.PlanInputs(**{**p.__dict__, "micro_batch_size": best, "num_micro_batches": 64 // best}),
                           capacity)
    assert fits.fits
    bigger = [m for m in mem.micro_batch_candidates(64, 1) if m > best][-1]
    assert not mem.plan_memory(mem.PlanInputs(**{**p.__dict__, "micro_batch_size": bigger}), capacity).fits


def test_nothing_fits_says_so():
    p = mem.PlanInputs(model=PRESETS["llama3.1-8b"], micro_batch_size=1, seq_len=8192, remat="full")
    with pytest.raises(mem.OutOfMemoryPlan, match="mesh.fsdp|QLoRA"):
        mem.check_fits(p, batch_size=1, capacity=1 * mem.GiB)


def test_trainer_plans_with_the_remat_setting_it_applies(tmp_path):
    """`train.remat` overrides the model's setting; the printed plan must describe that run, not the model's, and
    the trainer applies it (and bf16 compute) to its own view: the caller's model object keeps its config."""
    from tempax.algorithms.sft.main import make_sft_loss
    from tempax.train.loop import Trainer
    from tests.kit.models import tiny_tempax_model
    from tests.train.helpers import tiny_train_config

    said: list[str] = []
    model = tiny_tempax_model("llama")
    assert model.config.remat == "none"
    trainer = Trainer(model, make_sft_loss(), tiny_train_config(tmp_path, remat="full", check_memory=True,
                                                                precision="bf16"), log=said.append)
    assert model.config.remat == "none" and model.config.dtype == "float32"
    assert trainer.model.config.remat == "full" and trainer.model.config.dtype == "bfloat16"
    assert any("remat full" in line for line in said), said


def test_trainer_reports_the_compiled_steps_memory_without_running_it(tmp_path):
    """`step_memory` is XLA's account of the compiled step: its arguments hold at least the float32 weights and
    AdamW's two moments, and computing it leaves the step count alone."""
    from tempax.algorithms.sft.main import make_sft_loss
    from tempax.train.loop import Trainer
    from tests.kit.models import tiny_tempax_model
    from tests.train.helpers import random_batch, tiny_train_config

    model = tiny_tempax_model("llama")
    weight_bytes = 4 * model.config.num_params()
    trainer = Trainer(model, make_sft_loss(), tiny_train_config(tmp_path))
    analysis = trainer.step_memory(random_batch(8, 16, vocab=model.config.vocab_size))
    assert analysis.argument_size_in_bytes >= 3 * weight_bytes
    assert analysis.temp_size_in_bytes > 0
    assert trainer.step == 0


def test_a_qwen3_30b_a3b_shape_validates_and_plans_without_allocating():
    """Qwen3-30B-A3B's shape (48 layers, 128 experts, 8 a token) builds as shapes only and plans per device on
    fsdp = 8, for LoRA (rank 16 on the attention projections: 48 x 16 x ((2048 + 4096) * 2 + (2048 + 512) * 2) =
    13,369,344 adapter weights) and QLoRA, without an array of its size ever existing.
    LoRA weights: 30,532,122,624 parameters x 4 bytes / 8 = 15,266,061,312 per device.
    QLoRA weights: (30,518,753,280 frozen x 0.5625 + 13,369,344 x 4) / 8 = 2,152,534,512 per device."""
    import jax

    from tempax.models.weights import abstract_model

    cfg = PRESETS["qwen3-30b-a3b"]
    before = sum(a.nbytes for a in jax.live_arrays())
    model = abstract_model(cfg)
    assert all(isinstance(v, jax.ShapeDtypeStruct) for v in jax.tree.leaves(model))
    assert model.layers.mlp.experts.gate_proj.shape == (48, 128, 2048, 768)
    adapters = mem.lora_param_estimate(cfg, rank=16)
    assert adapters == 13_369_344
    plans = {}
    for name, frozen_bytes in (("lora", None), ("qlora", 0.5625)):
        inputs = mem.PlanInputs(model=cfg, micro_batch_size=8, seq_len=1024, trainable_params=adapters,
                                precision="bf16", remat="full", frozen_bytes_per_param=frozen_bytes,
                                mesh_shape=(("fsdp", 8),))
        plans[name] = mem.plan_memory(inputs, capacity=16 * mem.GiB)
    assert plans["lora"].weights == 15_266_061_312 and not plans["lora"].fits
    assert plans["qlora"].weights == 2_152_534_512 and plans["qlora"].total < plans["lora"].total
    assert sum(a.nbytes for a in jax.live_arrays()) - before < 2**20
