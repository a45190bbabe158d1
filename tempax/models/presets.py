"""Named model shapes for each family (random init, or to check what a checkpoint should look like).

The published checkpoints' shapes; `bench-tiny` / `bench-small` are the shapes of the benchmark workloads
(`bench/`, `docs/measurements/performance-history.md`). Each `tiny-<family>` preset is a few-thousand-parameter
model that exercises every switch of its family, for fast tests.
"""

from __future__ import annotations

from tempax.errors import ConfigError
from tempax.models.config import LinearAttentionConfig, ModelConfig, MoeConfig, RopeConfig

_LLAMA3_ROPE = RopeConfig(theta=500000.0, scaling="llama3", factor=32.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=8192)


def _tiny(family: str, **kw) -> ModelConfig:
    base = dict(family=family, vocab_size=128, hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2,
                head_dim=16, intermediate_size=96, max_position_embeddings=256)
    base.update(kw)
    return ModelConfig(**base)


PRESETS: dict[str, ModelConfig] = {
    # Llama 3 family / SmolLM2 (same architecture).
    "smollm2-135m": ModelConfig(
        family="llama", vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3,
        head_dim=64, intermediate_size=1536, rope=RopeConfig(theta=100000.0), tie_word_embeddings=True,
        max_position_embeddings=8192, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    ),
    "smollm2-360m": ModelConfig(
        family="llama", vocab_size=49152, hidden_size=960, num_layers=32, num_heads=15, num_kv_heads=5,
        head_dim=64, intermediate_size=2560, rope=RopeConfig(theta=100000.0), tie_word_embeddings=True,
        max_position_embeddings=8192,
    ),
    "llama3.2-1b": ModelConfig(
        family="llama", vocab_size=128256, hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8,
        head_dim=64, intermediate_size=8192, rope=_LLAMA3_ROPE, tie_word_embeddings=True,
        max_position_embeddings=131072, rms_norm_eps=1e-5, bos_token_id=128000, eos_token_id=128001,
    ),  # = ModelConfig.from_hf_config of meta-llama/Llama-3.2-1B's config.json (tests/models/test_presets.py)
    "llama3.2-3b": ModelConfig(
        family="llama", vocab_size=128256, hidden_size=3072, num_layers=28, num_heads=24, num_kv_heads=8,
        head_dim=128, intermediate_size=8192, rope=_LLAMA3_ROPE, tie_word_embeddings=True,
        max_position_embeddings=131072, rms_norm_eps=1e-5,
    ),
    "llama3.1-8b": ModelConfig(
        family="llama", vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=14336,
        rope=RopeConfig(theta=500000.0, scaling="llama3", factor=8.0, original_max_position_embeddings=8192),
        tie_word_embeddings=False, max_position_embeddings=131072, rms_norm_eps=1e-5,
    ),
    "qwen2.5-0.5b": ModelConfig(
        family="qwen2", vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
        head_dim=64, intermediate_size=4864, rope=RopeConfig(theta=1000000.0), qkv_bias=True,
        tie_word_embeddings=True, max_position_embeddings=32768, rms_norm_eps=1e-6,
    ),
    "qwen2.5-1.5b": ModelConfig(
        family="qwen2", vocab_size=151936, hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2,
        head_dim=128, intermediate_size=8960, rope=RopeConfig(theta=1000000.0), qkv_bias=True,
        tie_word_embeddings=True, max_position_embeddings=32768, rms_norm_eps=1e-6,
    ),
    "qwen3-0.6b": ModelConfig(
        family="qwen3", vocab_size=151936, hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8,
        head_dim=128, intermediate_size=3072, rope=RopeConfig(theta=1000000.0), qk_norm=True,
        tie_word_embeddings=True, max_position_embeddings=40960, rms_norm_eps=1e-6,
    ),
    "qwen3-1.7b": ModelConfig(
        family="qwen3", vocab_size=151936, hidden_size=2048, num_layers=28, num_heads=16, num_kv_heads=8,
        head_dim=128, intermediate_size=6144, rope=RopeConfig(theta=1000000.0), qk_norm=True,
        tie_word_embeddings=True, max_position_embeddings=40960, rms_norm_eps=1e-6,
    ),
    "gemma-2b": ModelConfig(
        family="gemma", vocab_size=256000, hidden_size=2048, num_layers=18, num_heads=8, num_kv_heads=1,
        head_dim=256, intermediate_size=16384, norm_offset=True, embed_scale=True, activation="gelu_tanh",
        tie_word_embeddings=True, max_position_embeddings=8192, rms_norm_eps=1e-6,
    ),
    "gemma2-2b": ModelConfig(
        family="gemma2", vocab_size=256000, hidden_size=2304, num_layers=26, num_heads=8, num_kv_heads=4,
        head_dim=256, intermediate_size=9216, norm_offset=True, embed_scale=True, activation="gelu_tanh",
        post_norms=True, attn_logit_softcap=50.0, final_logit_softcap=30.0, query_pre_attn_scalar=256,
        sliding_window=4096, layer_types=tuple("sliding" if i % 2 == 0 else "full" for i in range(26)),
        tie_word_embeddings=True, max_position_embeddings=8192, rms_norm_eps=1e-6,
    ),
    "gemma3-1b": ModelConfig(
        family="gemma3", vocab_size=262144, hidden_size=1152, num_layers=26, num_heads=4, num_kv_heads=1,
        head_dim=256, intermediate_size=6912, norm_offset=True, embed_scale=True, activation="gelu_tanh",
        post_norms=True, qk_norm=True, query_pre_attn_scalar=256, sliding_window=512,
        layer_types=tuple("full" if (i + 1) % 6 == 0 else "sliding" for i in range(26)),
        rope=RopeConfig(theta=1000000.0), rope_local=RopeConfig(theta=10000.0),
        tie_word_embeddings=True, max_position_embeddings=32768, rms_norm_eps=1e-6,
    ),
    # Mixture-of-experts families (= ModelConfig.from_hf_config of each Hub config.json's architecture keys).
    "qwen1.5-moe-a2.7b": ModelConfig(
        family="qwen2_moe", vocab_size=151936, hidden_size=2048, num_layers=24, num_heads=16, num_kv_heads=16,
        head_dim=128, intermediate_size=5632, rope=RopeConfig(theta=1000000.0), qkv_bias=True,
        tie_word_embeddings=False, max_position_embeddings=8192, rms_norm_eps=1e-6,
        moe=MoeConfig(num_experts=60, experts_per_token=4, expert_intermediate_size=1408, normalize_top_k=False,
                      shared_expert_intermediate_size=5632, shared_expert_gate=True),
    ),  # 14.3B parameters, 2.7B active per token
    "qwen3-30b-a3b": ModelConfig(
        family="qwen3_moe", vocab_size=151936, hidden_size=2048, num_layers=48, num_heads=32, num_kv_heads=4,
        head_dim=128, intermediate_size=6144, rope=RopeConfig(theta=1000000.0), qk_norm=True,
        tie_word_embeddings=False, max_position_embeddings=40960, rms_norm_eps=1e-6,
        moe=MoeConfig(num_experts=128, experts_per_token=8, expert_intermediate_size=768, normalize_top_k=True),
    ),  # 30.5B parameters, 3.35B active per token
    "mixtral-8x7b": ModelConfig(
        family="mixtral", vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=14336, rope=RopeConfig(theta=1000000.0), tie_word_embeddings=False,
        max_position_embeddings=32768, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
        moe=MoeConfig(num_experts=8, experts_per_token=2, expert_intermediate_size=14336, router_aux_loss_coef=0.02),
    ),
    "gpt-oss-20b": ModelConfig(
        family="gpt_oss", vocab_size=201088, hidden_size=2880, num_layers=24, num_heads=64, num_kv_heads=8,
        head_dim=64, intermediate_size=2880, qkv_bias=True, o_bias=True, attention_sinks=True,
        rope=RopeConfig(theta=150000.0, scaling="yarn", factor=32.0, original_max_position_embeddings=4096,
                        truncate=False),
        sliding_window=128, layer_types=("sliding", "full") * 12, tie_word_embeddings=False,
        max_position_embeddings=131072, rms_norm_eps=1e-5, eos_token_id=200002, pad_token_id=199999,
        moe=MoeConfig(num_experts=32, experts_per_token=4, expert_intermediate_size=2880, router_bias=True,
                      expert_bias=True, expert_activation="clamped_swiglu", router_aux_loss_coef=0.9),
    ),
    # Shared benchmark shapes.
    "bench-tiny": ModelConfig(
        family="llama", vocab_size=32000, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
        head_dim=64, intermediate_size=1024, rope=RopeConfig(theta=10000.0), tie_word_embeddings=True,
        max_position_embeddings=2048,
    ),
    "bench-small": ModelConfig(
        family="llama", vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3,
        head_dim=64, intermediate_size=1536, rope=RopeConfig(theta=100000.0), tie_word_embeddings=True,
        max_position_embeddings=2048,
    ),
    # Tiny models exercising every switch of each family (tests).
    "tiny-llama": _tiny("llama", tie_word_embeddings=False, rope=RopeConfig(
        theta=500000.0, scaling="llama3", factor=8.0, original_max_position_embeddings=64)),
    "tiny-qwen2": _tiny("qwen2", qkv_bias=True, rms_norm_eps=1e-6),
    "tiny-qwen3": _tiny("qwen3", qk_norm=True, rms_norm_eps=1e-6),
    "tiny-gemma": _tiny("gemma", norm_offset=True, embed_scale=True, activation="gelu_tanh", rms_norm_eps=1e-6),
    "tiny-gemma2": _tiny(
        "gemma2", norm_offset=True, embed_scale=True, activation="gelu_tanh", post_norms=True,
        attn_logit_softcap=50.0, final_logit_softcap=30.0, query_pre_attn_scalar=24, sliding_window=4,
        layer_types=("sliding", "full", "sliding"), rms_norm_eps=1e-6,
    ),
    "tiny-gemma3": _tiny(
        "gemma3", num_layers=4, norm_offset=True, embed_scale=True, activation="gelu_tanh", post_norms=True,
        qk_norm=True, query_pre_attn_scalar=24, sliding_window=4, layer_types=("sliding", "full") * 2,
        rope=RopeConfig(theta=1e6, scaling="linear", factor=8.0), rope_local=RopeConfig(theta=1e4),
        rms_norm_eps=1e-6,
    ),
    # Mixture-of-experts: 6 or 4 experts, top-2; every layer sparse. Qwen2-MoE adds q/k/v biases and a shared expert
    # behind a sigmoid gate, and keeps the top-2 weights unnormalised (its norm_topk_prob false). Mixtral slides
    # everywhere; gpt-oss alternates sliding and full layers, with attention sinks, q/k/v/o biases, YaRN (its ramp
    # falls inside the 8 frequencies of head_dim 16) and its biased router and experts.
    "tiny-qwen3-moe": _tiny("qwen3_moe", qk_norm=True, rms_norm_eps=1e-6, tie_word_embeddings=False,
                            moe=MoeConfig(num_experts=6, experts_per_token=2, expert_intermediate_size=32,
                                          normalize_top_k=True)),
    "tiny-qwen2-moe": _tiny("qwen2_moe", qkv_bias=True, rms_norm_eps=1e-6, tie_word_embeddings=False,
                            moe=MoeConfig(num_experts=6, experts_per_token=2, expert_intermediate_size=32,
                                          normalize_top_k=False, shared_expert_intermediate_size=48,
                                          shared_expert_gate=True)),
    "tiny-mixtral": _tiny("mixtral", intermediate_size=32, tie_word_embeddings=False, sliding_window=4,
                          layer_types=("sliding",) * 3,
                          moe=MoeConfig(num_experts=4, experts_per_token=2, expert_intermediate_size=32)),
    "tiny-gpt-oss": _tiny(
        "gpt_oss", intermediate_size=32, qkv_bias=True, o_bias=True, attention_sinks=True, tie_word_embeddings=False,
        sliding_window=4, layer_types=("sliding", "full", "sliding"), max_position_embeddings=32 * 4096,
        rope=RopeConfig(theta=150000.0, scaling="yarn", factor=32.0, original_max_position_embeddings=4096,
                        truncate=False),
        moe=MoeConfig(num_experts=4, experts_per_token=2, expert_intermediate_size=32, router_bias=True,
                      expert_bias=True, expert_activation="clamped_swiglu"),
    ),
    # SmolLM3: layer 3 without rotary embedding (NoPE every fourth layer, as the published models and llama.cpp).
    # OLMo 2/3: norms after attention and MLP only, q/k norms over the whole projection; OLMo 3 slides three layers
    # of four. Phi-3: rotary on 12 of each head's 16 features (Phi-4-mini's factor 0.75); fused qkv and gate/up
    # tensors in its files.
    "tiny-smollm3": _tiny("smollm3", num_layers=4, nope_layers=(3,), rope=RopeConfig(theta=2e6), rms_norm_eps=1e-6),
    "tiny-olmo2": _tiny("olmo2", tie_word_embeddings=False, qk_norm=True, qk_norm_across_heads=True,
                        pre_norms=False, post_norms=True),
    "tiny-olmo3": _tiny("olmo3", num_layers=4, tie_word_embeddings=False, qk_norm=True, qk_norm_across_heads=True,
                        pre_norms=False, post_norms=True, sliding_window=4,
                        layer_types=("sliding", "sliding", "sliding", "full"), rope=RopeConfig(theta=5e5),
                        rope_local=RopeConfig(theta=5e5)),
    "tiny-phi3": _tiny("phi3", tie_word_embeddings=False, partial_rotary_factor=0.75),
    # Qwen3.5: Gated DeltaNet in three layers of four, gated softmax attention (q/k norms, rotary on a quarter of
    # each head) in the fourth; 8 value heads over 4 key heads, as the released models pair them. The MoE variant
    # routes top-2 of 6 renormalised, with a gated shared expert.
    "tiny-qwen3-5": _tiny("qwen3_5", num_layers=8, **(_QWEN3_5 := dict(
        norm_offset=True, qk_norm=True, attn_output_gate=True, partial_rotary_factor=0.25, rms_norm_eps=1e-6,
        tie_word_embeddings=False, rope=RopeConfig(theta=1e7),
        linear_attention=LinearAttentionConfig(num_key_heads=4, num_value_heads=8, key_head_dim=8, value_head_dim=8),
        linear_attention_layers=(0, 1, 2, 4, 5, 6)))),
    "tiny-qwen3-5-moe": _tiny("qwen3_5_moe", num_layers=8, **_QWEN3_5,
                              moe=MoeConfig(num_experts=6, experts_per_token=2, expert_intermediate_size=32,
                                            normalize_top_k=True, shared_expert_intermediate_size=48,
                                            shared_expert_gate=True)),
    # Gemma 4: sliding and full layers (the full ones of head width 32 with one key/value head, a proportional rope
    # rotating a quarter of each head's frequency pairs and values equal to keys), value norms, per-layer inputs of
    # width 8, layer scalars, and the last two layers (one of each kind, their MLP twice as wide) attending to the
    # keys and values of the last earlier layer of their kind.
    "tiny-gemma4": _tiny(
        "gemma4", num_layers=6, embed_scale=True, activation="gelu_tanh", post_norms=True, qk_norm=True, v_norm=True,
        query_pre_attn_scalar=1.0, sliding_window=4, layer_types=("sliding", "sliding", "full") * 2,
        rope=RopeConfig(theta=1e6, scaling="proportional", rotated_fraction=0.25), rope_local=RopeConfig(theta=1e4),
        final_logit_softcap=30.0, rms_norm_eps=1e-6, attention_k_eq_v=True, kv_shared_layers=2,
        per_layer_input_size=8, layer_scalar=True, bos_token_id=2, eos_token_id=1, pad_token_id=0,
        global_head_dim=32, global_kv_heads=1, wide_shared_mlp=True,
    ),
}

TINY_FAMILIES = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "smollm3", "olmo2", "olmo3", "phi3",
                 "qwen3_5", "gemma4")
# presets tiny-qwen2-moe, tiny-qwen3-moe, tiny-mixtral, tiny-gpt-oss, tiny-qwen3-5-moe
TINY_MOE_FAMILIES = ("qwen2_moe", "qwen3_moe", "mixtral", "gpt_oss", "qwen3_5_moe")


def tiny_preset_name(family: str) -> str:
    """The name of a family's tiny preset: "tiny-" and the family with hyphens ("gpt_oss" -> "tiny-gpt-oss")."""
    return "tiny-" + family.replace("_", "-")


def get_preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        import difflib

        close = difflib.get_close_matches(name, PRESETS, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"unknown model preset {name!r}.{hint} Known presets: {', '.join(sorted(PRESETS))}.")
    return PRESETS[name]
