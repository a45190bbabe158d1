"""`tempax.models.moe`: the sparse MoE block against transformers' own blocks (float32, outputs and router logits
within 1e-5), the load-balancing loss against transformers' `load_balancing_loss_func` and against hand-worked
numbers, the Hugging Face tensor names in both directions against what `save_pretrained` writes, and a count of
the products in the block's program showing there is no loop over experts."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from numpy.testing import assert_allclose

from tempax import ops
from tempax.errors import CheckpointError, ConfigError
from tempax.models.config import ModelConfig, MoeConfig
from tempax.models.decoder import Decoder
from tempax.models.lora import LoraConfig, apply_lora, disable_adapters, lora_experts, lora_layers
from tempax.models.moe import (RouterStatistics, SparseMoeBlock, block_params, hf_layer_tensors,
                               hf_moe_tensor_to_path, hf_moe_tensors_to_params, load_balancing_loss,
                               load_block_params, moe_param_shapes, moe_params_to_hf_tensors, moe_path_to_hf,
                               record_router_statistics, recording_router_statistics, route, router_aux_loss,
                               router_statistics, with_router_aux_loss)
from tempax.models.presets import TINY_MOE_FAMILIES
from tests.kit.models import family_cases, hf_reference_pair, product_counts, random_ids, tiny_config, tiny_tempax_model

TOL = 1e-5
HIDDEN = 16


def _block(moe: MoeConfig, seed: int = 0, dtype=jnp.float32) -> SparseMoeBlock:
    return SparseMoeBlock(moe, HIDDEN, dtype=dtype, param_dtype=jnp.float32, rngs=nnx.Rngs(seed))


@nnx.jit
def _forward(block, x):
    return block(x)


def _tokens(shape=(2, 5, HIDDEN), scale: float = 1.0) -> np.ndarray:
    n = int(np.prod(shape))
    return (scale * np.sin(np.linspace(0.0, 23.0, n))).reshape(shape).astype(np.float32)


# --------------------------------------------------------------------------------------------------------------
# Routing and the auxiliary loss by hand


def test_route_by_hand():
    """logits ln([1, 2, 3, 4]): softmax [0.1, 0.2, 0.3, 0.4]; top-2 experts 3, 2 with 0.4, 0.3; renormalised
    4/7, 3/7. Sigmoid of logits [0, ln 3, -ln 3, ln 9]: [0.5, 0.75, 0.25, 0.9]; top-2 experts 3, 1 with 0.9, 0.75,
    times routed_scaling 2: 1.8, 1.5."""
    w, ids = route(jnp.log(jnp.array([[1.0, 2.0, 3.0, 4.0]])), experts_per_token=2, normalize=False)
    assert ids.tolist() == [[3, 2]]
    assert_allclose(np.asarray(w), [[0.4, 0.3]], rtol=1e-6)
    w, _ = route(jnp.log(jnp.array([[1.0, 2.0, 3.0, 4.0]])), experts_per_token=2, normalize=True)
    assert_allclose(np.asarray(w), [[4 / 7, 3 / 7]], rtol=1e-6)
    z = jnp.array([[0.0, np.log(3.0), -np.log(3.0), np.log(9.0)]])
    w, ids = route(z, experts_per_token=2, activation="sigmoid", normalize=False, scaling=2.0)
    assert ids.tolist() == [[3, 1]]
    assert_allclose(np.asarray(w), [[1.8, 1.5]], rtol=1e-6)


def test_load_balancing_loss_by_hand():
    """Two experts, top-1, one layer of two tokens.
    Balanced: logits [ln 3, 0] and [0, ln 3]: probabilities [0.75, 0.25], [0.25, 0.75]; f = [0.5, 0.5],
    P = [0.5, 0.5]; loss = 2 * (0.25 + 0.25) = 1.0, max load 0.5 / 0.5 = 1.
    Collapsed: both tokens [ln 3, 0]: f = [1, 0], P = [0.75, 0.25]; loss = 2 * 0.75 = 1.5, max load 2.
    Balanced with the second token masked: f = [1, 0], P = [0.75, 0.25] again: 1.5."""
    ln3 = float(np.log(3.0))
    balanced = jnp.array([[[ln3, 0.0], [0.0, ln3]]])  # [layers=1, tokens=2, experts=2]
    loss, metrics = load_balancing_loss(balanced, experts_per_token=1)
    assert_allclose(float(loss), 1.0, rtol=1e-6)
    assert_allclose(float(metrics["moe_max_load"]), 1.0, rtol=1e-6)
    collapsed = jnp.array([[[ln3, 0.0], [ln3, 0.0]]])
    loss, metrics = load_balancing_loss(collapsed, experts_per_token=1)
    assert_allclose(float(loss), 1.5, rtol=1e-6)
    assert_allclose(float(metrics["moe_max_load"]), 2.0, rtol=1e-6)
    loss, _ = load_balancing_loss(balanced, experts_per_token=1, mask=jnp.array([1, 0]))
    assert_allclose(float(loss), 1.5, rtol=1e-6)
    loss, _ = load_balancing_loss(balanced, experts_per_token=1, mask=jnp.array([0, 0]))
    assert float(loss) == 0.0  # no real token: 0, not 0 / 0


@pytest.mark.needs_torch
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_load_balancing_loss_matches_transformers(family):
    """Three layers' router logits over a [2, 6] batch whose first row has 2 padding tokens, 8 experts, top-2:
    the loss and its gradient with respect to the logits match the family's `load_balancing_loss_func`."""
    import importlib

    import torch

    func = importlib.import_module(f"transformers.models.{family}.modeling_{family}").load_balancing_loss_func
    logits = 2.0 * np.sin(np.linspace(0.0, 40.0, 3 * 12 * 8)).reshape(3, 12, 8).astype(np.float32)
    mask = np.ones((2, 6), np.int64)
    mask[0, :2] = 0
    layers = tuple(torch.tensor(layer, requires_grad=True) for layer in logits)
    expected = func(layers, 8, 2, torch.tensor(mask))
    expected.backward()

    def loss_fn(z):
        return load_balancing_loss(z.reshape(3, 2, 6, 8), experts_per_token=2, mask=jnp.asarray(mask))[0]

    loss, grad = jax.value_and_grad(loss_fn)(jnp.asarray(logits))
    assert abs(float(loss) - expected.item()) <= TOL
    assert_allclose(np.asarray(grad), np.stack([t.grad.numpy() for t in layers]), rtol=0, atol=TOL)
    unmasked = func(tuple(torch.tensor(layer) for layer in logits), 8, 2).item()
    assert abs(float(load_balancing_loss(jnp.asarray(logits), experts_per_token=2)[0]) - unmasked) <= TOL


