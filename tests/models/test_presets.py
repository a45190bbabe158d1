"""Named presets match the configs their Hub checkpoints give."""

from __future__ import annotations

from tempax.models.config import ModelConfig
from tempax.models.presets import get_preset

# meta-llama/Llama-3.2-1B config.json (as published; written out here so the test needs no network).
LLAMA_3_2_1B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 128256,
}


def test_llama3_2_1b_preset_is_the_hub_config():
    """The preset equals ModelConfig.from_hf_config of the Hub config.json field for field. Parameters:
    embedding 128256 x 2048 = 262,668,288 (tied head); per layer q, o 2 x 2048 x 2048 = 8,388,608, k, v
    2 x 2048 x 512 = 2,097,152, MLP 3 x 2048 x 8192 = 50,331,648, two norms 4,096, so 60,821,504; 16 layers
    973,144,064; final norm 2,048; total 1,235,814,400."""
    preset = get_preset("llama3.2-1b")
    assert preset == ModelConfig.from_hf_config(LLAMA_3_2_1B_CONFIG)
    embed = 128256 * 2048
    attention = 2048 * (32 * 64) * 2 + 2048 * (8 * 64) * 2  # q, o and k, v
    mlp = 3 * 2048 * 8192
    norms = 2 * 2048
    assert preset.num_params() == embed + 16 * (attention + mlp + norms) + 2048 == 1_235_814_400


def test_mixture_of_experts_presets_are_their_hub_configs():
    """qwen3-30b-a3b, mixtral-8x7b and gpt-oss-20b equal ModelConfig.from_hf_config of their config.json's
    architecture keys (written out here), and count 30.5B / 46.7B / 20.9B parameters."""
    from tests.models.test_config import GPT_OSS, QWEN3_30B_A3B

    mixtral = {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
        "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "num_local_experts": 8, "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.02, "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 32000,
    }
    gpt_oss = {**GPT_OSS, "num_hidden_layers": 24, "router_aux_loss_coef": 0.9, "eos_token_id": 200002,
               "pad_token_id": 199999, "layer_types": ["sliding_attention", "full_attention"] * 12}
    for name, hf, billions in (("qwen3-30b-a3b", QWEN3_30B_A3B, 30.5), ("mixtral-8x7b", mixtral, 46.7),
                               ("gpt-oss-20b", gpt_oss, 20.9)):
        preset = get_preset(name)
        assert preset == ModelConfig.from_hf_config(hf), name
        assert round(preset.num_params() / 1e9, 1) == billions
