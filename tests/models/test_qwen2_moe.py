"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): its config.json read and written, its parameter counts, what
tempax refuses about it (dense layers among sparse ones, sliding windows, GGUF), and its registry entry.

Its logits (plain, left-padded, packed, cached), greedy tokens, export to transformers and load-balancing loss are
checked with the other mixture-of-experts families through `TINY_MOE_FAMILIES` (tests/models/test_parity.py,
tests/generate/test_parity.py, tests/models/test_roundtrip.py, tests/models/test_moe.py).
"""

from __future__ import annotations

import pytest
from flax import nnx

from tempax.errors import CheckpointError, ConfigError
from tempax.models.config import ModelConfig, MoeConfig
from tempax.models.decoder import Decoder
from tempax.models.gguf_export import check_exportable
from tempax.models.presets import get_preset
from tempax.models.registry import MODELS, ResolvedSource, resolve_source
from tests.kit.models import tiny_config

# The architecture keys of Qwen1.5-MoE-A2.7B's config.json (transformers-4 keys; no mlp_only_layers key, which
# transformers reads as []).
QWEN1_5_MOE_A2_7B = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "decoder_sparse_step": 1,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5632, "max_position_embeddings": 8192,
    "max_window_layers": 21, "moe_intermediate_size": 1408, "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 5632, "sliding_window": 32768, "tie_word_embeddings": False,
    "use_sliding_window": False, "vocab_size": 151936,
}

# Qwen2-57B-A14B's shape: grouped-query attention (4 key/value heads), 64 experts, top-8.
QWEN2_57B_A14B = {
    **QWEN1_5_MOE_A2_7B, "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 131072,
    "max_window_layers": 28, "moe_intermediate_size": 2560, "num_attention_heads": 28, "num_experts": 64,
    "num_experts_per_tok": 8, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "shared_expert_intermediate_size": 20480, "sliding_window": 131072,
}


def test_qwen1_5_moe_a2_7b_is_its_preset_and_counts_its_parameters():
    """Per layer: attention 4 * 2048*2048 + 3 * 2048 (q/k/v biases) = 16,783,360; norms 4,096; router 2048*60 =
    122,880; one expert 3*2048*1408 = 8,650,752; shared expert 3*2048*5632 + 2048 (its gate) = 34,605,056.
    Total: 24 * (16,783,360 + 4,096 + 122,880 + 60 * 8,650,752 + 34,605,056) + 2 * 151,936*2048 (untied) + 2,048
    = 13,693,452,288 + 622,329,856 + 2,048 = 14,315,784,192 (the "14.3B").
    Active (4 experts): 24 * (16,783,360 + 4,096 + 122,880 + 4 * 8,650,752 + 34,605,056) + 622,331,904
    = 2,689,173,504 ("A2.7B")."""
    cfg = ModelConfig.from_hf_config(QWEN1_5_MOE_A2_7B)
    assert cfg == get_preset("qwen1.5-moe-a2.7b")
    assert cfg.family == "qwen2_moe" and cfg.qkv_bias and not cfg.o_bias and not cfg.qk_norm
    assert cfg.layer_types == () and cfg.sliding_window is None
    assert cfg.moe == MoeConfig(num_experts=60, experts_per_token=4, expert_intermediate_size=1408,
                                normalize_top_k=False, shared_expert_intermediate_size=5632, shared_expert_gate=True)
    assert all(cfg.is_moe_layer(i) for i in range(24))
    assert cfg.num_params() == 14_315_784_192
    assert cfg.num_params(active=True) == 2_689_173_504


def test_qwen2_57b_a14b_counts_its_parameters():
    """Per layer: attention 2 * 3584*3584 + 2 * 3584*512 + 3584 + 2*512 (biases) = 29,364,736; norms 7,168; router
    3584*64 = 229,376; one expert 3*3584*2560 = 27,525,120; shared 3*3584*20480 + 3584 = 220,204,544.
    Total: 28 * (29,364,736 + 7,168 + 229,376 + 64 * 27,525,120 + 220,204,544) + 2 * 151,936*3584 + 3,584
    = 56,319,578,112 + 1,089,077,248 + 3,584 = 57,408,658,944 ("57B").
    Active (8 experts): 28 * (29,364,736 + 7,168 + 229,376 + 8 * 27,525,120 + 220,204,544) + 1,089,080,832
    = 14,249,270,784 ("A14B")."""
    cfg = ModelConfig.from_hf_config(QWEN2_57B_A14B)
    assert cfg.num_kv_heads == 4 and cfg.head_dim == 128 and cfg.moe.experts_per_token == 8
    assert cfg.num_params() == 57_408_658_944
    assert cfg.num_params(active=True) == 14_249_270_784


def test_norm_topk_prob_defaults_to_false_and_qkv_bias_to_true():
    """transformers' Qwen2-MoE defaults: a config.json without norm_topk_prob keeps the top-k weights as the
    softmax gave them; without qkv_bias (every transformers-4 config) q/k/v have biases; transformers 5's
    qkv_bias false turns them off, and the config written back says so."""
    bare = {k: v for k, v in QWEN1_5_MOE_A2_7B.items() if k != "norm_topk_prob"}
    cfg = ModelConfig.from_hf_config(bare)
    assert cfg.moe.normalize_top_k is False and cfg.qkv_bias
    no_bias = ModelConfig.from_hf_config({**QWEN1_5_MOE_A2_7B, "qkv_bias": False})
    assert not no_bias.qkv_bias and not no_bias.o_bias
    assert no_bias.to_hf_config()["qkv_bias"] is False
    assert ModelConfig.from_hf_config(no_bias.to_hf_config()) == no_bias


@pytest.mark.needs_torch
@pytest.mark.parametrize("extra", [{}, {"norm_topk_prob": True, "qkv_bias": False, "decoder_sparse_step": 2,
                                        "mlp_only_layers": [0], "output_router_logits": True,
                                        "router_aux_loss_coef": 0.01}])
def test_round_trip_through_transformers(extra):
    """transformers' own Qwen2-MoE config of a tiny model -> ModelConfig -> config.json -> transformers' config:
    every key transformers set is the same, and reading it again gives the same ModelConfig."""
    import transformers

    theirs = transformers.AutoConfig.for_model(
        "qwen2_moe", vocab_size=64, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=10,
        shared_expert_intermediate_size=12, **extra).to_dict()
    cfg = ModelConfig.from_hf_config(theirs)
    assert cfg.moe.shared_expert_intermediate_size == 12 and cfg.moe.shared_expert_gate
    back = transformers.AutoConfig.for_model(**cfg.to_hf_config()).to_dict()
    skip = {"transformers_version", "architectures", "dtype", "torch_dtype"}
    assert {k: back.get(k) for k in theirs if k not in skip} == {k: v for k, v in theirs.items() if k not in skip}
    assert ModelConfig.from_hf_config(back) == cfg


@pytest.mark.parametrize("keys", [{"decoder_sparse_step": 2}, {"mlp_only_layers": [1]}])
def test_dense_layers_among_sparse_ones_are_refused_naming_both_settings(keys):
    """decoder_sparse_step 2 (layers 0 and 2 dense) or mlp_only_layers [1]: the config reads, and building the
    model (what loading a checkpoint does) is refused with the two settings and the fix."""
    cfg = ModelConfig.from_hf_config({**QWEN1_5_MOE_A2_7B, **keys, "num_hidden_layers": 3, "hidden_size": 32,
                                      "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 64,
                                      "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
                                      "shared_expert_intermediate_size": 8, "intermediate_size": 16})
    assert not all(cfg.is_moe_layer(i) for i in range(3))
    with pytest.raises(ConfigError, match=r"mlp_only_layers=.*decoder_sparse_step=.* dense while others are sparse.*"
                                          r"set mlp_only_layers to \[\] and decoder_sparse_step to 1"):
        Decoder(cfg, rngs=nnx.Rngs(0))


def test_sliding_windows_are_refused():
    """Released Qwen2-MoE checkpoints attend over the whole context; a config that turns the window on is refused
    with the key to change, and a qwen2_moe config with sliding layers is not written."""
    with pytest.raises(CheckpointError, match="qwen2_moe with use_sliding_window=true.*set use_sliding_window to false"):
        ModelConfig.from_hf_config({**QWEN1_5_MOE_A2_7B, "use_sliding_window": True})
    sliding = tiny_config("qwen2_moe").replace(sliding_window=4, layer_types=("sliding",) * 3)
    with pytest.raises(CheckpointError, match="qwen2_moe config.json cannot express layer_types"):
        sliding.to_hf_config()


def test_switches_qwen2_moe_cannot_state_are_refused_on_export():
    """An output-projection bias or q/k norms have no Qwen2-MoE config key; neither has a block without the shared
    expert's gate."""
    tiny = tiny_config("qwen2_moe")
    with pytest.raises(CheckpointError, match=r"cannot express o_bias=True, qk_norm=True"):
        tiny.replace(o_bias=True, qk_norm=True).to_hf_config()
    ungated = tiny.replace(moe=MoeConfig(num_experts=6, experts_per_token=2, expert_intermediate_size=32,
                                         shared_expert_intermediate_size=48))
    with pytest.raises(CheckpointError, match="cannot express moe settings shared_expert_gate"):
        ungated.to_hf_config()
    with pytest.raises(CheckpointError, match="shared_expert_intermediate_size=0"):
        ModelConfig.from_hf_config({**QWEN1_5_MOE_A2_7B, "shared_expert_intermediate_size": 0})


def test_gguf_export_is_refused():
    with pytest.raises(ConfigError, match="cannot export this qwen2_moe model to GGUF: .*Hugging Face folder"):
        check_exportable(tiny_config("qwen2_moe"))


def test_registry_names_the_chat_model_on_the_hub():
    entry = MODELS["qwen1.5-moe-a2.7b-chat"]
    assert entry.hub_repo == "Qwen/Qwen1.5-MoE-A2.7B-Chat"
    assert resolve_source("qwen1.5-moe-a2.7b-chat") == ResolvedSource("qwen1.5-moe-a2.7b-chat", "hub", entry.hub_repo)