# --------------------------------------------------------------------------------------------------------------
# The block against transformers' blocks


def _hf_block(model_type: str, class_name: str, scale: float, **config):
    import importlib

    import torch
    import transformers

    hf_cfg = transformers.AutoConfig.for_model(model_type, vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=1,
                                               num_attention_heads=2, num_key_value_heads=1, head_dim=8, **config)
    hf_cfg._experts_implementation = "eager"  # transformers' reference loop over experts
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    torch.manual_seed(0)
    block = getattr(module, class_name)(hf_cfg).eval()
    _perturb(block, scale)
    return hf_cfg, block


def _perturb(module, scale: float) -> None:
    """Every weight random at `scale`, except gpt-oss's down projection at 0.05: large gate/up weights drive the
    gates past its clamp, and a small down projection keeps the outputs near 1, where a 1e-5 difference is float
    rounding and not a lost term."""
    import torch

    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn_like(p) * (0.05 if name.endswith("experts.down_proj") else scale))


def _run_hf(block, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import torch

    router = block.gate if hasattr(block, "gate") else block.router
    with torch.no_grad():
        out = block(torch.tensor(x))
        logits = router(torch.tensor(x).reshape(-1, x.shape[-1]))[0]
    return (out[0] if isinstance(out, tuple) else out).numpy(), logits.numpy()


def _state(block, rename: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    """The transformers block's tensors with layer-relative names (the block sits at `mlp` in its layer)."""
    out = {}
    for name, t in block.state_dict().items():
        for old, new in (rename or {}).items():
            name = name.replace(old, new)
        out["mlp." + name] = t.numpy()
    return out


def _compare(ours: SparseMoeBlock, hf_block, x: np.ndarray) -> None:
    y, logits = _forward(ours, jnp.asarray(x))
    y_ref, logits_ref = _run_hf(hf_block, x)
    assert y.shape == x.shape and logits.shape == (*x.shape[:-1], logits_ref.shape[-1])
    assert np.max(np.abs(np.asarray(y) - y_ref)) <= TOL
    assert np.max(np.abs(np.asarray(logits).reshape(logits_ref.shape) - logits_ref)) <= TOL


# (hf model_type, transformers block class, weight scale, config): each family's block from its own config.json
# through ModelConfig.from_hf_config.
FAMILY_BLOCKS = [
    ("qwen3_moe", "Qwen3MoeSparseMoeBlock", 0.3,
     dict(num_experts=6, num_experts_per_tok=3, moe_intermediate_size=10, norm_topk_prob=True)),
    ("qwen3_moe", "Qwen3MoeSparseMoeBlock", 0.3,
     dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=10, norm_topk_prob=False)),
    ("mixtral", "MixtralSparseMoeBlock", 0.3, dict(num_local_experts=5, num_experts_per_tok=2, intermediate_size=12)),
    # weights at 0.8 drive some gates past gpt-oss's clamp at 7
    ("gpt_oss", "GptOssMLP", 0.8, dict(num_local_experts=6, num_experts_per_tok=2, intermediate_size=12)),
]


@pytest.mark.needs_torch
@pytest.mark.parametrize("model_type,class_name,scale,config", FAMILY_BLOCKS)
def test_block_matches_transformers(model_type, class_name, scale, config):
    hf_cfg, hf_block = _hf_block(model_type, class_name, scale, **config)
    moe = ModelConfig.from_hf_config(hf_cfg.to_dict()).moe
    ours = _block(moe)
    load_block_params(ours, hf_moe_tensors_to_params(_state(hf_block), model_type, moe_param_shapes(ours)))
    x = _tokens(scale=2.0)
    if model_type == "gpt_oss":
        experts = hf_block.experts
        gate_up = (x.reshape(-1, HIDDEN) @ experts.gate_up_proj.detach().numpy()
                   + experts.gate_up_proj_bias.detach().numpy()[:, None])  # [E, N, 2I]
        assert gate_up[..., ::2].max() > 7.0 and np.abs(gate_up[..., 1::2]).max() > 7.0  # both clamps engage
    _compare(ours, hf_block, x)


@pytest.mark.needs_torch
def test_shared_expert_with_its_gate_matches_qwen2_moe():
    """Qwen2-MoE (and Qwen3.5-MoE): a shared expert of width 14 scaled by sigmoid(x w_g), plus top-2 of 6."""
    hf_cfg, hf_block = _hf_block("qwen2_moe", "Qwen2MoeSparseMoeBlock", 0.3, num_experts=6, num_experts_per_tok=2,
                                 moe_intermediate_size=10, shared_expert_intermediate_size=14, norm_topk_prob=False)
    moe = MoeConfig(num_experts=6, experts_per_token=2, expert_intermediate_size=10, normalize_top_k=False,
                    shared_expert_intermediate_size=14, shared_expert_gate=True)
    ours = _block(moe)
    load_block_params(ours, hf_moe_tensors_to_params(_state(hf_block), "qwen2_moe", moe_param_shapes(ours)))
    _compare(ours, hf_block, _tokens(scale=2.0))


@pytest.mark.needs_torch
def test_sigmoid_router_with_scaling_and_ungated_shared_experts_matches_deepseek_v3():
    """DeepSeek V3's block with one expert group (no group-limited routing) and a zero score-correction bias:
    sigmoid scores, top-2 of 8 renormalised and scaled by 2.5, two shared experts (width 2 * 6) added ungated."""
    hf_cfg, hf_block = _hf_block("deepseek_v3", "DeepseekV3MoE", 0.3, n_routed_experts=8, num_experts_per_tok=2,
                                 moe_intermediate_size=6, n_shared_experts=2, n_group=1, topk_group=1,
                                 norm_topk_prob=True, routed_scaling_factor=2.5, q_lora_rank=None,
                                 kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8)
    with __import__("torch").no_grad():
        hf_block.gate.e_score_correction_bias.zero_()
    moe = MoeConfig(num_experts=8, experts_per_token=2, expert_intermediate_size=6, router_activation="sigmoid",
                    normalize_top_k=True, routed_scaling=2.5, shared_expert_intermediate_size=12)
    ours = _block(moe)
    state = _state(hf_block, {"shared_experts.": "shared_expert."})
    load_block_params(ours, hf_moe_tensors_to_params(state, "qwen2_moe", moe_param_shapes(ours)))
    _compare(ours, hf_block, _tokens(scale=2.0))


# --------------------------------------------------------------------------------------------------------------
# Tensor names: what transformers writes, read and written back


@pytest.mark.needs_torch
@pytest.mark.parametrize("model_type,class_name,scale,config", FAMILY_BLOCKS[1:])
def test_saved_checkpoint_tensors_load_and_export_exactly(model_type, class_name, scale, config, tmp_path):
    """A one-layer transformers model saved with `save_pretrained` (per-expert tensors for Qwen3-MoE and Mixtral,
    Mixtral under `block_sparse_moe`; fused interleaved ones for gpt-oss): its layer-0 MoE tensors fill our block,
    which then computes what the model's layer-0 block computes, and our export of the block writes exactly the
    tensors that were saved (same names, same values)."""
    import torch
    import transformers
    from safetensors.numpy import load_file

    hf_cfg = transformers.AutoConfig.for_model(model_type, vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=1,
                                               num_attention_heads=2, num_key_value_heads=1, head_dim=8, **config)
    hf_cfg._experts_implementation = "eager"
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    _perturb(model, scale)
    model.save_pretrained(tmp_path)
    saved = hf_layer_tensors(load_file(str(tmp_path / "model.safetensors")).items(), 0)
    moe_names = {n for n in saved if hf_moe_tensor_to_path(n, model_type) is not None}
    assert moe_names and all(hf_moe_tensor_to_path(n, model_type) is None for n in set(saved) - moe_names)

    moe = ModelConfig.from_hf_config(hf_cfg.to_dict()).moe
    ours = _block(moe)
    load_block_params(ours, hf_moe_tensors_to_params(saved, model_type, moe_param_shapes(ours)))
    _compare(ours, model.model.layers[0].mlp, _tokens(scale=2.0))

    exported = moe_params_to_hf_tensors(block_params(ours), model_type)
    assert set(exported) == moe_names
    for name in moe_names:
        assert exported[name].dtype == saved[name].dtype and np.array_equal(exported[name], saved[name]), name


def test_names_map_both_ways_by_rename():
    """One name of each kind: Qwen's per-expert weight is expert 5's row of the stacked kernel, transposed;
    Mixtral's w3 is the up projection; gpt-oss's fused gate_up_proj splits into even (gate) and odd (up) columns
    without a transpose; its router is our `gate`."""
    (slot,) = hf_moe_tensor_to_path("mlp.experts.5.up_proj.weight", "qwen3_moe")
    assert (slot.path, slot.expert, slot.part, slot.transpose) == (("experts", "up_proj"), 5, "all", True)
    (slot,) = hf_moe_tensor_to_path("block_sparse_moe.experts.1.w3.weight", "mixtral")
    assert (slot.path, slot.expert) == (("experts", "up_proj"), 1)
    gate, up = hf_moe_tensor_to_path("mlp.experts.gate_up_proj", "gpt_oss")
    assert (gate.path, gate.part, up.path, up.part, gate.transpose) == (
        ("experts", "gate_proj"), "even", ("experts", "up_proj"), "odd", False)
    assert [n for n, _ in moe_path_to_hf(("gate", "kernel"), "gpt_oss", 4)] == ["mlp.router.weight"]
    assert [n for n, _ in moe_path_to_hf(("experts", "down_proj"), "mixtral", 2)] == [
        "block_sparse_moe.experts.0.w2.weight", "block_sparse_moe.experts.1.w2.weight"]
    assert hf_moe_tensor_to_path("self_attn.q_proj.weight", "qwen3_moe") is None


def test_bad_names_and_shapes_are_refused_with_the_fix():
    with pytest.raises(CheckpointError, match="MXFP4.*dequantize=True"):
        hf_moe_tensor_to_path("mlp.experts.gate_up_proj_blocks", "gpt_oss")
    with pytest.raises(CheckpointError, match="known: qwen3_moe"):
        hf_moe_tensor_to_path("mlp.gate.weight", "llama4")
    block = _block(MoeConfig(num_experts=2, experts_per_token=1, expert_intermediate_size=4))
    shapes = moe_param_shapes(block)
    tensors = {"mlp.gate.weight": np.zeros((2, HIDDEN), np.float32),
               "mlp.experts.0.gate_proj.weight": np.zeros((4, HIDDEN), np.float32)}
    with pytest.raises(CheckpointError, match=r"experts.gate_proj is missing .*experts \[1\]"):
        hf_moe_tensors_to_params(tensors, "qwen3_moe", {k: v for k, v in shapes.items() if k[0] != "experts" or
                                                        k[1] == "gate_proj"})
    tensors["mlp.experts.1.gate_proj.weight"] = np.zeros((5, HIDDEN), np.float32)
    with pytest.raises(CheckpointError, match=r"has shape \(16, 5\).*experts.gate_proj\[1\] is \(16, 4\)"):
        hf_moe_tensors_to_params(tensors, "qwen3_moe", shapes)


# --------------------------------------------------------------------------------------------------------------
# The program: grouped products, no loop over experts


def test_block_program_has_no_loop_over_experts():
    """The block with a gated shared expert, forward and training gradient (output + 0.01 * load-balancing loss),
    traced for 4 and for 64 experts on the op table's plain column: the same products in both. Forward: 3 grouped
    products (gate, up, down) and 6 dense ones (router, shared gate/up/down, shared-expert gate, the loss's masked
    sum of router probabilities); with the gradient 9 grouped ones and 13 dense ones. A loop over experts would multiply the count by E, a dense
    [tokens, experts, ...] product would show in the dense count changing with E."""
    counts = []
    for num_experts in (4, 64):
        moe = MoeConfig(num_experts=num_experts, experts_per_token=2, expert_intermediate_size=8,
                        shared_expert_intermediate_size=8, shared_expert_gate=True)
        graphdef, state = nnx.split(_block(moe))
        x = jnp.asarray(_tokens())

        def loss(state, x):
            y, logits = nnx.merge(graphdef, state)(x)
            return jnp.sum(y) + 0.01 * load_balancing_loss(logits[None], experts_per_token=2)[0]

        with ops.use_backend("plain"):  # ragged_dot's grouped products; the CPU's tiles: tests/ops/cpu
            forward = product_counts(jax.make_jaxpr(loss)(state, x))
            backward = product_counts(jax.make_jaxpr(jax.grad(loss))(state, x))
        counts.append((forward, backward))
    assert counts[0] == counts[1]
    forward, backward = counts[0]
    assert forward == {"ragged_dot_general": 3, "dot_general": 6}
    assert backward == {"ragged_dot_general": 9, "dot_general": 13}


def test_bf16_block_routes_in_float32():
    """bf16 compute over float32 parameters: y in bf16, the router logits in float32 and within bf16 rounding of
    the float32 block's."""
    moe = MoeConfig(num_experts=4, experts_per_token=2, expert_intermediate_size=8)
    block32, block16 = _block(moe), _block(moe, dtype=jnp.bfloat16)
    x = jnp.asarray(_tokens())
    y, logits = _forward(block16, x.astype(jnp.bfloat16))
    y32, logits32 = _forward(block32, x)
    assert y.dtype == jnp.bfloat16 and logits.dtype == jnp.float32
    assert_allclose(np.asarray(logits), np.asarray(logits32), rtol=0, atol=1e-2)
    assert_allclose(np.asarray(y, np.float32), np.asarray(y32), rtol=0, atol=0.05 * float(jnp.max(jnp.abs(y32))))


# --------------------------------------------------------------------------------------------------------------
# The decoder: every layer sparse, its routing recorded for the auxiliary loss


@nnx.jit
def _recorded_aux_loss(model, ids, segment_ids):
    with recording_router_statistics() as recorded:
        model(ids, segment_ids=segment_ids)
    assert len(recorded) == 1 and recorded[0].moe == model.config.moe  # one call, its layers summed in the scan
    return router_aux_loss(recorded)[1]


@pytest.mark.needs_torch
@pytest.mark.parametrize("family", family_cases(TINY_MOE_FAMILIES))
def test_decoder_records_the_load_balancing_loss_transformers_reports(family):
    """A batch whose first row is left-padded by 3 through each family's tiny model inside
    `recording_router_statistics`: the loss of the recorded statistics (the three layers pooled, padding left out)
    equals transformers' `aux_loss` (output_router_logits=True, the same attention mask) within 1e-5."""
    import torch

    ref, model = hf_reference_pair(family)
    ids = random_ids((2, 9), seed=4)
    mask = np.ones_like(ids)
    mask[0, :3] = 0
    ids[0, :3] = 0
    metrics = _recorded_aux_loss(model, jnp.asarray(ids), jnp.asarray(mask))
    with torch.no_grad():
        out = ref(torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask), output_router_logits=True)
    assert abs(float(metrics["moe_aux_loss"]) - out.aux_loss.item()) <= TOL
    assert float(metrics["moe_max_load"]) >= 1.0


