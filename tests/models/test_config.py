"""`ModelConfig` for the mixture-of-experts families: `from_hf_config` / `to_hf_config` of qwen3_moe, mixtral and
gpt_oss, the `MoeConfig` checks, which layers are sparse, and the parameter counts (total and active)."""

from __future__ import annotations

import pytest

from tempax.errors import CheckpointError, ConfigError
from tempax.models.config import ModelConfig, MoeConfig, RopeConfig

# The architecture keys of Qwen3-30B-A3B's config.json.
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
    "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936,
}

# A gpt-oss config.json in transformers-4's keys (rope_scaling, rope_theta), the 20B model's shape.
GPT_OSS = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True, "head_dim": 64,
    "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880, "max_position_embeddings": 131072,
    "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 4, "num_key_value_heads": 8,
    "num_local_experts": 32, "rms_norm_eps": 1e-05, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "vocab_size": 201088, "rope_theta": 150000,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
}


def test_qwen3_30b_a3b_parses_and_counts_its_parameters():
    """Per layer: attention 2048*4096 + 2*2048*512 + 4096*2048 + 2*128 (q/k norms) = 18,874,624; norms 4,096;
    router 2048*128 = 262,144; one expert 3*2048*768 = 4,718,592.
    Total: 48 * (18,874,624 + 4,096 + 262,144 + 128 * 4,718,592) + 2 * 151,936*2048 (untied) + 2,048
    = 29,909,790,720 + 622,329,856 + 2,048 = 30,532,122,624 (the "30B").
    Active (8 experts): 48 * (18,874,624 + 4,096 + 262,144 + 8 * 4,718,592) + 622,331,904 = 3,353,032,704 ("A3B")."""
    cfg = ModelConfig.from_hf_config(QWEN3_30B_A3B)
    assert cfg.family == "qwen3_moe" and cfg.qk_norm and not cfg.qkv_bias and cfg.layer_types == ()
    assert cfg.moe == MoeConfig(num_experts=128, experts_per_token=8, expert_intermediate_size=768,
                                normalize_top_k=True, router_aux_loss_coef=0.001)
    assert all(cfg.is_moe_layer(i) for i in range(48))
    assert cfg.num_params() == 30_532_122_624
    assert cfg.num_params(active=True) == 3_353_032_704


def test_gpt_oss_parses_its_router_experts_sinks_and_yarn():
    cfg = ModelConfig.from_hf_config(GPT_OSS)
    assert cfg.moe == MoeConfig(num_experts=32, experts_per_token=4, expert_intermediate_size=2880,
                                normalize_top_k=True, router_bias=True, expert_bias=True,
                                expert_activation="clamped_swiglu", swiglu_alpha=1.702, swiglu_limit=7.0,
                                router_aux_loss_coef=0.9)
    assert cfg.attention_sinks and cfg.qkv_bias and cfg.o_bias and not cfg.qk_norm
    assert cfg.layer_types == ("sliding", "full", "sliding", "full") and cfg.sliding_window == 128
    assert cfg.rope == RopeConfig(theta=150000.0, scaling="yarn", factor=32.0, original_max_position_embeddings=4096,
                                  beta_fast=32.0, beta_slow=1.0, truncate=False)


