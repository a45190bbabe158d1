"""The memory plan: hand-worked byte counts, the residuals it traces, its total against XLA's own figure for the
compiled step, the `train.memory` choice, and the fixes it names when a step cannot fit."""

from __future__ import annotations

import dataclasses

import pytest

from tempax.models.config import ModelConfig
from tempax.models.presets import PRESETS
from tempax.train import memory as mem

SMALL = ModelConfig(vocab_size=100, hidden_size=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4,
                    intermediate_size=16)


def plan(**kw) -> mem.MemoryPlan:
    capacity = kw.pop("capacity", None)
    return mem.plan_memory(mem.PlanInputs(**{"model": SMALL, "micro_batch_size": 2, "seq_len": 4, **kw}), capacity)


def test_weights_gradients_and_optimizer_by_hand():
    """P = 2 layers x (attention 8*8 + 2*8*4 + 8*8 = 192, MLP 3*8*16 = 384, norms 16) + embedding 800 + final norm 8
    = 1992; the largest array is the embedding, 100 x 8 = 800 (a stacked MLP kernel is 2 x 8 x 16 = 256).
    On an accelerator (host memory separate from the device's):
      device:       weights 1992*4 = 7968, gradients 7968, optimizer (2 float32 moments) 15936; under bf16 also the
        bf16 copy XLA casts the weights to, 1992*2 = 3984
      bf16_moments: optimizer 1992 * 2 * 2 = 7968, plus the embedding's moments in float32 while its update
        computes them, 800 * 8 = 6400: 14368
      offload_optimizer: on the device the moments of the largest piece twice (one piece's going back while the
        next one's come in); the embedding, 800 elements, streams whole: 2 * 800*8 = 12800; in host memory 15936
      offload_optimizer_and_master, bf16: no master on the device (it streams through in pieces); its bf16 copy
        1992*2 = 3984, bf16 gradients 3984; streaming 2 * 800 * (8 + 4) = 19200; in host memory 15936 + 7968 =
        23904
      and 4 micro-batches add a float32 gradient accumulator, 7968.
    On XLA:CPU the host is the device: the state in host memory counts on it once (15936 + 800 * 12 = 25536),
    and no bf16 copy of a float32 master is counted."""
    assert SMALL.num_params() == 1992 and mem.largest_param(SMALL) == 800 == mem.largest_piece(SMALL)
    device = plan()
    assert (device.weights, device.compute_copy, device.gradients, device.optimizer, device.host) == (
        7968, 0, 7968, 15936, 0)
    assert plan(precision="bf16").compute_copy == 3984
    assert plan(precision="bf16", host_is_separate=False).compute_copy == 0
    assert plan(memory="bf16_moments").optimizer == 7968 + 6400
    offloaded = plan(memory="offload_optimizer")
    assert (offloaded.weights, offloaded.optimizer, offloaded.host) == (7968, 12800, 15936)
    both = plan(memory="offload_optimizer_and_master", precision="bf16")
    assert (both.weights, both.compute_copy, both.gradients, both.optimizer, both.host) == (
        0, 3984, 3984, 19200, 23904)
    assert plan(num_micro_batches=4).gradients == 7968 * 2
    on_cpu = plan(memory="offload_optimizer_and_master", precision="bf16", host_is_separate=False)
    assert (on_cpu.host, on_cpu.weights, on_cpu.compute_copy, on_cpu.optimizer) == (0, 7968, 3984, 9600 + 15936)
    assert on_cpu.total == both.total + 7968 - 19200 + 25536


def test_traced_residuals_by_hand():
    """Per token and layer, in float32 on the plain ops, at 4 tokens a row:
      remat full keeps the layer's input, D = 8 floats = 32 bytes, plus the layer's rotary inverse frequencies
        (head_dim / 2 = 2 floats = 8 bytes a layer, scanned with it) over the 4 tokens: 2; 34 in all;
      remat dots keeps every projection's output: q 8 + k 4 + v 4 + o 8 + gate 16 + up 16 + down 8 = 64 floats =
        256 bytes, plus the same 2: 258;
      bf16 halves the layer input: 16 + 2 = 18 (on XLA:CPU bf16 counts 4 bytes: 34 again)."""
    assert mem.decoder_residuals(SMALL, 4, "full", "fp32", "plain").per_layer == 34
    assert mem.decoder_residuals(SMALL, 4, "dots", "fp32", "plain").per_layer == 258
    assert mem.decoder_residuals(SMALL, 4, "full", "bf16", "plain").per_layer == 18
    assert mem.decoder_residuals(SMALL, 4, "full", "bf16", "cpu").per_layer == 34
    none = mem.decoder_residuals(SMALL, 4, "none", "fp32", "plain").per_layer
    assert none > 258  # every intermediate, the attention probabilities among them