def test_router_aux_loss_pools_calls_and_trains_only_when_asked():
    """Two experts, top-1, two recorded calls of the same model: [ln 3, 0], [0, ln 3] and [ln 3, 0], [ln 3, 0].
    Pooled over 4 tokens: f = [3/4, 1/4]; P = [(0.75 + 0.25 + 0.75 + 0.75) / 4, ...] = [0.625, 0.375];
    loss = 2 * (0.75 * 0.625 + 0.25 * 0.375) = 1.125, max load 0.75 / 0.5 = 1.5. With train_aux_loss and
    coefficient 0.1 the loss gains 0.1125, without it nothing; a loss whose calls record nothing is unchanged."""
    ln3 = float(np.log(3.0))
    calls = [jnp.array([[ln3, 0.0], [0.0, ln3]]), jnp.array([[ln3, 0.0], [ln3, 0.0]])]
    for train, gain in ((True, 0.1125), (False, 0.0)):
        moe = MoeConfig(num_experts=2, experts_per_token=1, expert_intermediate_size=4, router_aux_loss_coef=0.1,
                        train_aux_loss=train)

        def loss_fn(model, batch):
            for z in calls:
                record_router_statistics(moe, router_statistics(z, experts_per_token=1))
            return jnp.float32(2.0), {"token_loss": jnp.float32(2.0)}

        loss, metrics = with_router_aux_loss(loss_fn)(None, None)
        assert_allclose(float(metrics["moe_aux_loss"]), 1.125, rtol=1e-6)
        assert_allclose(float(metrics["moe_max_load"]), 1.5, rtol=1e-6)
        assert_allclose(float(loss), 2.0 + gain, rtol=1e-6)
        assert float(metrics["token_loss"]) == 2.0
    plain = with_router_aux_loss(lambda model, batch: (jnp.float32(1.0), {"a": 1}))(None, None)
    assert plain == (1.0, {"a": 1})
    record_router_statistics(MoeConfig(), RouterStatistics(jnp.zeros(8), jnp.zeros(8), jnp.zeros(())))  # no block


