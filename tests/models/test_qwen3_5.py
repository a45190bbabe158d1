"""Qwen3.5 (dense and MoE): Gated DeltaNet layers among gated softmax-attention ones, read from transformers'
files, trained and decoded exactly as transformers computes them. Logits, packing, caches, greedy generation and
export are checked with every family (tests/models/test_parity.py, tests/generate/test_parity.py,
tests/models/test_roundtrip.py); this file checks what only Qwen3.5 has."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tempax.errors import CheckpointError, ConfigError
from tempax.models.config import LinearAttentionConfig, ModelConfig
from tempax.models.decoder import Decoder
from tempax.models.hf_io import load_hf_checkpoint
from tests.kit.models import as_multimodal_checkpoint, hf_reference_pair, random_ids, tiny_config


def _hf_text_config(**kw):
    base = dict(model_type="qwen3_5_text", vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=8,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=4,
                linear_num_value_heads=8, linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                rms_norm_eps=1e-6, tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                 "mrope_section": [11, 11, 10], "mrope_interleaved": True})
    base.update(kw)
    return base


def test_the_published_multimodal_config_gives_the_text_model():
    """Qwen3.5's checkpoints are the multimodal model's: the text model's keys sit in text_config, and its layer
    pattern comes from full_attention_interval when layer_types is absent (three linear layers, then one full)."""
    text = _hf_text_config()
    text.pop("model_type")
    cfg = ModelConfig.from_hf_config({"model_type": "qwen3_5", "text_config": {**text, "full_attention_interval": 4},
                                      "vision_config": {"depth": 2}})
    assert cfg.family == "qwen3_5"
    assert cfg.linear_attention_layers == (0, 1, 2, 4, 5, 6) and cfg.attention_layers == (3, 7)
    assert cfg.layer_block() == (True, True, True, False)
    assert cfg.partial_rotary_factor == 0.25 and cfg.rotary_dim == 4 and cfg.attn_output_gate and cfg.norm_offset
    assert cfg.linear_attention == LinearAttentionConfig(num_key_heads=4, num_value_heads=8, key_head_dim=8,
                                                         value_head_dim=8, conv_kernel=4)
    assert cfg == tiny_config("qwen3_5").replace(max_position_embeddings=32768)


@pytest.mark.heavy
def test_a_multimodal_checkpoint_loads_its_language_model_and_skips_the_rest(tmp_path):
    """The published files name the text model's tensors model.language_model.* beside the vision tower's and the
    multi-token-prediction head's: the text model loads, with the logits of the text-only file."""
    ref, model = hf_reference_pair("qwen3_5")
    ref.save_pretrained(tmp_path / "text")
    as_multimodal_checkpoint(tmp_path / "text", tmp_path / "mm", "qwen3_5", "Qwen3_5ForConditionalGeneration",
                             {"model.visual.blocks.0.attn.qkv.weight": np.zeros((3, 3), np.float32),
                              "mtp.fc.weight": np.zeros((4, 4), np.float32)})
    loaded = load_hf_checkpoint(str(tmp_path / "mm"), progress=False)
    ids = jnp.asarray(random_ids((1, 9)))
    np.testing.assert_array_equal(np.asarray(loaded(ids)[0]), np.asarray(model(ids)[0]))


def test_bad_layer_patterns_are_refused_with_the_setting_named():
    with pytest.raises(CheckpointError, match="layer_types .*'sliding_attention'"):
        ModelConfig.from_hf_config(_hf_text_config(layer_types=["linear_attention"] * 7 + ["sliding_attention"]))
    with pytest.raises(ConfigError, match="every layer is a linear-attention layer"):
        tiny_config("qwen3_5").replace(linear_attention_layers=tuple(range(8)))
    with pytest.raises(ConfigError, match="linear_attention_layers are set but linear_attention is not"):
        tiny_config("llama").replace(linear_attention_layers=(0,))
    with pytest.raises(CheckpointError, match="llama config.json cannot express linear_attention_layers"):
        tiny_config("qwen3_5").replace(family="llama").to_hf_config()