def test_sparse_layers_follow_decoder_sparse_step_and_mlp_only_layers():
    """Qwen's rule, four layers: step 2 makes layers 1 and 3 sparse ((i + 1) % 2 == 0); mlp_only_layers [3] keeps
    layer 3 dense. Layer 1 counts the block, the others the dense MLP of intermediate_size."""
    hf = {**QWEN3_30B_A3B, "num_hidden_layers": 4, "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    cfg = ModelConfig.from_hf_config(hf)
    assert [cfg.is_moe_layer(i) for i in range(4)] == [False, True, False, False]
    dense = cfg.replace(moe=None)
    sparse_minus_dense = cfg.moe.block_params(2048)[0] - 3 * 2048 * 6144
    assert cfg.num_params() == dense.num_params() + sparse_minus_dense
    assert cfg.to_hf_config()["mlp_only_layers"] == [3]
    with pytest.raises(CheckpointError, match=r"mlp_only_layers \[7\] are not layers of a 4-layer model"):
        ModelConfig.from_hf_config({**hf, "mlp_only_layers": [7]})


@pytest.mark.needs_torch
@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_round_trip_through_transformers(model_type):
    """transformers' own config of a tiny model -> ModelConfig -> config.json -> transformers' config: every key
    transformers set is the same, and reading it again gives the same ModelConfig."""
    import transformers

    extra = {"qwen3_moe": dict(num_experts=6, moe_intermediate_size=10, norm_topk_prob=True, decoder_sparse_step=2,
                               router_aux_loss_coef=0.01, output_router_logits=True),
             "mixtral": dict(num_local_experts=5, sliding_window=32),
             "gpt_oss": dict(num_local_experts=6, swiglu_limit=5.0)}[model_type]
    theirs = transformers.AutoConfig.for_model(model_type, vocab_size=64, hidden_size=32, intermediate_size=24,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               head_dim=8, num_experts_per_tok=2, **extra).to_dict()
    cfg = ModelConfig.from_hf_config(theirs)
    back = transformers.AutoConfig.for_model(**cfg.to_hf_config()).to_dict()
    skip = {"transformers_version", "architectures", "dtype", "torch_dtype"}
    assert {k: back.get(k) for k in theirs if k not in skip} == {k: v for k, v in theirs.items() if k not in skip}
    assert ModelConfig.from_hf_config(back) == cfg
    if model_type == "mixtral":
        assert cfg.layer_types == ("sliding", "sliding")


def test_bad_moe_settings_name_the_key():
    with pytest.raises(ConfigError, match=r"experts_per_token \(9\) must be between 1 and num_experts \(8\)"):
        MoeConfig(num_experts=8, experts_per_token=9)
    with pytest.raises(ConfigError, match="shared_expert_gate needs a shared expert"):
        MoeConfig(shared_expert_gate=True)
    with pytest.raises(ConfigError, match="router_activation 'relu'"):
        MoeConfig(router_activation="relu")
    mixtral = ModelConfig.from_hf_config({**QWEN3_30B_A3B, "model_type": "mixtral"})
    with pytest.raises(CheckpointError, match="cannot express moe settings router_bias"):
        mixtral.replace(moe=MoeConfig(num_experts=8, router_bias=True)).to_hf_config()
    with pytest.raises(CheckpointError, match="hidden_act='gelu'"):
        ModelConfig.from_hf_config({**QWEN3_30B_A3B, "hidden_act": "gelu"})


# --------------------------------------------------------------------------------------------------------------
# The dense families: SmolLM3 (NoPE layers), OLMo 2/3 (post-norms, q/k norm over the whole projection, OLMo 3's
# windows) and Phi-3 (partial rotary, a window on every layer).

_DENSE_EXTRA = {
    "smollm3": dict(num_hidden_layers=8, use_sliding_window=True, sliding_window=16, attention_bias=True),
    "olmo2": dict(attention_bias=True),
    "olmo3": dict(num_hidden_layers=8, sliding_window=32),
    "phi3": dict(sliding_window=32, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                      "partial_rotary_factor": 0.5}),
}