def test_a_reference_pass_under_disable_adapters_is_not_recorded():
    """LoRA on tiny-qwen3-moe's attention: inside one recording block the adapted call is recorded, the frozen
    base under `disable_adapters` (DPO's and KTO's reference) is not."""
    model = apply_lora(tiny_tempax_model("qwen3_moe"), LoraConfig(rank=2, target_modules=("q_proj",)),
                       rngs=nnx.Rngs(1))
    ids = jnp.asarray(random_ids((1, 5)))
    with recording_router_statistics() as recorded:
        model(ids)
        with disable_adapters(model):
            model(ids)
    assert len(recorded) == 1 and float(recorded[0].statistics.tokens) == 3 * 5  # three layers of five tokens


def test_a_stack_mixing_dense_and_sparse_layers_is_refused_with_the_setting_named():
    """One scanned layer means one kind of feed-forward block: Qwen MoE's decoder_sparse_step 2 (layers 0 and 2
    dense) and mlp_only_layers [1] are refused when the model is built, naming the settings and the fix."""
    cfg = tiny_config("qwen3_moe")
    for moe in (dataclasses.replace(cfg.moe, decoder_sparse_step=2),
                dataclasses.replace(cfg.moe, mlp_only_layers=(1,))):
        with pytest.raises(ConfigError, match=r"mlp_only_layers=.*decoder_sparse_step=.*dense.*set mlp_only_layers"):
            Decoder(cfg.replace(moe=moe), rngs=nnx.Rngs(0))