@pytest.mark.heavy
@pytest.mark.needs_torch
def test_loss_and_gradients_equal_transformers_on_a_packed_free_batch():
    """The mean next-token cross-entropy of a [2, 70] batch (the linear layers' chunks of 64 and the remainder)
    and its gradient with respect to every linear-attention and attention weight equal transformers' backward
    (float32, relative to each gradient's largest entry, <= 1e-4)."""
    import torch

    ref, model = hf_reference_pair("qwen3_5")
    ids = random_ids((2, 70), seed=3)

    def loss_fn(model):
        logits, _ = model(jnp.asarray(ids[:, :-1]))
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, jnp.asarray(ids[:, 1:])[..., None], axis=-1))

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    ref.zero_grad()
    out = ref(torch.tensor(ids[:, :-1], dtype=torch.long))
    ref_loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 128), torch.tensor(ids[:, 1:], dtype=torch.long).reshape(-1))
    ref_loss.backward()
    assert abs(float(loss) - ref_loss.item()) < 1e-5
    layer, linear_layer = model.config.attention_layers[0], model.config.linear_attention_layers[1]
    stack_index = model.config.linear_attention_layers.index(linear_layer)
    checks = {
        f"model.layers.{linear_layer}.linear_attn.in_proj_qkv.weight":
            grads.linear_layers.linear_attn.in_proj_qkv.kernel[...][stack_index].T,
        f"model.layers.{linear_layer}.linear_attn.A_log": grads.linear_layers.linear_attn.A_log[...][stack_index],
        f"model.layers.{linear_layer}.linear_attn.dt_bias": grads.linear_layers.linear_attn.dt_bias[...][stack_index],
        f"model.layers.{linear_layer}.linear_attn.conv1d.weight":
            grads.linear_layers.linear_attn.conv1d.weight[...][stack_index][:, None, :],
        f"model.layers.{linear_layer}.linear_attn.norm.weight": grads.linear_layers.linear_attn.norm.weight[...][stack_index],
        f"model.layers.{layer}.self_attn.q_proj.weight": grads.layers.self_attn.q_proj.kernel[...][0].T,
    }
    named = dict(ref.named_parameters())
    for name, got in checks.items():
        want = named[name].grad.numpy()
        scale = np.abs(want).max()
        np.testing.assert_allclose(np.asarray(got) / scale, want / scale, atol=1e-4, err_msg=name)


def test_the_program_holds_one_block_of_layers_whatever_the_depth():
    """The stack runs as a scan over repetitions of its block (three linear layers and one attention layer): the
    program of a forward pass of 16 layers has the size of 8 layers' (within a few lines) and the same triangular
    inverses (the linear layers', `unit_lower_inverse`) and maxima (softmaxes)."""
    def counts(num_layers):
        cfg = tiny_config("qwen3_5").replace(num_layers=num_layers, linear_attention_layers=tuple(
            i for i in range(num_layers) if (i + 1) % 4))
        model = Decoder(cfg, rngs=nnx.Rngs(0))
        graphdef, state = nnx.split(model)
        text = str(jax.make_jaxpr(lambda s: nnx.merge(graphdef, s)(jnp.zeros((1, 8), jnp.int32))[0])(state))
        return text.count("name=unit_lower_inverse"), text.count("reduce_max"), len(text.splitlines())

    eight, sixteen = counts(8), counts(16)
    assert eight[:2] == sixteen[:2] and eight[0] > 0
    assert abs(sixteen[2] - eight[2]) <= 4  # the same program but for the layer-index constants' widths


