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