def _causal_lm_loss(model, batch):
    logits, _ = model(batch["tokens"], segment_ids=batch["segment_ids"])
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), batch["targets"][..., None], axis=-1)[..., 0]
    mask = batch["segment_ids"].astype(jnp.float32)
    return -jnp.sum(logp * mask) / jnp.sum(mask), {"num_tokens": jnp.sum(mask)}


@pytest.mark.parametrize("adapted", [False, True], ids=["full", "lora-experts"])
def test_the_training_step_runs_no_loop_over_experts(adapted):
    """The whole training step (`tempax.train.step.make_train_step`: forward, router auxiliary loss, gradient, SGD
    update) of tiny-qwen3-moe traced for 4 and for 64 experts holds the same products: the three layers are one
    scanned layer, whose experts are 3 grouped products forward and 6 more for their gradients (9
    ragged_dot_general), whatever the number of experts. With LoRA on the experts (gate_up_proj and down_proj,
    training the adapters only) each adapter adds two grouped products through its rank (x A_e, then (x A_e) B_e),
    each with two in its backward pass: 3 + 4 = 7 forward, 14 backward, 21 in all. A loop over experts would
    multiply the grouped count by E; a dense [tokens, experts, ...] product would change the dense count with E."""
    import optax

    from tempax.models.lora import lora_filter
    from tempax.train.state import ModelParts, init_state
    from tempax.train.step import make_train_step

    counts = []
    for num_experts in (4, 64):
        cfg = tiny_config("qwen3_moe")
        cfg = cfg.replace(moe=dataclasses.replace(cfg.moe, num_experts=num_experts, train_aux_loss=True))
        model = Decoder(cfg, rngs=nnx.Rngs(0))
        if adapted:
            model = apply_lora(model, LoraConfig(rank=2, target_modules=("experts",)), rngs=nnx.Rngs(1))
        parts, params = ModelParts.split(model, lora_filter if adapted else nnx.Param)
        optimizer = optax.sgd(0.1)
        step = make_train_step(_causal_lm_loss, parts, optimizer)
        batch = {"tokens": jnp.asarray(random_ids((2, 8))), "targets": jnp.asarray(random_ids((2, 8), seed=1)),
                 "segment_ids": jnp.ones((2, 8), jnp.int32)}
        state = init_state(params, optimizer, 0)
        with ops.use_backend("plain"):  # ragged_dot's grouped products; the CPU's tiles: tests/ops/cpu
            jaxpr = jax.make_jaxpr(step)(state, parts.rest, batch)
        counts.append(product_counts(jaxpr))
        metrics = jax.eval_shape(step, state, parts.rest, batch)[1]
        assert {"moe_aux_loss", "moe_max_load"} <= set(metrics)
    assert counts[0] == counts[1]
    assert counts[0]["ragged_dot_general"] == (21 if adapted else 9)


