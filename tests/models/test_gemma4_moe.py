"""Gemma 4's mixture-of-experts block (`enable_moe_block`, the 26B-A4B's): the sparse block beside the dense MLP,
its router reading the residual stream through a norm without a weight, a learned scale and D^-0.5, its top-k
renormalised and scaled per expert. Checked against transformers in float32 on tiny configs (a sliding and a full
layer, the full ones of their own shape; a KV-shared layer whose dense MLP is twice as wide): logits, greedy tokens,
the tensors read and written, export that transformers loads, the multimodal files' names; the block's program
(grouped products, no loop over experts); LoRA on the dense MLP, the experts and the router, through PEFT; QLoRA's
quantized experts; the parameter counts."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tempax import ops
from tempax.errors import CheckpointError, ConfigError
from tempax.models.config import ModelConfig, MoeConfig
from tempax.models.decoder import Decoder
from tempax.models.hf_io import load_hf_checkpoint, save_hf_checkpoint
from tempax.models.moe import (QuantizedRoutedExperts, SparseMoeBlock, load_balancing_loss,
                               recording_router_statistics, route)
from tempax.models.weights import iter_hf_tensors
from tests.kit.models import as_multimodal_checkpoint, product_counts, random_ids

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.needs_torch

TOL = 1e-4
MOE = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=8)


def _text_config(**kw):
    """Two layers, a sliding and a full one, the full one of head width 32 with one key/value head that is its
    values too (attention_k_eq_v), per-layer inputs, four experts of width 8 with two per token."""
    base = dict(model_type="gemma4_text", vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=32,
                num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=4,
                layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=8,
                vocab_size_per_layer_input=128, final_logit_softcapping=30.0, max_position_embeddings=256, **MOE)
    base.update(kw)
    return base


CASES = {
    "two-stacks": {},
    # SwiGLU, one attention shape, no per-layer inputs; the last layer reuses layer 1's keys and values and its dense
    # MLP beside the experts is twice as wide (a stack of its own)
    "silu-wide-shared": dict(hidden_activation="silu", num_hidden_layers=3, global_head_dim=16,
                             num_global_key_value_heads=None, attention_k_eq_v=False, hidden_size_per_layer_input=0,
                             layer_types=["sliding_attention", "full_attention", "full_attention"],
                             num_kv_shared_layers=1, use_double_wide_mlp=True),
}


@functools.lru_cache(maxsize=None)
def _hf_folder(case: str) -> str:
    """A transformers Gemma 4 MoE model of CASES[case], every weight (the router's scales, the per-expert scales
    and the norms included) and layer scalar moved off its init, saved to a temporary folder."""
    import tempfile

    hf_cfg = transformers.AutoConfig.for_model(**_text_config(**CASES[case]))
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        for layer in ref.model.layers:
            layer.router.per_expert_scale.add_(torch.rand_like(layer.router.per_expert_scale))
            layer.layer_scalar.copy_(0.5 + torch.rand_like(layer.layer_scalar))
    folder = tempfile.mkdtemp(prefix=f"tempax-gemma4-moe-{case}-")
    ref.save_pretrained(folder)
    return folder


def _reference(case: str):
    return transformers.AutoModelForCausalLM.from_pretrained(_hf_folder(case)).eval()


def _logits(ref, ids):
    with torch.no_grad():
        return ref(torch.tensor(ids, dtype=torch.long)).logits.numpy()


# --------------------------------------------------------------------------------------------------------------
# The config


def test_the_config_reads_the_sparse_block_and_writes_it_back():
    cfg = ModelConfig.from_hf_config(_text_config())
    assert cfg.moe == MoeConfig(num_experts=4, experts_per_token=2, expert_intermediate_size=8,
                                expert_activation="gelu_tanh", normalize_top_k=True, router_input_norm=True,
                                per_expert_scale=True, beside_dense_mlp=True)
    assert ModelConfig.from_hf_config(cfg.to_hf_config()) == cfg
    text = _text_config()
    text.pop("model_type")
    assert ModelConfig.from_hf_config({"model_type": "gemma4", "text_config": text}) == cfg
    silu = ModelConfig.from_hf_config(_text_config(hidden_activation="silu"))
    assert silu.moe.expert_activation == "silu"
    trained = cfg.replace(moe=dataclasses.replace(cfg.moe, train_aux_loss=True, router_aux_loss_coef=0.01))
    assert ModelConfig.from_hf_config(trained.to_hf_config()) == trained


def test_what_gemma4_cannot_state_is_refused_by_name():
    with pytest.raises(CheckpointError, match="enable_moe_block=true without num_experts, top_k_experts"):
        ModelConfig.from_hf_config(_text_config(num_experts=None, top_k_experts=None))
    cfg = ModelConfig.from_hf_config(_text_config())
    for change in (dict(shared_expert_intermediate_size=8), dict(per_expert_scale=False),
                   dict(expert_activation="silu"), dict(router_bias=True)):
        with pytest.raises(CheckpointError, match="a gemma4 config.json cannot express moe=.*Gemma 4's sparse block"):
            cfg.replace(moe=dataclasses.replace(cfg.moe, **change)).to_hf_config()
    with pytest.raises(ConfigError, match="beside_dense_mlp .*needs post_norms=True"):
        cfg.replace(post_norms=False)


def test_parameter_counts_hold_the_router_scales_the_norms_and_the_dense_mlp():
    """tempax's count is what its model holds: transformers' parameters, the layer scalars (a buffer there) and
    the KV-shared layer's unread key/value projections and key norm; the active count leaves out the 2 unused
    experts' 3 * 32 * 8 weights per layer."""
    ref = _reference("silu-wide-shared")
    model = load_hf_checkpoint(_hf_folder("silu-wide-shared"), progress=False)
    cfg = model.config
    theirs = sum(p.numel() for p in ref.parameters())
    assert cfg.num_params() == theirs + cfg.num_layers + (2 * 32 * 16 + 16)
    assert cfg.num_params() == sum(int(np.prod(v.shape)) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert cfg.num_params() - cfg.num_params(active=True) == cfg.num_layers * 2 * 3 * 32 * 8
    # the block itself: router [D, E], its scale [D], per-expert scales [E], experts, dense MLP, three norms
    total, active = cfg.moe.block_params(32, 48)
    assert total == 32 * 4 + 32 + 4 + 4 * 3 * 32 * 8 + 3 * 32 * 48 + 3 * 32
    assert total - active == 2 * 3 * 32 * 8


# --------------------------------------------------------------------------------------------------------------
# Against transformers


@pytest.mark.parametrize("case", list(CASES))
def test_logits_tensors_and_export_match_transformers(case, tmp_path):
    """Loaded from transformers' files: logits within 1e-4; the tensors written back are transformers' own; the
    exported folder loads in transformers with the same logits."""
    ref = _reference(case)
    model = load_hf_checkpoint(_hf_folder(case), progress=False)
    ids = random_ids((2, 11))
    ours = np.asarray(model(jnp.asarray(ids))[0])
    np.testing.assert_allclose(ours, _logits(ref, ids), atol=TOL, rtol=0)
    written = dict(iter_hf_tensors(model))
    theirs = {k: v.numpy() for k, v in ref.state_dict().items() if k != "lm_head.weight"}
    assert set(written) == set(theirs)
    for name, value in theirs.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)
    save_hf_checkpoint(model, str(tmp_path / "out"))
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    assert back.config.enable_moe_block and back.config.num_experts == 4
    np.testing.assert_allclose(_logits(back, ids), ours, atol=TOL, rtol=0)