def test_plan_parts_add_up():
    """activations = tokens x (L x per-layer + other) residual bytes; the backward pass's peak is the larger of the
    loss's (N_l V 8 + N D 16) and one layer's (N x WORKING_SET x that layer's residuals without remat)."""
    p = plan(remat="dots")
    kept = mem.decoder_residuals(SMALL, 4, "dots", "fp32")
    unkept = mem.decoder_residuals(SMALL, 4, "none", "fp32")
    assert p.activations == int(8 * (2 * kept.per_layer + kept.other))
    loss_peak = 8 * 100 * 8 + 8 * 8 * 16
    assert p.backward == int(max(loss_peak, 8 * mem.WORKING_SET["dots"] * unkept.per_layer))
    # A chunked loss holds logits for 3 positions of each of the 2 rows; a reward model's scalar head none.
    assert plan(loss_chunk_len=3).backward == int(max(6 * 100 * 8 + 8 * 8 * 16, 8 * 0.8 * unkept.per_layer))
    assert plan(loss_chunk_len=0).backward == int(max(8 * 8 * 16, 8 * 0.8 * unkept.per_layer))
    assert p.total == p.weights + p.gradients + p.optimizer + p.activations + p.backward


def test_lora_and_sharding_shrink_the_plan():
    """LoRA: only the adapters get gradients and Adam moments; FSDP over 4 devices splits weights by 4."""
    base = mem.PlanInputs(model=PRESETS["bench-small"], micro_batch_size=8, seq_len=256)
    full = mem.plan_memory(base)
    lora = mem.plan_memory(dataclasses.replace(base, trainable_params=1_000_000))
    assert lora.optimizer == 8_000_000 and lora.gradients == 4_000_000
    fsdp = mem.plan_memory(dataclasses.replace(base, mesh_shape=(("data", 1), ("fsdp", 4))))
    assert fsdp.weights == full.weights // 4
    assert fsdp.activations < full.activations