@pytest.mark.needs_torch
@pytest.mark.parametrize("model_type", list(_DENSE_EXTRA))
def test_dense_families_round_trip_through_transformers(model_type):
    """transformers' own config -> ModelConfig -> config.json -> transformers: every key transformers set comes back,
    reading it again gives the same ModelConfig, and num_params equals the parameter count of the model
    transformers builds from it."""
    import transformers

    shape = dict(vocab_size=64, hidden_size=32, intermediate_size=24, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    theirs = transformers.AutoConfig.for_model(model_type, **{**shape, **_DENSE_EXTRA[model_type]}).to_dict()
    cfg = ModelConfig.from_hf_config(theirs)
    back = transformers.AutoConfig.for_model(**cfg.to_hf_config())
    skip = {"transformers_version", "architectures", "dtype", "torch_dtype"}
    assert {k: back.to_dict().get(k) for k in theirs if k not in skip} == {
        k: v for k, v in theirs.items() if k not in skip}
    assert ModelConfig.from_hf_config(back.to_dict()) == cfg
    model = transformers.AutoModelForCausalLM.from_config(back)
    assert cfg.num_params() == sum(p.numel() for p in model.parameters())


def test_dense_family_switches_are_read():
    """SmolLM3: no_rope_layers 0 marks NoPE layers; absent, every no_rope_layer_interval-th layer; its window covers
    the NoPE layers. OLMo: norms after the blocks only, q/k norm across heads; OLMo 3 without layer_types slides
    three layers of four, its sliding layers on the unscaled rope. Phi-3: partial rotary, a window on every layer."""
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=24, num_hidden_layers=8, num_attention_heads=4,
                num_key_value_heads=2)
    smol = ModelConfig.from_hf_config({**base, "model_type": "smollm3", "no_rope_layer_interval": 3,
                                       "use_sliding_window": True, "sliding_window": 16})
    assert smol.nope_layers == (2, 5) and smol.rope.theta == 2e6 and smol.tie_word_embeddings
    assert smol.layer_types == tuple("sliding" if i in (2, 5) else "full" for i in range(8))
    listed = ModelConfig.from_hf_config({**base, "model_type": "smollm3", "no_rope_layers": [1, 0] * 4})
    assert listed.nope_layers == (1, 3, 5, 7) and listed.layer_types == ()
    olmo3 = ModelConfig.from_hf_config({**base, "model_type": "olmo3", "rope_theta": 5e5,
                                        "rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    assert not olmo3.pre_norms and olmo3.post_norms and olmo3.qk_norm and olmo3.qk_norm_across_heads
    assert olmo3.layer_types == ("sliding", "sliding", "sliding", "full") * 2 and olmo3.sliding_window == 4096
    assert olmo3.rope == RopeConfig(theta=5e5, scaling="linear", factor=2.0)
    assert olmo3.rope_local == RopeConfig(theta=5e5)
    phi3 = ModelConfig.from_hf_config({**base, "model_type": "phi3", "partial_rotary_factor": 0.75,
                                       "sliding_window": 2047})
    assert phi3.rotary_dim == 6 and phi3.layer_types == ("sliding",) * 8 and phi3.sliding_window == 2047
    assert not phi3.tie_word_embeddings and phi3.rms_norm_eps == 1e-5


def test_dense_family_settings_that_cannot_be_stated_are_refused():
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=24, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2)
    with pytest.raises(ConfigError, match="longrope short_factor and long_factor have 2 and 2 entries; the rotary "
                                          "dimension 8 needs 4 each"):
        ModelConfig.from_hf_config({**base, "model_type": "phi3", "rope_scaling": {
            "type": "longrope", "short_factor": [1.0] * 2, "long_factor": [2.0] * 2}})
    olmo2 = ModelConfig.from_hf_config({**base, "model_type": "olmo2"})
    with pytest.raises(CheckpointError, match="olmo2 config.json cannot express pre_norms=True"):
        olmo2.replace(pre_norms=True).to_hf_config()
    with pytest.raises(CheckpointError, match=r"llama config.json cannot express nope_layers=\(1,\)"):
        olmo2.replace(family="llama", pre_norms=True, post_norms=False, qk_norm=False, qk_norm_across_heads=False,
                      nope_layers=(1,)).to_hf_config()
    with pytest.raises(ConfigError, match="nope_layers \\[4\\] are not layers of a 4-layer model"):
        olmo2.replace(nope_layers=(4,))
    with pytest.raises(ConfigError, match="partial_rotary_factor=0.1 gives 0 rotated features"):
        olmo2.replace(partial_rotary_factor=0.1)
    with pytest.raises(ConfigError, match="pre_norms=False leaves the layers without any norm"):
        olmo2.replace(post_norms=False)


def test_phi3_longrope_is_read_as_transformers_reads_it():
    """Phi-3.5-mini's form (transformers 4): rope_scaling {"type": "su" or "longrope", short/long factors} and the
    original context at the top level; the extension factor is max_position_embeddings / original = 131072 / 4096
    = 32. The config.json tempax writes gives transformers the same rope parameters and reads back equal."""
    import math

    base = dict(model_type="phi3", vocab_size=64, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=131072,
                original_max_position_embeddings=4096, partial_rotary_factor=0.5)
    factors = {"short_factor": [1.0, 1.5], "long_factor": [4.0, 9.0]}
    for name in ("su", "longrope"):
        cfg = ModelConfig.from_hf_config({**base, "rope_scaling": {"type": name, **factors}})
        assert cfg.rotary_dim == 4
        assert cfg.rope == RopeConfig(theta=10000.0, scaling="longrope", factor=32.0,
                                      original_max_position_embeddings=4096, short_factor=(1.0, 1.5),
                                      long_factor=(4.0, 9.0))
        assert ModelConfig.from_hf_config(cfg.to_hf_config()) == cfg
    from tempax.models.decoder import rope_attention_factor

    assert rope_attention_factor(cfg.rope) == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))


@pytest.mark.needs_torch
def test_phi3_longrope_config_json_loads_in_transformers():
    import transformers

    cfg = ModelConfig.from_hf_config(dict(
        model_type="phi3", vocab_size=64, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, original_max_position_embeddings=32,
        pad_token_id=0, rope_scaling={"type": "longrope", "short_factor": [1.0, 1.5, 2.0, 3.0],
                                      "long_factor": [4.0, 9.0, 12.0, 20.0]}))
    theirs = transformers.AutoConfig.for_model(**cfg.to_hf_config())
    params = theirs.rope_parameters
    assert params["rope_type"] == "longrope" and params["original_max_position_embeddings"] == 32
    assert params["short_factor"] == [1.0, 1.5, 2.0, 3.0] and params["long_factor"] == [4.0, 9.0, 12.0, 20.0]
    assert ModelConfig.from_hf_config(theirs.to_dict()) == cfg