def test_greedy_tokens_equal_transformers_generate():
    from tempax.generate import SamplingConfig, generate

    ref = _reference("two-stacks")
    ref.generation_config.eos_token_id = None
    model = load_hf_checkpoint(_hf_folder("two-stacks"), progress=False)
    prompts = [random_ids((n,), seed=20 + n).tolist() for n in (4, 9)]
    result = generate(model, None, prompts, SamplingConfig(max_new_tokens=6, temperature=0.0, ignore_eos=True))
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            out = ref.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                               max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert result.token_ids[i].tolist() == out[0, len(prompt):].tolist(), f"prompt {i}"


def test_a_multimodal_checkpoint_loads_the_sparse_block_of_its_language_model(tmp_path):
    as_multimodal_checkpoint(_hf_folder("two-stacks"), tmp_path / "mm", "gemma4", "Gemma4ForConditionalGeneration",
                             {"model.embed_vision.embedding_projection.weight": np.zeros((4, 4), np.float32)})
    loaded = load_hf_checkpoint(str(tmp_path / "mm"), progress=False)
    ids = random_ids((1, 9))
    np.testing.assert_allclose(np.asarray(loaded(jnp.asarray(ids))[0]), _logits(_reference("two-stacks"), ids),
                               atol=TOL, rtol=0)