# --------------------------------------------------------------------------------------------------------------
# LoRA and QLoRA on a mixture of experts


def test_lora_targets_name_the_experts_and_the_router_as_peft_users_do():
    """On tiny-qwen3-moe: the default targets adapt the attention and the experts (gate_proj with up_proj is the
    fused gate_up_proj, down_proj the experts' down kernels); "experts" adapts both expert parameters, "gate" or
    "router" the router (a LoraLinear), a path regex selects layers. Refused with the fix: gate_proj without
    up_proj, adapter dropout on experts or router (PEFT's target_parameters LoRA has none), unknown names."""
    model = tiny_tempax_model("qwen3_moe")
    default = apply_lora(model, LoraConfig(rank=2), rngs=nnx.Rngs(0))
    assert {p for p, _ in lora_layers(default)} == {("layers", "self_attn", n) for n in ("q_proj", "k_proj",
                                                                                      "v_proj", "o_proj")}
    (path, experts), = lora_experts(default)
    assert path == ("layers", "mlp", "experts") and experts.adapted_params() == ["gate_up_proj", "down_proj"]
    # [L, E, D, r] = [3, 6, 64, 2]; B [L, E, r, 2I] = [3, 6, 2, 64] zeros; down A [3, 6, 32, 2], B [3, 6, 2, 64]
    assert experts.gate_up_a.shape == (3, 6, 64, 2) and experts.gate_up_b.shape == (3, 6, 2, 64)
    assert experts.down_a.shape == (3, 6, 32, 2) and experts.down_b.shape == (3, 6, 2, 64)
    assert not np.any(np.asarray(experts.gate_up_b[...]))
    routed = apply_lora(model, LoraConfig(rank=2, target_modules=("router", "experts")), rngs=nnx.Rngs(0))
    assert [p for p, _ in lora_layers(routed)] == [("layers", "mlp", "gate")]
    assert lora_layers(routed).__next__()[1].lora_b.shape == (3, 2, 6)
    some = apply_lora(model, LoraConfig(rank=2, target_modules=(r"layers\.[02]\.mlp\.experts\.down_proj",)),
                      rngs=nnx.Rngs(0))
    (_, experts), = lora_experts(some)
    assert experts.adapted_params() == ["down_proj"] and experts.adapted_layers("down_proj") == [0, 2]
    assert np.asarray(experts.down_mask[...]).tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(ConfigError, match=r"gate_proj names half of the routed experts.*gate_up_proj"):
        apply_lora(model, LoraConfig(rank=2, target_modules=("q_proj", "gate_proj")), rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match=r"lora.dropout=0.1 .*Set lora.dropout=0"):
        apply_lora(model, LoraConfig(rank=2, dropout=0.1, target_modules=("gate",)), rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match=r"'w9' matches no linear layer or expert parameter.*gate_up_proj.*router"):
        apply_lora(model, LoraConfig(rank=2, target_modules=("w9",)), rngs=nnx.Rngs(0))


def test_low_rank_update_by_hand():
    """Two rows sorted by expert (row 0 to expert 0, row 1 to expert 1), in 2, rank 1, out 2, scale 0.5:
    expert 0: A = [[1], [0]], B = [[3, 4]]: x = [1, 2] -> x A = 1 -> 0.5 * [3, 4] = [1.5, 2];
    expert 1: A = [[1], [1]], B = [[1, -1]]: x = [2, -1] -> x A = 1 -> 0.5 * [1, -1] = [0.5, -0.5]."""
    from tempax.ops.experts import ExpertAdapter, low_rank_update

    adapter = ExpertAdapter(jnp.array([[[1.0], [0.0]], [[1.0], [1.0]]]), jnp.array([[[3.0, 4.0]], [[1.0, -1.0]]]),
                            0.5)
    out = low_rank_update(jnp.array([[1.0, 2.0], [2.0, -1.0]]), adapter, jnp.array([1, 1], jnp.int32))
    assert_allclose(np.asarray(out), [[1.5, 2.0], [0.5, -0.5]], rtol=1e-6)


def _expert_adapters(model, seed: int = 0, scale: float = 0.3):
    """Non-zero B on every expert adapter (and router adapter), so they change the output."""
    key = jax.random.key(seed)
    for _, layer in lora_layers(model):
        key, sub = jax.random.split(key)
        layer.lora_b.set_value(jax.random.normal(sub, layer.lora_b.shape) * scale)
    for _, experts in lora_experts(model):
        for name in experts.adapted_params():
            key, sub = jax.random.split(key)
            b = experts.factors(name)[1]
            b.set_value(jax.random.normal(sub, b.shape) * scale)
    return model