@pytest.mark.heavy
def test_a_hybrid_stack_of_one_repeating_block_is_found_and_an_irregular_one_is_one_block():
    cfg = tiny_config("qwen3_5")
    assert cfg.layer_block() == (True, True, True, False)
    irregular = cfg.replace(linear_attention_layers=(0, 1, 2, 4, 5))
    assert irregular.layer_block() == (True, True, True, False, True, True, False, False)
    model = Decoder(irregular, rngs=nnx.Rngs(0))
    logits, _ = model(jnp.asarray(random_ids((1, 5))))
    assert logits.shape == (1, 5, 128) and np.isfinite(np.asarray(logits)).all()


QWEN3_5_ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
                      "out_proj", "gate_proj", "up_proj", "down_proj")


@pytest.mark.heavy
@pytest.mark.needs_torch
def test_lora_on_both_kinds_of_layers_loads_in_peft_and_merges(tmp_path):
    """LoRA on every projection of both layer kinds (the linear layers' in_proj_* / out_proj, the attention layers'
    q/k/v/o, every MLP) and on the linear layers 1 and 5 only: PeftModel.from_pretrained of the saved adapters gives
    the tempax logits within 1e-4 (the adapters moving them by far more), the folder loads back exactly, and the
    merged export loads in transformers with the same logits."""
    import peft
    import torch
    import transformers

    from tempax.models.hf_io import save_hf_checkpoint
    from tempax.models.lora import LoraConfig, apply_lora, load_adapters, lora_layers, merge_lora, save_adapters

    base = Decoder(tiny_config("qwen3_5"), rngs=nnx.Rngs(0))
    save_hf_checkpoint(base, str(tmp_path / "base"))
    ids = random_ids((2, 11), seed=5)

    def torch_logits(model):
        with torch.no_grad():
            return model(torch.tensor(ids, dtype=torch.long)).logits.numpy()

    plain = torch_logits(transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base")).eval())
    for i, targets in enumerate((QWEN3_5_ALL_LINEAR, (r"layers\.[15]\.linear_attn\.in_proj_qkv", "o_proj"))):
        lora = apply_lora(base, LoraConfig(rank=2, alpha=4.0, target_modules=targets), rngs=nnx.Rngs(1))
        for k, (_, layer) in enumerate(lora_layers(lora)):
            layer.lora_b.set_value(jax.random.normal(jax.random.key(k), layer.lora_b.shape) * 0.2)
        expected = np.asarray(lora(jnp.asarray(ids))[0])
        folder = str(tmp_path / f"adapter{i}")
        save_adapters(lora, folder, base_model_name_or_path=str(tmp_path / "base"))
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base")).eval()
        got = torch_logits(peft.PeftModel.from_pretrained(ref, folder).eval())
        assert np.max(np.abs(got - plain)) > 0.05
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
        np.testing.assert_array_equal(np.asarray(load_adapters(base, folder)(jnp.asarray(ids))[0]), expected)
    save_hf_checkpoint(merge_lora(lora), str(tmp_path / "merged"))
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    np.testing.assert_allclose(torch_logits(merged), expected, atol=1e-4, rtol=0)


@pytest.mark.heavy
def test_a_training_step_on_8_devices_matches_one_device(tmp_path):
    """One SFT step (SGD, lr 1) of a 4-layer Qwen3.5 on 8 fake CPU devices (data 2 x fsdp 2 x tensor 2), the linear
    layers' projections and convolution split over the tensor axis like attention heads, equals the one-device
    step: the loss and every updated weight; and LoRA on both layer kinds trains its adapters."""
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    from tempax.algorithms.sft.main import make_sft_loss
    from tempax.models.lora import LoraConfig, apply_lora, lora_filter
    from tempax.train.config import OptimizerConfig
    from tempax.train.loop import Trainer
    from tests.train.helpers import host, one_and_eight_device_sgd_steps, random_batch, tiny_train_config

    cfg = tiny_config("qwen3_5").replace(num_layers=4, linear_attention_layers=(0, 1, 2))
    (one_m, one_p, _), (eight_m, eight_p, _) = one_and_eight_device_sgd_steps(cfg, tmp_path)
    np.testing.assert_allclose(eight_m["loss"], one_m["loss"], rtol=1e-5)
    assert "linear_layers.linear_attn.A_log" in one_p and "linear_layers.linear_attn.conv1d.weight" in one_p
    for key in one_p:
        np.testing.assert_allclose(eight_p[key], one_p[key], atol=2e-5, err_msg=key)
    model = apply_lora(Decoder(cfg, rngs=nnx.Rngs(0)), LoraConfig(rank=2, target_modules=("in_proj_qkv", "q_proj")),
                       rngs=nnx.Rngs(1))
    sgd = OptimizerConfig(name="sgd", learning_rate=1.0, schedule="constant", weight_decay=0.0, grad_clip_norm=None)
    trainer = Trainer(model, make_sft_loss(), tiny_train_config(tmp_path, optimizer=sgd), trainable=lora_filter)
    before = host(trainer.state.params)
    trainer.train_step(random_batch(8, 16, seed=2))
    after = host(trainer.state.params)
    assert set(after) == {"linear_layers.linear_attn.in_proj_qkv.lora_a", "linear_layers.linear_attn.in_proj_qkv.lora_b",
                          "layers.self_attn.q_proj.lora_a", "layers.self_attn.q_proj.lora_b"}
    assert not np.allclose(after["linear_layers.linear_attn.in_proj_qkv.lora_b"],
                           before["linear_layers.linear_attn.in_proj_qkv.lora_b"])


@pytest.mark.heavy
def test_a_second_turn_and_a_request_joining_a_running_decode_continue_the_linear_state_exactly():
    """The linear layers' state is a row's whole past, so padding must leave it alone: rows that stopped early and
    were fed padding since, and a second turn's right-padded tokens, continue from their last real token. Turn 2
    of each row equals a fresh request on its whole conversation (static engine), and a greedy request joining the
    slot engine mid-way gives the tokens it gives alone."""
    from numpy.testing import assert_array_equal

    from tempax.generate import SamplingConfig, generate
    from tempax.generate.continuous import SlotEngine
    from tempax.generate.engine import DecodeRun

    model = Decoder(tiny_config("qwen3_5"), rngs=nnx.Rngs(3))
    prompts = [[t + 3 for t in random_ids((n,), vocab=120, seed=n).tolist()] for n in (5, 9, 3)]
    greedy = SamplingConfig(max_new_tokens=6, temperature=0.0, ignore_eos=True)
    probe = DecodeRun(model, prompts, greedy, stop_ids=(), pad_id=0)
    probe.advance()
    stop = int(probe.tokens()[0][0, 2])  # row 0 stops at its third token, the others where it appears
    run = DecodeRun(model, prompts, greedy, stop_ids=(stop,), pad_id=0, reserve=32)
    run.advance()
    first, first_lengths = run.tokens()
    new = [[11, 12, 13], [14], None]
    run.continue_with(new)
    run.advance()
    second = run.output()
    for r in (0, 1):
        fresh = DecodeRun(model, [prompts[r] + first[r, : first_lengths[r]].tolist() + new[r]], greedy,
                          stop_ids=(stop,), pad_id=0)
        fresh.advance()
        want = fresh.output()
        n = int(want.lengths[0])
        assert second.lengths[r] == n
        assert_array_equal(second.tokens[r, :n], want.tokens[0, :n])

    engine = SlotEngine(model, slots=3, context=60, stop_ids=(), pad_id=0, min_cache=32)
    request = (prompts[1], SamplingConfig(temperature=0.0, max_new_tokens=12, ignore_eos=True))
    engine.join(prompts[0], [SamplingConfig(temperature=0.0, max_new_tokens=20, ignore_eos=True)], ["first"])
    engine.advance(5)
    slot = engine.join(request[0], [request[1]], ["joined"])[0]
    engine.advance(30)
    tokens, lengths, done = engine.snapshot()
    alone = generate(model, None, [request[0]], request[1])
    assert done[slot] and tokens[slot, : lengths[slot]].tolist() == alone.token_ids[0, : alone.lengths[0]].tolist()