# --------------------------------------------------------------------------------------------------------------
# The block


def test_route_scales_each_kept_weight_by_its_expert():
    """softmax [0.1, 0.2, 0.3, 0.4]; top-2 experts 3, 2 renormalised 4/7, 3/7; per-expert scales [1, 1, 2, 0.5]
    give 2/7 and 6/7."""
    w, ids = route(jnp.log(jnp.array([[1.0, 2.0, 3.0, 4.0]])), experts_per_token=2,
                   expert_scale=jnp.array([1.0, 1.0, 2.0, 0.5]))
    assert ids.tolist() == [[3, 2]]
    np.testing.assert_allclose(np.asarray(w), [[2 / 7, 6 / 7]], rtol=1e-6)


def test_block_program_has_no_loop_over_experts():
    """The block beside its dense MLP, forward and training gradient (output + 0.01 * load-balancing loss), traced
    for 4 and for 64 experts: the same products in both, the experts as 3 grouped products forward (9 with the
    gradient), the dense MLP and the router as dense ones."""
    counts = []
    for num_experts in (4, 64):
        moe = MoeConfig(num_experts=num_experts, experts_per_token=2, expert_intermediate_size=8,
                        expert_activation="gelu_tanh", router_input_norm=True, per_expert_scale=True,
                        beside_dense_mlp=True)
        block = SparseMoeBlock(moe, 16, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0),
                               dense_intermediate_size=24, dense_activation="gelu_tanh")
        graphdef, state = nnx.split(block)
        h = jnp.asarray(np.sin(np.arange(2 * 5 * 16, dtype=np.float32)).reshape(2, 5, 16))

        def loss(state, h):
            y, logits = nnx.merge(graphdef, state)(h * 0.5, residual=h)
            return jnp.sum(y) + 0.01 * load_balancing_loss(logits[None], experts_per_token=2)[0]

        with ops.use_backend("plain"):  # ragged_dot's grouped products; the CPU's tiles: tests/ops/cpu
            counts.append((product_counts(jax.make_jaxpr(loss)(state, h)),
                           product_counts(jax.make_jaxpr(jax.grad(loss))(state, h))))
    assert counts[0] == counts[1]
    forward, backward = counts[0]
    assert forward["ragged_dot_general"] == 3 and backward["ragged_dot_general"] == 9
    assert forward["dot_general"] == 5  # router, dense gate/up/down, the loss's masked sum of probabilities


def test_the_routing_is_recorded_for_the_load_balancing_loss():
    """One call of the two-layer model inside `recording_router_statistics`: one record, both layers' tokens."""
    model = Decoder(ModelConfig.from_hf_config(_text_config()), rngs=nnx.Rngs(0))
    with recording_router_statistics() as recorded:
        model(jnp.asarray(random_ids((1, 5))))
    assert len(recorded) == 1 and float(recorded[0].statistics.tokens) == 2 * 5


# --------------------------------------------------------------------------------------------------------------
# LoRA and QLoRA


def _torch_logits(ref, ids):
    with torch.no_grad():
        return ref(torch.tensor(ids, dtype=torch.long)).logits.numpy()