@pytest.mark.heavy
def test_expert_adapters_compute_base_plus_scaled_low_rank_update_per_expert():
    """tiny-gpt-oss (expert biases, clamped SwiGLU, interleaved gate/up in its files) with LoRA on the experts and
    the router, alpha / r = 3 / 2. B = 0, or any B under `disable_adapters`: logits equal the base exactly.
    Non-zero B: the logits equal those of the base model whose kernels are W_e + 1.5 * A_e B_e (the gate the first
    I columns of A_e B^gu_e, up the rest) and whose router kernel is W_r + 1.5 * A B, built here from the factors,
    and the gradients of a loss with respect to A and B equal those through that hand-built model (autodiff
    through W + 1.5 A B)."""
    from tempax.models.lora import lora_filter

    base = tiny_tempax_model("gpt_oss")
    ids = jnp.asarray(random_ids((2, 7), seed=3))
    lora = apply_lora(base, LoraConfig(rank=2, alpha=3.0, target_modules=("experts", "router")), rngs=nnx.Rngs(2))
    np.testing.assert_array_equal(np.asarray(_forward(lora, ids)[0]), np.asarray(_forward(base, ids)[0]))
    lora = _expert_adapters(lora)
    with disable_adapters(lora):  # DPO's reference: the base exactly, whatever B
        np.testing.assert_array_equal(np.asarray(lora(ids)[0]), np.asarray(base(ids)[0]))
    (_, experts), = lora_experts(lora)
    (_, router), = lora_layers(lora)

    def hand_model(factors):
        (ga, gb), (da, db), (ra, rb) = factors
        inner = gb.shape[-1] // 2
        model = nnx.clone(base)
        up_down = {"gate_proj": ga @ gb[..., :inner], "up_proj": ga @ gb[..., inner:], "down_proj": da @ db}
        for name, delta in up_down.items():
            kernel = getattr(model.layers.mlp.experts, name)
            kernel.set_value(kernel[...] + 1.5 * delta)
        model.layers.mlp.gate.kernel.set_value(model.layers.mlp.gate.kernel[...] + 1.5 * (ra @ rb))
        return model

    def loss_of(logits):
        return jnp.mean(jax.nn.log_softmax(logits)[..., 5])

    factors = (tuple(f[...] for f in experts.factors("gate_up_proj")),
               tuple(f[...] for f in experts.factors("down_proj")), (router.lora_a[...], router.lora_b[...]))
    hand_loss, hand_grads = jax.value_and_grad(lambda f: loss_of(hand_model(f)(ids)[0]))(factors)
    assert_allclose(np.asarray(_forward(lora, ids)[0]), np.asarray(_forward(hand_model(factors), ids)[0]),
                    rtol=0, atol=1e-5)

    graphdef, adapters, rest = nnx.split(lora, lora_filter, ...)
    loss, grads = jax.jit(jax.value_and_grad(lambda a: loss_of(nnx.merge(graphdef, a, rest)(ids)[0])))(adapters)
    assert_allclose(float(loss), float(hand_loss), rtol=1e-5)
    got = {"gate_up_a": 0, "gate_up_b": 1, "down_a": 2, "down_b": 3}
    want = [*hand_grads[0], *hand_grads[1]]
    mlp = grads["layers"]["mlp"]
    for name, k in got.items():
        assert float(jnp.max(jnp.abs(want[k]))) > 0
        assert_allclose(np.asarray(mlp["experts"][name][...]), np.asarray(want[k]), rtol=0, atol=1e-6)
    assert_allclose(np.asarray(mlp["gate"]["lora_a"][...]), np.asarray(hand_grads[2][0]), rtol=0, atol=1e-6)
    assert_allclose(np.asarray(mlp["gate"]["lora_b"][...]), np.asarray(hand_grads[2][1]), rtol=0, atol=1e-6)


@pytest.mark.heavy
def test_merge_folds_expert_and_router_adapters_into_the_weights():
    """merge_lora of tiny-qwen3-moe with LoRA on attention, experts and router: a plain Decoder, logits within
    1e-5 of the adapted model's (float32); with QLoRA the experts stay NF4 codes under float adapters and the
    merge dequantizes them first."""
    from tempax.models.lora import merge_lora
    from tempax.models.moe import QuantizedRoutedExperts, RoutedExperts

    base = tiny_tempax_model("qwen3_moe")
    ids = jnp.asarray(random_ids((2, 7), seed=5))
    for quant in (None, "nf4"):
        cfg = LoraConfig(rank=2, target_modules=("q_proj", "experts", "gate"), quantize_base=quant)
        lora = _expert_adapters(apply_lora(base, cfg, rngs=nnx.Rngs(4)))
        (_, experts), = lora_experts(lora)
        assert isinstance(experts.base_layer, QuantizedRoutedExperts if quant else RoutedExperts)
        assert experts.gate_up_a.dtype == jnp.float32
        merged = merge_lora(lora)
        assert isinstance(merged.layers.mlp.experts, RoutedExperts) and not list(lora_experts(merged))
        assert_allclose(np.asarray(_forward(merged, ids)[0]), np.asarray(_forward(lora, ids)[0]), rtol=0, atol=1e-5)