def test_auto_takes_the_fastest_setting_that_fits_and_says_why():
    """Between the plans of the settings, auto takes the first (fastest) under the capacity less headroom."""
    p = mem.PlanInputs(model=PRESETS["llama3.2-1b"], micro_batch_size=8, seq_len=1024, precision="bf16",
                       remat="full", loss_chunk_len=64, backend="tpu")
    totals = {s: mem.plan_memory(dataclasses.replace(p, memory=s)).total for s in mem.MEMORY_SETTINGS}
    assert totals["device"] > totals["bf16_moments"] > totals["offload_optimizer"] > totals[
        "offload_optimizer_and_master"]
    for setting in mem.MEMORY_SETTINGS:
        capacity = int(totals[setting] / (1 - mem.HEADROOM)) + 1
        choice = mem.choose_memory(p, capacity)
        assert choice.setting == setting and choice.plan.fits
        assert choice.reason.startswith(f"train.memory=auto chose {setting}")
    forced = mem.choose_memory(p, 16 * mem.GiB, requested="offload_optimizer")
    assert forced.setting == "offload_optimizer" and "as set" in forced.reason
    # On a CPU the host's memory is the device's: offloading saves nothing, so auto never takes it.
    on_cpu = dataclasses.replace(p, host_is_separate=False)
    assert mem.memory_settings(on_cpu) == ("device", "bf16_moments")
    tight = mem.choose_memory(on_cpu, int(totals["offload_optimizer"] / (1 - mem.HEADROOM)) + 1)
    assert tight.setting == "device" and "no setting fits" in tight.reason


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
    fits = mem.plan_memory(dataclasses.replace(p, micro_batch_size=best, num_micro_batches=64 // best), capacity)
    assert fits.fits
    bigger = [m for m in mem.micro_batch_candidates(64, 1) if m > best][-1]
    assert not mem.plan_memory(dataclasses.replace(p, micro_batch_size=bigger, num_micro_batches=64 // bigger),
                               capacity).fits


def test_a_full_fine_tune_of_the_1b_shape_fits_one_chip_with_its_state_offloaded():
    """The 1B shape, full fine-tuning with float32 moments at 8 x 1024 tokens: on a 15.75 GiB chip the state on
    the device does not fit, in bfloat16 neither; offloaded, it streams through in pieces of one layer (2^24
    elements), so the device holds no master and two pieces' state (compiled for a v5e: 14.7 GiB with the
    optimizer offloaded, 8.0 GiB with the master too: bench/memory_plan_v5e.py). These plan inputs (a plain
    decoder's residuals) put the optimizer-only setting just over the headroom, so auto takes the master too;
    at 7 GiB nothing fits and the fix named first is QLoRA."""
    p = mem.PlanInputs(model=PRESETS["llama3.2-1b"], micro_batch_size=8, seq_len=1024, precision="bf16",
                       remat="full", loss_chunk_len=64, backend="tpu")
    chip = int(15.75 * mem.GiB)
    plans = {s: mem.plan_memory(dataclasses.replace(p, memory=s), chip) for s in mem.MEMORY_SETTINGS}
    assert not plans["device"].fits and not plans["bf16_moments"].fits and plans["offload_optimizer_and_master"].fits
    both = plans["offload_optimizer_and_master"]
    assert both.weights == 0 and both.optimizer == 2 * 2**24 * 12
    assert plans["offload_optimizer"].optimizer == 2 * 2**24 * 8
    assert mem.choose_memory(p, chip).setting == "offload_optimizer_and_master"
    assert mem.suggest_fixes(p, 8, chip)[0] == "train.memory=offload_optimizer_and_master"
    assert mem.suggest_fixes(p, 8, 7 * mem.GiB)[0].startswith("QLoRA")
    fixes = mem.suggest_fixes(p, 8, 24 * mem.GiB)
    assert fixes and fixes[0].startswith("train.memory=")


def test_nothing_fits_says_so():
    p = mem.PlanInputs(model=PRESETS["llama3.1-8b"], micro_batch_size=1, seq_len=8192, remat="full")
    with pytest.raises(mem.OutOfMemoryPlan, match="mesh.fsdp|QLoRA"):
        mem.check_fits(p, batch_size=1, capacity=1 * mem.GiB)


def test_xla_out_of_memory_is_explained_with_the_plan_and_fixes_sized_by_xla():
    """XLA needed 1.5x what the plan said: the fixes are those whose plans fit a device 1.5x smaller."""
    p = mem.PlanInputs(model=PRESETS["bench-small"], micro_batch_size=16, seq_len=512)
    total = mem.plan_memory(p).total
    capacity = int(total * 1.2)
    message = (f"RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
               f"Used {total * 1.5 / 2**30:.2f}G of {capacity / 2**30:.2f}G hbm.")
    assert mem.xla_bytes_needed(message) == pytest.approx(total * 1.5, rel=0.01)
    error = mem.explain_out_of_memory(RuntimeError(message), p, 16, capacity)
    text = str(error)
    assert "Ran out of memory" in text and "memory plan per device" in text and "it would fit with" in text
    fix = mem.suggest_fixes(p, 16, int(capacity / 1.5))[0]
    assert fix in text


# ------------------------------------------------------------------------------------------------- the trainer


def test_trainer_plans_with_the_remat_setting_it_applies(tmp_path):
    """`train.remat` overrides the model's setting; the printed plan must describe that run, not the model's, and
    the trainer applies it (and bf16 compute) to its own view: the caller's model object keeps its config. The
    line before it says which train.memory setting the run takes and why."""
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
    assert any(line.startswith("train.memory=auto chose device") for line in said), said
    assert trainer.memory == "device"


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


def xla_total(analysis) -> int:
    return (analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes
            - analysis.alias_size_in_bytes)


@pytest.mark.parametrize("remat", ["none", "full"])
def test_plan_within_15_percent_of_xla_for_the_sft_step(tmp_path, remat):
    """A 6-layer, 384-wide model (8192 tokens of vocabulary) at 4 x 384 tokens, float32, SFT's loss on whole
    rows: big enough that activations are most of the step, small enough to compile in seconds. Built from a
    model of shapes only: the trainer plans and compiles without holding a weight."""
    from flax import nnx

    from tempax.algorithms.sft.main import make_sft_loss
    from tempax.models.decoder import Decoder
    from tempax.train.loop import Trainer
    from tests.train.helpers import random_batch, tiny_train_config

    cfg = ModelConfig(vocab_size=8192, hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2, head_dim=64,
                      intermediate_size=1536, max_position_embeddings=1024)
    model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    trainer = Trainer(model, make_sft_loss(), tiny_train_config(tmp_path, batch_size=4, seq_len=384, remat=remat))
    assert trainer.abstract
    planned = trainer.memory_plan().total
    compiled = xla_total(trainer.step_memory(random_batch(4, 384, vocab=8192, ragged=False)))
    assert planned == pytest.approx(compiled, rel=0.15), (planned / 2**20, compiled / 2**20)


def test_auto_offloads_only_what_host_memory_can_hold():
    """A setting whose state in host memory would not fit the host's free memory is passed over."""
    p = mem.PlanInputs(model=PRESETS["llama3.2-1b"], micro_batch_size=8, seq_len=1024, precision="bf16",
                       remat="full", loss_chunk_len=64, backend="tpu")
    offloaded = mem.plan_memory(dataclasses.replace(p, memory="offload_optimizer"))
    capacity = int(offloaded.total / (1 - mem.HEADROOM)) + 1
    assert mem.choose_memory(p, capacity, host_capacity=None).setting == "offload_optimizer"
    assert mem.choose_memory(p, capacity, host_capacity=offloaded.host // 2).setting == "device"


TINY_MOE_ADAPTERS = {
    # target_modules -> (projections, experts, router) at rank 4 on tiny-qwen3-moe: 3 layers, hidden 64, attention
    # q/o [64, 64] and k/v [64, 32], 6 experts with gate_up [64, 2 x 32] and down [32, 64], router [64, 6].
    ("q_proj", "k_proj", "v_proj", "o_proj"): (3 * 4 * ((64 + 64) * 2 + (64 + 32) * 2), 0, 0),  # 5,376
    ("experts",): (0, 3 * 6 * 4 * ((64 + 64) + (32 + 64)), 0),  # 16,128
    ("down_proj",): (0, 3 * 6 * 4 * (32 + 64), 0),  # 6,912: on a mixture of experts down_proj is the experts'
    ("gate",): (0, 0, 3 * 4 * (64 + 6)),  # 840
    # a regex over layer paths: layer 0's q_proj, but A and B are stacked for all 3 layers
    (r"layers\.0\.self_attn\.q_proj", "router"): (3 * 4 * (64 + 64), 0, 3 * 4 * (64 + 6)),
    None: (5376, 16128, 0),  # LoRA's default targets: attention, and gate/up/down_proj select the experts
}


@pytest.mark.parametrize("targets", list(TINY_MOE_ADAPTERS), ids=str)
def test_adapter_count_is_that_of_the_adapters_a_tiny_moe_model_gets(targets):
    """The plan's adapter parameters (P_t of a LoRA run) for tiny-qwen3-moe at rank 4 are the hand counts of
    TINY_MOE_ADAPTERS (A [in, r] + B [r, out] per layer; per expert on the routed experts, gate and up fused into
    one A [64, 4], B [4, 64]) and the sizes of the `nnx.LoRAParam`s `apply_lora` gives the real model."""
    import jax
    from flax import nnx

    from tempax.models.decoder import Decoder
    from tempax.models.lora import LoraConfig, apply_lora

    cfg = PRESETS["tiny-qwen3-moe"]
    counted = mem.adapter_params(cfg, 4, targets)
    assert (counted.projections, counted.experts, counted.router) == TINY_MOE_ADAPTERS[targets]
    lora = LoraConfig(rank=4) if targets is None else LoraConfig(rank=4, target_modules=targets)
    model = apply_lora(Decoder(cfg, rngs=nnx.Rngs(0)), lora, rngs=nnx.Rngs(1))
    assert counted.total == sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))


def test_lora_fixes_of_a_mixture_of_experts_full_fine_tune_by_memory():
    """A full fine-tune of Qwen3-30B-A3B (P = 30,532,122,624 float32 parameters) at micro-batch 1 x 1024 tokens,
    remat full. Rank-16 adapters: attention 48 x 16 x ((2048 + 4096) x 2 + (2048 + 512) x 2) = 13,369,344; routed
    experts 48 x 128 x 16 x ((2048 + 2 x 768) + (768 + 2048)) = 629,145,600. Each option's weights are the whole
    base plus the float32 adapters, gradients 4 and AdamW's moments 8 bytes an adapter parameter:
      LoRA on attention and experts   (P + 642,514,944) x 4        = 124,698,550,272 bytes, total ~124.9 GiB
      LoRA on attention only          (P + 13,369,344) x 4         = 122,181,967,872 bytes, total ~115.5 GiB
      QLoRA on attention and experts  P x 0.5625 + 642,514,944 x 4                          total ~27.2 GiB
      QLoRA on attention only         P x 0.5625 + 13,369,344 x 4                           total ~17.8 GiB
    So 135 GiB (95%: 128.25) names LoRA on the experts, 125 GiB attention-only LoRA, 30 GiB QLoRA with expert
    adapters, 20 GiB QLoRA on attention only, 17 GiB nothing."""
    moe = PRESETS["qwen3-30b-a3b"]
    total = moe.num_params()
    assert total == 30_532_122_624
    p = mem.PlanInputs(model=moe, micro_batch_size=1, seq_len=1024, remat="full")
    attention = mem.adapter_params(moe, 16, mem.ATTENTION_TARGETS)
    default = mem.adapter_params(moe, 16)
    assert (attention.projections, attention.experts, attention.router) == (13_369_344, 0, 0)
    assert (default.projections, default.experts, default.router) == (13_369_344, 629_145_600, 0)
    for adapters, base, weights in ((default.total, None, (total + 642_514_944) * 4),
                                    (attention.total, None, (total + 13_369_344) * 4),
                                    (default.total, 0.5625, total * 0.5625 + 642_514_944 * 4),
                                    (attention.total, 0.5625, total * 0.5625 + 13_369_344 * 4)):
        plan = mem.plan_memory(mem.with_adapters(p, adapters, base_bytes_per_param=base))
        assert plan.weights == pytest.approx(weights, abs=16)
        assert plan.gradients == adapters * 4 and plan.optimizer == adapters * 8

    def fixes(capacity_gib):
        return [f for f in mem.suggest_fixes(p, 8, capacity_gib * mem.GiB) if "LoRA" in f]

    assert fixes(135)[0].startswith("LoRA (add a `lora:` section, e.g. lora.rank=16; on the attention projections "
                                    "and the routed experts, 642.5M adapter parameters: 13.4M on projections, "
                                    "629.1M on the routed experts)")
    assert fixes(125)[0].startswith("LoRA (add a `lora:` section, e.g. lora.rank=16, lora.target_modules=[q_proj, "
                                    "k_proj, v_proj, o_proj]; on the attention projections only, 13.4M adapter "
                                    "parameters)")
    assert fixes(30) == ["QLoRA (lora.quantize_base=nf4; on the attention projections and the routed experts, "
                         "642.5M adapter parameters: 13.4M on projections, 629.1M on the routed experts) with "
                         "train.remat=full"]
    assert fixes(20) == ["QLoRA (lora.quantize_base=nf4, lora.target_modules=[q_proj, k_proj, v_proj, o_proj]; on "
                         "the attention projections only, 13.4M adapter parameters) with train.remat=full"]
    assert fixes(17) == []


def test_a_lora_run_on_a_mixture_of_experts_that_does_not_fit_is_told_qlora_or_attention_only():
    """The Qwen3-30B-A3B LoRA runs of the test above (micro-batch 1 x 1024, remat full): with float32 LoRA on
    attention and experts (~124.9 GiB) 30 GiB names QLoRA with the same adapters (~27.2 GiB) and 20 GiB QLoRA on
    attention only (~17.8 GiB); a QLoRA run on attention and experts at 24 GiB (95%: 22.8) is told attention only
    (its own 4-bit base, ~17.8 GiB); at 17 GiB nothing adapter-wise fits."""
    moe = PRESETS["qwen3-30b-a3b"]
    p = mem.PlanInputs(model=moe, micro_batch_size=1, seq_len=1024, remat="full")
    default = mem.adapter_params(moe, 16)
    lora_run = mem.with_adapters(p, default.total)
    qlora_run = mem.with_adapters(p, default.total, base_bytes_per_param=mem.NF4_BYTES_PER_PARAM)

    def fixes(run, capacity_gib):
        return [f for f in mem.suggest_fixes(run, 8, capacity_gib * mem.GiB) if "lora." in f]

    attention = "lora.target_modules=[q_proj, k_proj, v_proj, o_proj]"
    what = "on the attention projections only, 13.4M adapter parameters at rank 16"
    assert fixes(lora_run, 30) == ["lora.quantize_base=nf4 (QLoRA: the frozen base in 4 bits, the same adapters) "
                                   "with train.remat=full"]
    assert fixes(lora_run, 20) == [f"lora.quantize_base=nf4 with {attention} (QLoRA {what}) with train.remat=full"]
    assert fixes(qlora_run, 24) == [f"{attention} ({what}) with train.remat=full"]
    assert fixes(qlora_run, 17) == fixes(lora_run, 17) == []


# The architecture keys of Gemma 4 26B-A4B's text config: 30 layers in blocks of five sliding and one full, the
# full layers with heads of their own (512 wide, 2 key/value heads whose keys are their values), a dense GeGLU MLP
# and a sparse block of 128 experts (top 8) beside it in every layer.
GEMMA4_26B_A4B = {
    "model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"], "hidden_size": 2816,
    "intermediate_size": 2112, "num_hidden_layers": 30, "num_attention_heads": 16, "num_key_value_heads": 8,
    "num_global_key_value_heads": 2, "head_dim": 256, "global_head_dim": 512, "attention_k_eq_v": True,
    "enable_moe_block": True, "num_experts": 128, "top_k_experts": 8, "moe_intermediate_size": 704,
    "sliding_window": 1024, "vocab_size": 262144, "tie_word_embeddings": True, "final_logit_softcapping": 30.0,
    "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0, "max_position_embeddings": 262144,
    "layer_types": ["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(30)],
    "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1e6, "rope_type": "proportional"},
                        "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}},
}


@pytest.mark.heavy
def test_gemma4_26b_a4b_counts_its_parameters_keeps_no_weight_copies_and_plans_qlora_by_memory():
    """Per layer: norms 7 x 2816 = 19,712 and the layer scalar 1; dense MLP 3 x 2816 x 2112 = 17,842,176; router
    2816 x 128 + 2816 + 128 = 363,392; one expert 3 x 2816 x 704 = 5,947,392. Sliding attention (25 layers):
    2816 x (4096 + 2048 + 2048) + 4096 x 2816 + 2 x 256 = 34,603,520; full (5 layers): 2816 x (8192 + 1024 + 1024)
    + 8192 x 2816 + 2 x 512 = 51,905,536 (tempax holds a value projection in the layers whose keys are their
    values; the checkpoint has none: 5 x 2,883,584 = 14,417,920 fewer there). Embedding 262,144 x 2816 (tied) and
    the final norm 2816. Total 25 x 34,603,520 + 5 x 51,905,536 + 30 x (17,842,176 + 363,392 + 128 x 5,947,392 +
    19,713) + 738,200,320 = 25,247,559,710 (the checkpoint's 25,233,141,790: the model card's "25.2B"); active,
    8 experts: 3,836,948,510 (3,822,530,590: "3.8B").
    Under remat full the backward pass keeps each layer's float32 input [T, D], 2816 x 4 bytes a token, and none of
    the layers' weights (the scan over the blocks reads them as the stacks' own buffers).
    Rank-16 adapters: attention 25 x 16 x (6912 + 4864 x 2 + 6912) + 5 x 16 x (11,008 + 3840 x 2 + 11,008) =
    11,796,480; the dense MLP 30 x 16 x 3 x 4928 = 7,096,320; the experts 30 x 128 x 16 x ((2816 + 1408) + (704 +
    2816)) = 475,791,360. At micro-batch 1 x 1024 the plan names QLoRA on attention and experts for 40 GiB and
    QLoRA on attention only for 24 GiB; at 20 GiB nothing adapter-wise fits."""
    cfg = ModelConfig.from_hf_config(GEMMA4_26B_A4B)
    assert cfg.num_params() == 25_247_559_710 and cfg.num_params(active=True) == 3_836_948_510
    kept = mem.decoder_residuals(cfg, 1024, "full", "fp32")
    assert kept.per_layer == pytest.approx(2816 * 4, rel=1e-3)  # and under a byte of the router's small values
    attention = mem.adapter_params(cfg, 16, mem.ATTENTION_TARGETS)
    default = mem.adapter_params(cfg, 16)
    assert (attention.projections, attention.experts, default.projections, default.experts) == (
        11_796_480, 0, 11_796_480 + 7_096_320, 475_791_360)
    p = mem.PlanInputs(model=cfg, micro_batch_size=1, seq_len=1024, remat="full")

    def fixes(capacity_gib):
        return [f for f in mem.suggest_fixes(p, 8, capacity_gib * mem.GiB) if "LoRA" in f]

    assert fixes(40) == ["QLoRA (lora.quantize_base=nf4; on the attention projections and the routed experts, "
                         "494.7M adapter parameters: 18.9M on projections, 475.8M on the routed experts) with "
                         "train.remat=full"]
    assert fixes(24) == ["QLoRA (lora.quantize_base=nf4, lora.target_modules=[q_proj, k_proj, v_proj, o_proj]; on "
                         "the attention projections only, 11.8M adapter parameters) with train.remat=full"]
    assert fixes(20) == []