def test_lora_on_the_dense_mlp_experts_and_router_loads_in_peft_and_merges(tmp_path):
    """LoRA's default targets adapt the attention, the dense MLP beside the experts and the routed experts;
    "router" adds the router. The adapters (B random) saved in PEFT's layout load in peft over transformers' model
    with tempax's logits, and the merged model exported loads in transformers with them too."""
    import peft

    from tempax.models.lora import LoraConfig, apply_lora, lora_experts, lora_layers, merge_lora, save_adapters

    base = load_hf_checkpoint(_hf_folder("two-stacks"), progress=False)
    lora = apply_lora(base, LoraConfig(rank=2, alpha=6.0, target_modules=("q_proj", "gate_proj", "up_proj",
                                                                          "down_proj", "router")),
                      rngs=nnx.Rngs(1))
    assert {p for p, _ in lora_layers(lora)} >= {(s, "mlp", n) for s in ("layers", "full_layers")
                                                  for n in ("gate_proj", "up_proj", "down_proj", "gate")}
    assert sorted(p for p, _ in lora_experts(lora)) == [("full_layers", "mlp", "experts"), ("layers", "mlp", "experts")]
    key = jax.random.key(5)
    for k, (_, layer) in enumerate(lora_layers(lora)):
        layer.lora_b.set_value(jax.random.normal(jax.random.fold_in(key, k), layer.lora_b.shape) * 0.2)
    for j, (_, experts) in enumerate(lora_experts(lora)):
        for k, name in enumerate(experts.adapted_params()):
            b = experts.factors(name)[1]
            b.set_value(jax.random.normal(jax.random.fold_in(key, 100 + 10 * j + k), b.shape) * 0.2)
    ids = random_ids((2, 9))
    expected = np.asarray(lora(jnp.asarray(ids))[0])
    assert np.abs(expected - np.asarray(base(jnp.asarray(ids))[0])).max() > 0.05
    save_adapters(lora, str(tmp_path / "adapter"), base_model_name_or_path=_hf_folder("two-stacks"))
    import json

    with open(tmp_path / "adapter" / "adapter_config.json") as f:
        config = json.load(f)
    assert sorted(config["target_parameters"]) == ["experts.down_proj", "experts.gate_up_proj", "router.proj.weight"]
    ref = peft.PeftModel.from_pretrained(_reference("two-stacks"), str(tmp_path / "adapter")).eval()
    np.testing.assert_allclose(_torch_logits(ref, ids), expected, atol=TOL, rtol=0)
    save_hf_checkpoint(merge_lora(lora), str(tmp_path / "merged"))
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    np.testing.assert_allclose(_torch_logits(merged, ids), expected, atol=TOL, rtol=0)


def test_qlora_quantizes_the_experts_and_the_dense_mlp_and_keeps_the_router_float():
    """QLoRA's base: the experts 4-bit (`QuantizedRoutedExperts`, differentiated through as tests/models/test_moe.py
    checks) and the dense MLP beside them too, the router float; the memory plan's adapter count of LoRA's default
    targets holds the experts' A_e, B_e (gate_up: D + 2I, down: I + D per expert and layer), of "router" the
    router's."""
    from tempax.models.lora import LoraConfig, apply_lora
    from tempax.models.quant import QuantizedLinear
    from tempax.train.memory import adapter_params

    cfg = ModelConfig.from_hf_config(_text_config())
    model = apply_lora(Decoder(cfg, rngs=nnx.Rngs(0)), LoraConfig(rank=2, target_modules=("q_proj",),
                                                                  quantize_base="nf4"), rngs=nnx.Rngs(1))
    block = model.layers.mlp
    assert isinstance(block.experts, QuantizedRoutedExperts) and isinstance(block.gate_proj, QuantizedLinear)
    assert isinstance(block.gate, nnx.Linear) and isinstance(model.full_layers.mlp.experts, QuantizedRoutedExperts)
    counted = adapter_params(cfg, 2)  # default targets: attention, the dense MLP, the experts
    assert counted.experts == 2 * 4 * 2 * ((32 + 16) + (8 + 32)) and counted.router == 0
    assert counted.projections > 0 and adapter_params(cfg, 2, ("router",)).router == 2 * 2 * (32 + 4)