@pytest.mark.heavy
def test_qlora_stores_the_experts_in_4_bits_and_differentiates_through_them():
    """tiny-gpt-oss (expert biases, clamped SwiGLU) with QLoRA: the expert kernels become NF4 codes (one uint8 per
    two weights) and a float32 scale per 64, the router stays float; the quantized model computes what the float
    model with the dequantized kernels computes, and the adapters' gradients (attention's, and the experts' own,
    which stay float32) through the quantized experts (their own backward pass, which dequantizes again) equal
    those through the float experts."""
    from tempax.models.lora import lora_filter, merge_lora, quantize_base
    from tempax.models.moe import QuantizedRoutedExperts

    base = tiny_tempax_model("gpt_oss")
    targets = LoraConfig(rank=2, target_modules=("q_proj", "v_proj", "experts"))
    quantized = apply_lora(base, dataclasses.replace(targets, quantize_base="nf4"), rngs=nnx.Rngs(3))
    experts = quantized.layers.mlp.experts.base_layer
    assert isinstance(experts, QuantizedRoutedExperts) and isinstance(quantized.layers.mlp.gate, nnx.Linear)
    # [L, E, D, I] = [3, 4, 64, 32]: codes [3, 4, 32, 32] uint8, scales [3, 4, 1, 32]
    assert experts.gate_proj_codes.shape == (3, 4, 32, 32) and experts.gate_proj_codes.dtype == jnp.uint8
    assert experts.gate_proj_scale.shape == (3, 4, 1, 32)
    dequantized = apply_lora(merge_lora(quantize_base(base)), targets, rngs=nnx.Rngs(3))
    ids = jnp.asarray(random_ids((2, 7), seed=6))

    @nnx.jit
    def value_and_grads(model):
        graphdef, adapters, rest = nnx.split(model, lora_filter, ...)

        def loss(adapters):
            logits, _ = nnx.merge(graphdef, adapters, rest)(ids)
            return jnp.mean(jax.nn.log_softmax(logits)[..., 5])

        return jax.value_and_grad(loss)(adapters)

    (loss_q, grads_q), (loss_f, grads_f) = value_and_grads(quantized), value_and_grads(dequantized)
    assert_allclose(float(loss_q), float(loss_f), rtol=1e-6)
    flat_q, flat_f = jax.tree.leaves(grads_q), jax.tree.leaves(grads_f)
    assert len(flat_q) == 8 and any(float(jnp.max(jnp.abs(g))) > 0 for g in flat_q)
    for gq, gf in zip(flat_q, flat_f):
        assert_allclose(np.asarray(gq), np.asarray(gf), rtol=0, atol=1e-6)


@pytest.mark.heavy
def test_a_prompt_run_into_a_cache_and_its_continuation_are_recorded_and_pooled():
    """GRPO's training pass runs the prompts into a KV cache and the completions against it: a left-padded prefill
    of 5 positions (2 of them padding), then 4 tokens, then 1 (a decode step) are three recorded calls, whose
    statistics pool to 3 layers x (3 + 4 + 1) = 24 real tokens and equal one uncached pass over the same 8 tokens."""
    from tempax.models.cache import KVCache

    model = tiny_tempax_model("mixtral")
    ids = jnp.asarray(random_ids((1, 10), seed=9))
    seg = jnp.asarray([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1]], jnp.int32)
    with recording_router_statistics() as recorded:
        cache = KVCache.init(model.config, 1, 16)
        _, cache = model(ids[:, :5], segment_ids=seg[:, :5], cache=cache, fresh_cache=True)
        _, cache = model(ids[:, 5:9], segment_ids=seg[:, 5:9], cache=cache)
        model(ids[:, 9:], segment_ids=seg[:, 9:], cache=cache)
    with recording_router_statistics() as whole:
        model(ids[:, 2:])
    assert len(recorded) == 3 and [float(r.statistics.tokens) for r in recorded] == [9.0, 12.0, 3.0]
    pooled, one_pass = router_aux_loss(recorded)[1], router_aux_loss(whole)[1]
    assert_allclose(float(pooled["moe_aux_loss"]), float(one_pass["moe_aux_loss"]), rtol=1e-5)


@pytest.mark.heavy
def test_an_expert_lora_step_on_8_devices_matches_one_device(tmp_path):
    """One SFT step (SGD, lr 1, adapters only) of tiny-qwen3-moe with LoRA on q_proj, the experts and the router,
    on 8 fake CPU devices (data 2 x fsdp 2 x tensor 2) and on one: the experts' adapters are split like their
    kernels (6 experts over fsdp), and the loss and every updated adapter equal the one-device step's."""
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    from jax.sharding import PartitionSpec as P

    from tempax.algorithms.sft.main import make_sft_loss
    from tempax.models.lora import lora_filter
    from tempax.train.config import MeshConfig, OptimizerConfig
    from tempax.train.loop import Trainer
    from tests.train.helpers import host, random_batch, tiny_train_config

    cfg = tiny_config("qwen3_moe").replace(num_layers=2)
    lora = LoraConfig(rank=2, target_modules=("q_proj", "experts", "router"))
    batch = random_batch(8, 16, seed=2)
    sgd = OptimizerConfig(name="sgd", learning_rate=1.0, schedule="constant", weight_decay=0.0, grad_clip_norm=None)
    results = []
    for mesh in (MeshConfig(num_devices=1), MeshConfig(num_devices=8, data=2, fsdp=2, tensor=2)):
        model = _expert_adapters(apply_lora(Decoder(cfg, rngs=nnx.Rngs(0)), lora, rngs=nnx.Rngs(1)))
        trainer = Trainer(model, make_sft_loss(), tiny_train_config(tmp_path, optimizer=sgd, mesh=mesh),
                          trainable=lora_filter)
        metrics = host(trainer.train_step(batch))
        results.append((metrics, host(trainer.state.params), trainer.state.params))
    (one_m, one_p, _), (eight_m, eight_p, placed) = results
    assert placed["layers.mlp.experts.gate_up_a"].sharding.spec == P(None, "fsdp", None, None)
    assert_allclose(eight_m["loss"], one_m["loss"], rtol=1e-5)
    assert set(one_p) >= {"layers.mlp.experts.gate_up_b", "layers.mlp.experts.down_a", "layers.mlp.gate.lora_b"}
    for key in one_p:
        assert_allclose(eight_p[key], one_p[key], atol=1e-5, err_msg=key)
