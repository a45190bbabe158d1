"""The decoder's configuration: one dataclass whose fields carry every difference between families.

Llama 3 / SmolLM2, Qwen2/2.5, Qwen3, Gemma, Gemma 2 and Gemma 3 are the same decoder-only transformer with a
handful of switches (qkv bias, q/k norm, norm offset, embedding scaling, soft-capping, sliding windows, extra
post-norms, per-layer rope bases); Gemma 4 adds value norms, per-layer inputs, shared keys and values and full layers
of their own attention shape. Mixture-of-experts families (Qwen2-MoE, Qwen3-MoE, Mixtral, gpt-oss, Qwen3.5-MoE, and
Gemma 4's sparse block beside its MLP) add a `MoeConfig`:
the router, the routed and shared experts and the auxiliary loss. `ModelConfig.from_hf_config` reads a Hugging
Face `config.json` (both the transformers-4 `rope_theta`/`rope_scaling` keys and the transformers-5
`rope_parameters` form) and `to_hf_config` writes one that `transformers` loads.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from tempax.errors import CheckpointError, ConfigError

LayerType = Literal["full", "sliding"]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "gemma3", "mistral",
                         "qwen2_moe", "qwen3_moe", "mixtral", "gpt_oss", "smollm3", "olmo2", "olmo3", "phi3",
                         "qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe", "gemma4_text", "gemma4")
# Gemma 4's config.json: the text model's own, or the multimodal model's with the text model's in text_config
GEMMA4_MODEL_TYPES = ("gemma4_text", "gemma4")
# the decoder's layer stacks (`ModelConfig.layer_stacks`), in the order a `Decoder` builds them
LAYER_STACKS = ("layers", "linear_layers", "full_layers", "shared_layers", "shared_full_layers")
# Qwen3.5's config.json: the text model's own, or the multimodal model's with the text model's in text_config
QWEN3_5_MODEL_TYPES = {"qwen3_5_text": "qwen3_5", "qwen3_5": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe",
                       "qwen3_5_moe": "qwen3_5_moe"}
MOE_MODEL_TYPES = ("qwen2_moe", "qwen3_moe", "mixtral", "gpt_oss")
_QWEN_MOE = ("qwen2_moe", "qwen3_moe")  # Qwen's MoE config.json keys: num_experts, moe_intermediate_size, ...


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding for one kind of layer.

    Attributes:
      theta: base of the inverse frequencies.
      scaling: None, "linear" (positions divided by `factor`), "llama3" (Llama 3.1 frequency-band scaling),
        "yarn" (YaRN, Peng et al. 2023, arXiv:2309.00071: gpt-oss) or "longrope" (LongRoPE, Ding et al. 2024,
        arXiv:2402.13753: Phi-3.5 / Phi-4-mini; per-frequency divisors `short_factor`, or `long_factor` for a call
        whose positions pass original_max_position_embeddings).
      factor: scaling factor for "linear", "llama3", "yarn" and "longrope" (its context extension).
      low_freq_factor, high_freq_factor: the "llama3" band edges.
      original_max_position_embeddings: the pre-training context of "llama3" and "yarn".
      beta_fast, beta_slow: "yarn"'s ramp between extrapolated and interpolated frequencies (in rotations).
      truncate: "yarn" rounds the ramp's ends to whole dimensions (transformers' default; gpt-oss sets False).
      attention_factor: "yarn"'s and "longrope"'s scale of cos and sin; None = the method's default (yarn:
        0.1 * ln(factor) + 1; longrope: sqrt(1 + ln(factor) / ln(original_max_position_embeddings))).
      short_factor, long_factor: "longrope"'s divisors of the inverse frequencies, one per rotated pair.
      rotated_fraction: "proportional" (Gemma 4's full-attention layers): the share of each head's frequency pairs
        that rotate, the lowest-index (fastest) ones with theta^(-2i/head_dim) (divided by `factor`); the others get
        inverse frequency 0 and pass through, so the rotation still spans the whole head (unlike
        `ModelConfig.partial_rotary_factor`, which rotates the first features of each head among themselves).
    """

    theta: float = 10000.0
    scaling: Literal["linear", "llama3", "yarn", "longrope", "proportional"] | None = None
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    rotated_fraction: float = 1.0


RouterActivation = Literal["softmax", "sigmoid"]
ExpertActivation = Literal["silu", "gelu_tanh", "clamped_swiglu"]


@dataclass(frozen=True)
class MoeConfig:
    """A sparse mixture-of-experts feed-forward block (`tempax.models.moe.SparseMoeBlock`) in place of the MLP, or
    beside it (Gemma 4).

    The router scores each token against every expert, keeps the top k and weights their outputs; shared experts
    (Qwen2-MoE, Qwen3.5-MoE, DeepSeek) see every token. Families: Qwen2-MoE (softmax, top-4 of 60 or top-8 of 64, not
    renormalised, plus a shared expert scaled by a sigmoid gate), Qwen3-MoE (softmax, top-8 of 128, renormalised),
    Mixtral (softmax, top-2 of 8, renormalised), gpt-oss (router bias, softmax over the top-4 logits, i.e.
    renormalised; expert biases; clamped SwiGLU), Gemma 4 (26B-A4B: softmax, top-8 of 128, renormalised and scaled
    per expert; a router input norm with a learned scale; GeGLU experts beside the dense MLP, each side with norms
    of its own).

    Attributes:
      num_experts: routed experts E.
      experts_per_token: k, the experts each token is sent to.
      expert_intermediate_size: inner width of each routed expert.
      router_activation: "softmax" (probabilities over all experts) or "sigmoid" (independent scores, DeepSeek V3).
      normalize_top_k: the k kept scores are divided by their sum (transformers' `norm_topk_prob`).
      routed_scaling: the routed experts' weights are multiplied by this (DeepSeek's `routed_scaling_factor`).
      router_bias: the router has a bias (gpt-oss).
      expert_bias: the experts' projections have biases (gpt-oss).
      expert_activation: "silu" (SwiGLU), "gelu_tanh" (GeGLU) or "clamped_swiglu" (gpt-oss: `swiglu_alpha`,
        `swiglu_limit`).
      swiglu_alpha, swiglu_limit: gpt-oss's (up + 1) * g * sigmoid(alpha * g), g = min(gate, limit), up clipped
        to [-limit, limit].
      shared_expert_intermediate_size: inner width of the shared expert every token also passes through; 0 = none.
      shared_expert_gate: the shared expert's output is scaled by sigmoid(x w), a learned per-token gate
        (Qwen2-MoE / Qwen3.5-MoE).
      router_aux_loss_coef: weight of the load-balancing loss (`tempax.models.moe.load_balancing_loss`) in the
        training loss.
      train_aux_loss: add router_aux_loss_coef * the load-balancing loss to the training loss (what transformers
        does when `output_router_logits` is set); otherwise it is only reported.
      decoder_sparse_step: every this many layers is sparse (layer i when (i + 1) % step == 0; Qwen MoE).
      mlp_only_layers: layers that keep a dense MLP of `ModelConfig.intermediate_size` (Qwen MoE).
      router_input_norm: the router reads rms_norm(x) * s * hidden_size^-0.5, x RMS-normalised without a weight and
        multiplied by a learned scale s [D] (Gemma 4's `router.scale`), instead of x.
      per_expert_scale: each kept weight is multiplied by a learned scale of its expert, [E] (Gemma 4's
        `router.per_expert_scale`), after the renormalisation.
      beside_dense_mlp: the sparse block runs beside the layer's dense gated MLP (`ModelConfig.intermediate_size`,
        `ModelConfig.activation`) instead of in its place (Gemma 4's `enable_moe_block`): with h the residual stream
        after attention, the layer adds post_norm(norm_1(mlp(pre_norm(h))) + norm_2(experts(pre_norm_2(h)))), the
        router reading h itself. The block holds the dense MLP and the three norms of its own
        (`tempax.models.moe.SparseMoeBlock`); the layer needs `ModelConfig.post_norms`.

    Not represented: Mixtral's `router_jitter_noise` (multiplicative input noise while training; tempax routes
    without it), DeepSeek's group-limited routing and score-correction bias.
    """

    num_experts: int = 8
    experts_per_token: int = 2
    expert_intermediate_size: int = 1024
    router_activation: RouterActivation = "softmax"
    normalize_top_k: bool = True
    routed_scaling: float = 1.0
    router_bias: bool = False
    expert_bias: bool = False
    expert_activation: ExpertActivation = "silu"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    router_aux_loss_coef: float = 0.001
    train_aux_loss: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    router_input_norm: bool = False
    per_expert_scale: bool = False
    beside_dense_mlp: bool = False

    def __post_init__(self) -> None:
        if self.num_experts < 1 or self.expert_intermediate_size < 1:
            raise ConfigError(f"moe: num_experts ({self.num_experts}) and expert_intermediate_size "
                              f"({self.expert_intermediate_size}) must be positive")
        if not 1 <= self.experts_per_token <= self.num_experts:
            raise ConfigError(f"moe.experts_per_token ({self.experts_per_token}) must be between 1 and num_experts "
                              f"({self.num_experts})")
        if self.router_activation not in ("softmax", "sigmoid"):
            raise ConfigError(f"moe.router_activation {self.router_activation!r} is not 'softmax' or 'sigmoid'")
        if self.expert_activation not in ("silu", "gelu_tanh", "clamped_swiglu"):
            raise ConfigError(f"moe.expert_activation {self.expert_activation!r} is not 'silu', 'gelu_tanh' or "
                              "'clamped_swiglu'")
        if self.shared_expert_gate and not self.shared_expert_intermediate_size:
            raise ConfigError("moe.shared_expert_gate needs a shared expert: set shared_expert_intermediate_size")
        if self.decoder_sparse_step < 1:
            raise ConfigError(f"moe.decoder_sparse_step ({self.decoder_sparse_step}) must be at least 1")
        object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))

    def is_sparse_layer(self, i: int) -> bool:
        """Whether layer i runs the sparse block (else the dense MLP), as transformers' Qwen MoE decides."""
        return i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0

    def block_params(self, hidden_size: int, dense_intermediate_size: int = 0) -> tuple[int, int]:
        """(total, active per token) parameters of one sparse block: the router (with its input scale and per-expert
        scales), the routed experts (k of E active), the shared expert with its gate and, `beside_dense_mlp`, the
        dense gated MLP of width `dense_intermediate_size` and the block's three norms."""
        d, m = hidden_size, self.expert_intermediate_size
        expert = 3 * d * m + ((2 * m + d) if self.expert_bias else 0)
        router = (d * self.num_experts + (self.num_experts if self.router_bias else 0)
                  + (d if self.router_input_norm else 0) + (self.num_experts if self.per_expert_scale else 0))
        shared = 3 * d * self.shared_expert_intermediate_size + (d if self.shared_expert_gate else 0)
        if self.beside_dense_mlp:
            shared += 3 * d * dense_intermediate_size + 3 * d
        return (router + self.num_experts * expert + shared,
                router + self.experts_per_token * expert + shared)


@dataclass(frozen=True)
class LinearAttentionConfig:
    """Gated DeltaNet, the token mixer of Qwen3.5's "linear_attention" layers (`tempax.models.decoder.GatedDeltaNet`):
    a recurrent state of fixed size per value head instead of a growing key/value cache.

    Attributes:
      num_key_heads, key_head_dim: query/key heads and their width (each serves num_value_heads / num_key_heads
        value heads).
      num_value_heads, value_head_dim: value heads and their width.
      conv_kernel: the causal depthwise convolution's kernel over the q/k/v channels.
    """

    num_key_heads: int = 2
    num_value_heads: int = 4
    key_head_dim: int = 16
    value_head_dim: int = 16
    conv_kernel: int = 4

    def __post_init__(self) -> None:
        if min(self.num_key_heads, self.num_value_heads, self.key_head_dim, self.value_head_dim) < 1:
            raise ConfigError("linear_attention: heads and head widths must be positive")
        if self.num_value_heads % self.num_key_heads:
            raise ConfigError(f"linear_attention.num_value_heads ({self.num_value_heads}) must be a multiple of "
                              f"num_key_heads ({self.num_key_heads})")
        if self.conv_kernel < 1:
            raise ConfigError(f"linear_attention.conv_kernel ({self.conv_kernel}) must be at least 1")

    @property
    def conv_channels(self) -> int:
        """Channels of the convolution: queries, keys and values side by side."""
        return 2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim

    def params(self, hidden_size: int) -> int:
        """Parameters of one layer's token mixer."""
        value_dim = self.num_value_heads * self.value_head_dim
        return (hidden_size * (self.conv_channels + value_dim + 2 * self.num_value_heads)  # in_proj_qkv, z, b, a
                + self.conv_channels * self.conv_kernel + 2 * self.num_value_heads + self.value_head_dim
                + value_dim * hidden_size)


@dataclass(frozen=True)
class ModelConfig:
    """Shape and family switches of the decoder.

    Attributes:
      family: informational family name ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3").
      vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, head_dim, intermediate_size: shapes.
      rope: rotary embedding of full-attention layers.
      rope_local: rotary embedding of sliding-window layers (Gemma 3 uses a smaller base); None = same as rope.
      rms_norm_eps: epsilon of every RMSNorm.
      norm_offset: RMSNorm multiplies by (1 + weight) instead of weight (Gemma).
      embed_scale: embeddings are multiplied by sqrt(hidden_size) (Gemma).
      activation: MLP gate activation, "silu" (SwiGLU) or "gelu_tanh" (GeGLU).
      tie_word_embeddings: the LM head reuses the input embedding matrix.
      qkv_bias: q/k/v projections have biases (Qwen2).
      o_bias: the output projection has a bias (Llama with attention_bias=True).
      mlp_bias: MLP projections have biases.
      qk_norm: RMSNorm over head_dim on queries and keys before RoPE (Qwen3, Gemma 3).
      post_norms: Gemma 2/3 sandwich norms (norm after attention and after the MLP, plus a pre-MLP norm).
      attn_logit_softcap: cap * tanh(scores / cap) on attention scores (Gemma 2); None = off.
      final_logit_softcap: the same on the output logits (Gemma 2); None = off.
      query_pre_attn_scalar: attention scale is this ** -0.5 instead of head_dim ** -0.5 (Gemma 2/3).
      sliding_window: window size of "sliding" layers (a key is seen when q_index - k_index < window).
      layer_types: per layer "full" or "sliding"; empty = all full.
      max_position_embeddings: longest context the model was trained for.
      bos_token_id, eos_token_id, pad_token_id: special ids recorded in the HF config.
      param_dtype: dtype the weights are stored in ("float32", "bfloat16").
      dtype: dtype of activations and matmuls.
      remat: per-layer activation recomputation in training: "none", "full" or "dots" (save matmul outputs).
      attention_impl: attention of a forward pass without a KV cache (training, scoring): "tempax" (the einsum
        version, float32 scores, soft-capping, XLA:CPU's bf16 kernels), or `jax.nn.dot_product_attention` as
        "xla" or "cudnn" (cuDNN's fused flash attention on NVIDIA GPUs; no soft-capping). Decoding always uses
        "tempax"'s (its cache layout).
      moe: the sparse mixture-of-experts block of the layers `MoeConfig.is_sparse_layer` picks, in place of the
        dense MLP or beside it (`MoeConfig.beside_dense_mlp`, Gemma 4); None = dense.
      attention_sinks: each attention head has a learned sink logit that joins the softmax's denominator
        (gpt-oss).
      nope_layers: layers without rotary position embedding ("NoPE", SmolLM3: every fourth layer); their rotary
        inverse frequencies are 0, which rotates by nothing.
      pre_norms: RMSNorm on the attention and MLP inputs (input_layernorm and the pre-MLP norm). False with
        `post_norms`: OLMo 2/3's placement, the norms only on the attention and MLP outputs before the residual
        add (x + norm(attn(x)), then x + norm(mlp(x))).
      qk_norm_across_heads: the q/k RMSNorm spans the whole projection (all heads together, weights of size
        num_heads * head_dim and num_kv_heads * head_dim: OLMo 2/3) instead of each head's head_dim.
      partial_rotary_factor: the share of each head's features that rotary embedding rotates (the first
        `rotary_dim` = int(head_dim * factor); the rest pass through unrotated: Phi-3 / Phi-4-mini).
      linear_attention: the Gated DeltaNet of the layers `linear_attention_layers` names (Qwen3.5); None = none.
      linear_attention_layers: layers whose token mixer is `linear_attention` instead of softmax attention (their
        pattern repeats: the decoder scans a block of one period, `layer_block`).
      attn_output_gate: the attention output is multiplied by sigmoid of a per-head gate that q_proj also
        produces (its output is twice as wide, [query | gate] per head: Qwen3.5).
      v_norm: values are RMS-normalised over each head's features, without a weight (Gemma 4).
      attention_k_eq_v: the full-attention layers have no value projection: their values are the key projection's
        output (before the key norm and rotary embedding), RMS-normalised as `v_norm` says (Gemma 4's larger
        models). Their `v_proj` weights exist in tempax's stack (it holds one layer shape) but are neither read nor
        loaded nor exported.
      kv_shared_layers: the last this many layers compute no keys and values of their own: each attends to those of
        the last earlier layer of its kind (full or sliding) that does (Gemma 4's `num_kv_shared_layers`). Their
        `k_proj`, `v_proj` and `k_norm` weights are, as above, kept in the stack but not read, loaded or exported.
      per_layer_input_size: width P of Gemma 4's per-layer inputs ("PLE", `hidden_size_per_layer_input`); 0 = none.
        A second embedding table [per_layer_input_vocab_size, L * P] (scaled by sqrt(P)) and a projection of the
        scaled token embedding [D, L * P] (times D^-0.5, RMS-normalised per layer) are added and scaled by 2^-0.5;
        layer i takes its slice p_i [B, T, P] and adds norm(proj(act(gate(x)) * p_i)) to its output.
      per_layer_input_vocab_size: rows of the per-layer embedding table; 0 = vocab_size.
      layer_scalar: each layer's output is multiplied by a stored per-layer scalar (Gemma 4's `layer_scalar`, a
        buffer in transformers: tempax keeps it as a weight of shape [1] but passes no gradient to it).
      global_head_dim, global_kv_heads: the full-attention layers' head width and key/value heads when they differ
        from head_dim and num_kv_heads (Gemma 4's `global_head_dim`, `num_global_key_value_heads`); 0 = the same.
        The full layers are then a layer stack of their own (`full_attention_config`), scanned a block of the layer
        pattern at a time beside the sliding layers' stack, and every layer's KV cache entry is as large as the
        larger shape (the smaller ones read and write a corner of it).
      wide_shared_mlp: the KV-shared layers' MLP is twice as wide (2 * intermediate_size: Gemma 4's
        `use_double_wide_mlp`); those layers are then stacks of their own ("shared_layers", "shared_full_layers").
    """

    family: str = "llama"
    vocab_size: int = 32000
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 1024
    rope: RopeConfig = field(default_factory=RopeConfig)
    rope_local: RopeConfig | None = None
    rms_norm_eps: float = 1e-5
    norm_offset: bool = False
    embed_scale: bool = False
    activation: Literal["silu", "gelu_tanh"] = "silu"
    tie_word_embeddings: bool = True
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    query_pre_attn_scalar: float | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    max_position_embeddings: int = 2048
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    param_dtype: str = "float32"
    dtype: str = "float32"
    remat: Literal["none", "full", "dots"] = "none"
    attention_impl: Literal["tempax", "xla", "cudnn"] = "tempax"
    moe: MoeConfig | None = None
    attention_sinks: bool = False
    nope_layers: tuple[int, ...] = ()
    pre_norms: bool = True
    qk_norm_across_heads: bool = False
    partial_rotary_factor: float = 1.0
    linear_attention: LinearAttentionConfig | None = None
    linear_attention_layers: tuple[int, ...] = ()
    attn_output_gate: bool = False
    v_norm: bool = False
    attention_k_eq_v: bool = False
    kv_shared_layers: int = 0
    per_layer_input_size: int = 0
    per_layer_input_vocab_size: int = 0
    layer_scalar: bool = False
    global_head_dim: int = 0
    global_kv_heads: int = 0
    wide_shared_mlp: bool = False

    def __post_init__(self) -> None:
        self._check_dense_switches()
        self._check_linear_attention()
        self._check_gemma4_switches()
        if self.attention_impl not in ("tempax", "xla", "cudnn"):
            raise ConfigError(f"attention_impl {self.attention_impl!r} is not 'tempax', 'xla' or 'cudnn'")
        if self.attention_impl != "tempax" and self.attn_logit_softcap is not None:
            raise ConfigError(
                f"attention_impl={self.attention_impl!r} has no attention logit soft-capping, which this model "
                f"uses (attn_logit_softcap={self.attn_logit_softcap}); use attention_impl='tempax'")
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise CheckpointError(
                f"layer_types has {len(self.layer_types)} entries but the model has {self.num_layers} layers"
            )
        for t in self.layer_types:
            if t not in ("full", "sliding"):
                raise CheckpointError(f"layer type {t!r} is not 'full' or 'sliding'")
        if "sliding" in self.layer_types and not self.sliding_window:
            raise CheckpointError("sliding layers need a sliding_window size")
        if self.attention_sinks and self.attention_impl != "tempax":
            raise ConfigError(f"attention_impl={self.attention_impl!r} has no attention sinks, which this model uses "
                              "(attention_sinks=True, gpt-oss); use attention_impl='tempax'")
        if self.moe is not None:
            outside = [i for i in self.moe.mlp_only_layers if not 0 <= i < self.num_layers]
            if outside:
                raise CheckpointError(f"moe.mlp_only_layers {outside} are not layers of a {self.num_layers}-layer "
                                      "model")
            if self.moe.beside_dense_mlp and (not self.post_norms or not self.pre_norms or self.mlp_bias):
                raise ConfigError("moe.beside_dense_mlp (Gemma 4's sparse block beside the MLP) needs post_norms=True "
                                  "and pre_norms=True (the dense MLP reads the pre-MLP norm's output, the sum of the "
                                  "two sides is normed before the residual add) and mlp_bias=False")

    # ----------------------------------------------------------------------------------------------------------
    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def layer_type(self, i: int) -> str:
        return self.layer_types[i] if self.layer_types else "full"

    def rope_for(self, i: int) -> RopeConfig:
        if self.layer_type(i) == "sliding" and self.rope_local is not None:
            return self.rope_local
        return self.rope

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer i's feed-forward block is the sparse mixture of experts (else the dense MLP)."""
        return self.moe is not None and self.moe.is_sparse_layer(i)

    def mixed_feed_forward_error(self) -> str | None:
        """Why the decoder cannot be built from this config when its MoE settings mix dense and sparse layers, or
        None. The decoder runs one layer's code over weights stacked on a "layers" axis (`jax.lax.scan`), so every
        layer must hold the same feed-forward block; `moe.mlp_only_layers` and `moe.decoder_sparse_step` > 1 (Qwen
        MoE's switches, unused by its released checkpoints) would make some layers dense."""
        if self.moe is None:
            return None
        dense = [i for i in range(self.num_layers) if not self.is_moe_layer(i)]
        if not dense:
            return None
        return (f"moe.mlp_only_layers={list(self.moe.mlp_only_layers)} and moe.decoder_sparse_step="
                f"{self.moe.decoder_sparse_step} make layers {dense[:8]}{'...' if len(dense) > 8 else ''} dense while "
                "others are sparse; tempax's decoder scans one layer kind over the stack, so a model mixes no dense "
                "and sparse layers: set mlp_only_layers to [] and decoder_sparse_step to 1 (every layer sparse)")

    @property
    def attn_scale(self) -> float:
        base = self.query_pre_attn_scalar if self.query_pre_attn_scalar else self.head_dim
        return float(base) ** -0.5

    @property
    def rotary_dim(self) -> int:
        """Features of each head that rotary embedding rotates (all of them unless `partial_rotary_factor` < 1)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def _check_linear_attention(self) -> None:
        object.__setattr__(self, "linear_attention_layers",
                           tuple(sorted(int(i) for i in self.linear_attention_layers)))
        if self.linear_attention_layers and self.linear_attention is None:
            raise ConfigError("linear_attention_layers are set but linear_attention is not: give the Gated DeltaNet's "
                              "heads (linear_attention.num_key_heads, ...)")
        outside = [i for i in self.linear_attention_layers if not 0 <= i < self.num_layers]
        if outside:
            raise ConfigError(f"linear_attention_layers {outside} are not layers of a {self.num_layers}-layer model")
        if len(self.linear_attention_layers) == self.num_layers:
            raise ConfigError("every layer is a linear-attention layer; tempax's hybrid decoder needs at least one "
                              "softmax-attention layer (Qwen3.5 has one in every four)")

    def _check_gemma4_switches(self) -> None:
        """ConfigError naming the field when the KV-sharing or per-layer-input switches are inconsistent."""
        if not 0 <= self.kv_shared_layers < self.num_layers:
            raise ConfigError(f"kv_shared_layers ({self.kv_shared_layers}) must be at least 0 and less than "
                              f"num_layers ({self.num_layers}): some earlier layer must compute the shared keys")
        if self.kv_shared_layers:
            first = self.num_layers - self.kv_shared_layers
            producing = {self.layer_type(i) for i in range(first)}
            consuming = {self.layer_type(i) for i in range(first, self.num_layers)}
            if not consuming <= producing:
                raise ConfigError(f"kv_shared_layers={self.kv_shared_layers}: layers of kind "
                                  f"{sorted(consuming - producing)} reuse keys and values that no earlier layer of "
                                  "their kind computes")
        if self.global_head_dim < 0 or self.global_kv_heads < 0:
            raise ConfigError("global_head_dim and global_kv_heads must not be negative (0 = head_dim, num_kv_heads)")
        if self.global_kv_heads and self.num_heads % self.global_kv_heads:
            raise CheckpointError(f"num_heads ({self.num_heads}) must be a multiple of global_kv_heads "
                                  f"({self.global_kv_heads})")
        if self.wide_shared_mlp and not self.kv_shared_layers:
            raise ConfigError("wide_shared_mlp widens the KV-shared layers' MLP; set kv_shared_layers too")
        if self.per_layer_input_size < 0 or self.per_layer_input_vocab_size < 0:
            raise ConfigError("per_layer_input_size and per_layer_input_vocab_size must not be negative")
        uses = [name for name, on in (("v_norm", self.v_norm), ("attention_k_eq_v", self.attention_k_eq_v),
                                      ("kv_shared_layers", self.kv_shared_layers),
                                      ("per_layer_input_size", self.per_layer_input_size),
                                      ("layer_scalar", self.layer_scalar)) if on]
        if uses and self.linear_attention_layers:
            raise ConfigError(f"{', '.join(uses)} (Gemma 4's) cannot be combined with linear_attention_layers")

    @property
    def full_attention_differs(self) -> bool:
        """Whether the full-attention layers have another attention shape than the sliding ones (and hence a layer
        stack of their own)."""
        return (bool(self.layer_types) and "sliding" in self.layer_types and "full" in self.layer_types
                and (self.global_head_dim not in (0, self.head_dim)
                     or self.global_kv_heads not in (0, self.num_kv_heads)))

    def full_attention_config(self) -> "ModelConfig":
        """This config with the full-attention layers' attention shape (what their `DecoderLayer`s are built
        from); itself when they have no shape of their own."""
        if not self.full_attention_differs:
            return self
        return self.replace(head_dim=self.global_head_dim or self.head_dim,
                            num_kv_heads=self.global_kv_heads or self.num_kv_heads, global_head_dim=0,
                            global_kv_heads=0)

    @property
    def cache_shape(self) -> tuple[int, int]:
        """(KV heads, head width) of every layer's KV cache entry: the larger of the two attention shapes."""
        full = self.full_attention_config()
        return max(self.num_kv_heads, full.num_kv_heads), max(self.head_dim, full.head_dim)

    def stack_name(self, i: int) -> str:
        """The layer stack that holds layer i (`layer_stacks`)."""
        if self.is_linear_attention_layer(i):
            return "linear_layers"
        full = self.full_attention_differs and self.layer_type(i) == "full"
        wide = self.wide_shared_mlp and self.kv_reused(i)
        return ("shared_" if wide else "") + ("full_layers" if full else "layers")

    def layer_stacks(self) -> dict[str, tuple[int, ...]]:
        """The decoder's layer stacks and the model layers each holds, in order (each stack is one layer shape,
        its weights stacked): "layers" (the softmax-attention layers, or of Gemma 4's the sliding ones when the full
        ones have a shape of their own, and not the KV-shared ones when their MLP is wider), "linear_layers"
        (Qwen3.5's), "full_layers" (full layers of their own shape), "shared_layers" and "shared_full_layers"
        (KV-shared layers of a `wide_shared_mlp`)."""
        members: dict[str, list[int]] = {name: [] for name in LAYER_STACKS}
        for i in range(self.num_layers):
            members[self.stack_name(i)].append(i)
        return {name: tuple(found) for name, found in members.items() if found or name == "layers"}

    def stack_config(self, name: str) -> "ModelConfig":
        """The config the `DecoderLayer`s of stack `name` are built from: the full layers' attention shape, the
        KV-shared layers' wider MLP."""
        cfg = self.full_attention_config() if name.endswith("full_layers") else self
        if name.startswith("shared_"):
            cfg = cfg.replace(intermediate_size=2 * self.intermediate_size)
        return cfg

    def kind_block(self) -> tuple[str, ...]:
        """The shortest block of layer kinds ("full", "sliding") whose repetition gives the stack (the whole stack
        when the pattern does not repeat)."""
        kinds = [self.layer_type(i) for i in range(self.num_layers)]
        for period in range(1, self.num_layers + 1):
            if self.num_layers % period == 0 and all(kinds[i] == kinds[i % period] for i in range(self.num_layers)):
                return tuple(kinds[:period])
        return tuple(kinds)

    def kv_reused(self, i: int) -> bool:
        """Whether layer i attends to an earlier layer's keys and values (`kv_shared_layers`)."""
        return i >= self.num_layers - self.kv_shared_layers if self.kv_shared_layers else False

    def values_from_keys(self, i: int) -> bool:
        """Whether layer i's values are its key projection's output (`attention_k_eq_v`, full layers only)."""
        return self.attention_k_eq_v and self.layer_type(i) == "full"

    def is_linear_attention_layer(self, i: int) -> bool:
        return i in self.linear_attention_layers

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers with softmax attention (and a key/value cache): all but `linear_attention_layers`."""
        return tuple(i for i in range(self.num_layers) if i not in self.linear_attention_layers)

    def layer_block(self) -> tuple[bool, ...]:
        """The shortest block of layers whose repetition gives the stack, each entry whether that layer is a
        linear-attention one (the whole stack when the pattern does not repeat). (False,) for a plain decoder."""
        linear = [self.is_linear_attention_layer(i) for i in range(self.num_layers)]
        for period in range(1, self.num_layers + 1):
            if self.num_layers % period == 0 and all(linear[i] == linear[i % period] for i in range(self.num_layers)):
                return tuple(linear[:period])
        return tuple(linear)  # not reached: the whole stack is a period

    def _check_dense_switches(self) -> None:
        """ConfigError naming the field when NoPE layers, norm placement or partial rotary are inconsistent."""
        outside = [i for i in self.nope_layers if not 0 <= i < self.num_layers]
        if outside:
            raise ConfigError(f"nope_layers {outside} are not layers of a {self.num_layers}-layer model")
        object.__setattr__(self, "nope_layers", tuple(sorted(int(i) for i in self.nope_layers)))
        if not self.pre_norms and not self.post_norms:
            raise ConfigError("pre_norms=False leaves the layers without any norm; set post_norms=True (OLMo 2's "
                              "placement) or keep pre_norms")
        if self.qk_norm_across_heads and not self.qk_norm:
            raise ConfigError("qk_norm_across_heads=True needs qk_norm=True")
        for rope in (self.rope, self.rope_local):
            pairs = self.rotary_dim // 2
            if rope is not None and rope.scaling == "longrope" and not (
                    len(rope.short_factor) == len(rope.long_factor) == pairs):
                raise ConfigError(f"longrope short_factor and long_factor have {len(rope.short_factor)} and "
                                  f"{len(rope.long_factor)} entries; the rotary dimension {self.rotary_dim} needs "
                                  f"{pairs} each")
        if not 0.0 < self.partial_rotary_factor <= 1.0 or self.rotary_dim % 2 or not self.rotary_dim:
            raise ConfigError(f"partial_rotary_factor={self.partial_rotary_factor} gives {self.rotary_dim} rotated "
                              f"features of head_dim {self.head_dim}; it must be in (0, 1] and give an even, "
                              "positive count")

    def num_params(self, *, active: bool = False) -> int:
        """Parameter count; a tied embedding/LM-head matrix is counted once. `active`: a mixture of experts counts
        only the k routed experts a token passes through (the "active parameters" of an MoE model card)."""
        d, n = self.hidden_size, self.num_heads

        def attention(h: int, k: int) -> int:
            attn = d * n * h + 2 * d * k * h + n * h * d
            if self.qkv_bias:
                attn += n * h + 2 * k * h
            if self.o_bias:
                attn += d
            if self.qk_norm:
                attn += (n + k) * h if self.qk_norm_across_heads else 2 * h
            if self.attention_sinks:
                attn += n
            if self.attn_output_gate:
                attn += d * n * h
            return attn

        full = self.full_attention_config()
        attn, full_attn = attention(self.head_dim, self.num_kv_heads), attention(full.head_dim, full.num_kv_heads)
        mlp = 3 * d * self.intermediate_size
        if self.mlp_bias:
            mlp += 2 * self.intermediate_size + d
        norms = (2 * self.pre_norms + 2 * self.post_norms) * d  # pre: before attention and MLP; post: after
        mixer = lambda i: (self.linear_attention.params(d) if self.is_linear_attention_layer(i)  # noqa: E731
                           else full_attn if self.layer_type(i) == "full" else attn)
        width = lambda i: 2 if self.wide_shared_mlp and self.kv_reused(i) else 1  # noqa: E731
        # a sparse block beside the dense MLP (Gemma 4) holds that MLP: its width is the layer's
        sparse = lambda i: self.moe.block_params(  # noqa: E731
            d, width(i) * self.intermediate_size)[1 if active else 0] if self.moe is not None else 0
        layers = sum(mixer(i) + norms + (sparse(i) if self.is_moe_layer(i) else width(i) * mlp)
                     for i in range(self.num_layers))
        if self.per_layer_input_size:  # per layer: gate, projection, norm; once: table, projection, norm
            p = self.per_layer_input_size
            layers += self.num_layers * (2 * d * p + d)
            layers += (self.per_layer_input_vocab_size or self.vocab_size) * self.num_layers * p
            layers += d * self.num_layers * p + p
        if self.layer_scalar:
            layers += self.num_layers
        embed = self.vocab_size * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return layers + embed + head + d

    # ----------------------------------------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, hf: dict[str, Any], *, source: str = "config.json") -> "ModelConfig":
        """Builds the config from a Hugging Face `config.json` dictionary."""
        if "text_config" in hf and hf.get("model_type") in ("gemma3",):
            hf = {**hf["text_config"], "model_type": "gemma3_text"}
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise CheckpointError(
                f"{source}: unsupported architecture model_type={model_type!r} "
                f"(architectures={hf.get('architectures')}). tempax supports: {', '.join(SUPPORTED_MODEL_TYPES)}."
            )
        try:
            if model_type in QWEN3_5_MODEL_TYPES:
                return _qwen3_5_from_hf(hf, model_type)
            if model_type in GEMMA4_MODEL_TYPES:
                return _gemma4_from_hf(hf, model_type, source)
            if model_type in DENSE_FAMILY_TYPES:
                hf = _dense_family_hf(hf, model_type)
                return _dense_family_from_hf(_from_hf(hf, model_type), hf)
            return _from_hf(hf, model_type)
        except KeyError as e:
            raise CheckpointError(f"{source}: required key {e.args[0]!r} is missing for model_type={model_type!r}")

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "ModelConfig":
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise CheckpointError(f"config.json not found: {path}. A Hugging Face checkpoint folder needs one.")
        try:
            with open(path) as f:
                hf = json.load(f)
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path} is not valid JSON: {e}") from e
        return cls.from_hf_config(hf, source=path)

    def to_hf_config(self) -> dict[str, Any]:
        """A `config.json` dictionary that `transformers` loads into the matching *ForCausalLM class."""
        if self.family in ("qwen3_5", "qwen3_5_moe"):
            return _qwen3_5_to_hf(self)
        if self.family == "gemma4":
            return _gemma4_to_hf(self)
        gemma4 = [f"{k}={getattr(self, k)!r}" for k in ("v_norm", "attention_k_eq_v", "kv_shared_layers",
                                                        "per_layer_input_size", "layer_scalar", "global_head_dim",
                                                        "global_kv_heads", "wide_shared_mlp") if getattr(self, k)]
        proportional = any(r is not None and r.scaling == "proportional" for r in (self.rope, self.rope_local))
        if gemma4 or proportional:
            what = ", ".join(gemma4) or "proportional rope"
            raise CheckpointError(f"a {self.family} config.json cannot express {what} (Gemma 4's); export the model "
                                  "with family gemma4")
        if self.linear_attention_layers or self.attn_output_gate:
            raise CheckpointError(f"a {self.family} config.json cannot express linear_attention_layers or "
                                  "attn_output_gate (Qwen3.5's); export the model with family qwen3_5")
        if self.family in DENSE_FAMILY_TYPES:
            return _dense_family_to_hf(self, _to_hf(self))
        _dense_switches_unset(self)
        return _to_hf(self)


# --------------------------------------------------------------------------------------------------------------
_ARCH = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "olmo3": "Olmo3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen3_5": "Qwen3_5ForCausalLM",
    "qwen3_5_moe": "Qwen3_5MoeForCausalLM",
    "gemma4": "Gemma4ForCausalLM",
}


def _rope_from_params(p: dict[str, Any] | None, default_theta: float) -> RopeConfig:
    if not p:
        return RopeConfig(theta=default_theta)
    theta = float(p.get("rope_theta", default_theta))
    kind = p.get("rope_type", p.get("type", "default"))
    if kind in (None, "default"):
        return RopeConfig(theta=theta)
    if kind == "linear":
        return RopeConfig(theta=theta, scaling="linear", factor=float(p["factor"]))
    if kind == "llama3":
        return RopeConfig(
            theta=theta,
            scaling="llama3",
            factor=float(p["factor"]),
            low_freq_factor=float(p.get("low_freq_factor", 1.0)),
            high_freq_factor=float(p.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(p.get("original_max_position_embeddings", 8192)),
        )
    if kind == "yarn":
        if p.get("mscale") or p.get("mscale_all_dim"):
            raise CheckpointError("yarn rope with mscale / mscale_all_dim (DeepSeek's form) is not supported")
        factor = float(p["factor"])
        attention_factor = p.get("attention_factor")
        return RopeConfig(
            theta=theta,
            scaling="yarn",
            factor=factor,
            original_max_position_embeddings=int(p["original_max_position_embeddings"]),
            beta_fast=float(p.get("beta_fast") or 32.0),
            beta_slow=float(p.get("beta_slow") or 1.0),
            truncate=bool(p.get("truncate", True)),
            attention_factor=None if attention_factor is None else float(attention_factor),
        )
    if kind == "proportional":
        return RopeConfig(theta=theta, scaling="proportional", factor=float(p.get("factor", 1.0)),
                          rotated_fraction=float(p.get("partial_rotary_factor", 1.0)))
    if kind == "longrope":
        attention_factor = p.get("attention_factor")
        return RopeConfig(
            theta=theta,
            scaling="longrope",
            factor=float(p["factor"]),
            original_max_position_embeddings=int(p["original_max_position_embeddings"]),
            attention_factor=None if attention_factor is None else float(attention_factor),
            short_factor=tuple(float(f) for f in p["short_factor"]),
            long_factor=tuple(float(f) for f in p["long_factor"]),
        )
    raise CheckpointError(f"rope type {kind!r} is not supported (supported: default, linear, llama3, yarn, "
                          "longrope)")


def _ropes(hf: dict[str, Any]) -> tuple[RopeConfig, RopeConfig | None]:
    """Reads rope settings from either transformers-5 `rope_parameters` or the older keys."""
    params = hf.get("rope_parameters")
    theta = float(hf.get("rope_theta", 10000.0))
    if params and ("full_attention" in params or "sliding_attention" in params):
        full = _rope_from_params(params.get("full_attention"), theta)
        local = params.get("sliding_attention")
        return full, (_rope_from_params(local, 10000.0) if local else None)
    if params:
        full = _rope_from_params(params, theta)
    else:
        scaling = hf.get("rope_scaling")
        full = _rope_from_params({**(scaling or {}), "rope_theta": theta}, theta)
    local_theta = hf.get("rope_local_base_freq")
    local = RopeConfig(theta=float(local_theta)) if local_theta is not None else None
    return full, local


def _layer_types(hf: dict[str, Any], model_type: str, num_layers: int) -> tuple[str, ...]:
    names = hf.get("layer_types")
    if names:
        return tuple("sliding" if "sliding" in t else "full" for t in names)
    if model_type == "gemma2":
        return tuple("sliding" if i % 2 == 0 else "full" for i in range(num_layers))
    if model_type == "gemma3_text":
        pattern = int(hf.get("sliding_window_pattern", hf.get("_sliding_window_pattern", 6)))
        return tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers))
    if model_type in ("qwen2", "qwen3", "mistral") and hf.get("use_sliding_window", model_type == "mistral"):
        window = hf.get("sliding_window")
        if window:
            max_window_layers = int(hf.get("max_window_layers", num_layers))
            return tuple("sliding" if i >= max_window_layers or model_type == "mistral" else "full"
                         for i in range(num_layers))
    # Mixtral windows every layer when sliding_window is set; Qwen3-MoE every layer when use_sliding_window is.
    if (model_type == "mixtral" or (model_type == "qwen3_moe" and hf.get("use_sliding_window"))) and \
            hf.get("sliding_window"):
        return ("sliding",) * num_layers
    return ()


def _moe_from_hf(hf: dict[str, Any], model_type: str) -> MoeConfig | None:
    """The `MoeConfig` of a Qwen2-MoE, Qwen3-MoE, Mixtral or gpt-oss `config.json` (transformers names the expert
    count `num_experts` in Qwen's configs and `num_local_experts` in the others, and accepts either). Qwen2-MoE adds
    a shared expert of `shared_expert_intermediate_size` behind a sigmoid gate in every sparse block."""
    if model_type not in MOE_MODEL_TYPES:
        return None
    num_experts = int(hf["num_experts"] if "num_experts" in hf else hf["num_local_experts"])
    common = dict(
        num_experts=num_experts,
        experts_per_token=int(hf["num_experts_per_tok"]),
        router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.001)),
        train_aux_loss=bool(hf.get("output_router_logits", False)),
    )
    if model_type in _QWEN_MOE:
        shared = int(hf["shared_expert_intermediate_size"]) if model_type == "qwen2_moe" else 0
        if model_type == "qwen2_moe" and shared < 1:
            raise CheckpointError(f"qwen2_moe shared_expert_intermediate_size={shared}: Qwen2-MoE's sparse block "
                                  "always has a shared expert; give its width (a positive integer)")
        return MoeConfig(
            **common,
            expert_intermediate_size=int(hf["moe_intermediate_size"]),
            normalize_top_k=bool(hf.get("norm_topk_prob", False)),
            decoder_sparse_step=int(hf.get("decoder_sparse_step", 1)),
            mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()),
            shared_expert_intermediate_size=shared,
            shared_expert_gate=model_type == "qwen2_moe",
        )
    if model_type == "mixtral":
        return MoeConfig(**common, expert_intermediate_size=int(hf["intermediate_size"]), normalize_top_k=True)
    return MoeConfig(  # gpt_oss: softmax over the top-k logits is the renormalised top-k of the softmax
        **common,
        expert_intermediate_size=int(hf["intermediate_size"]),
        normalize_top_k=True,
        router_bias=True,
        expert_bias=True,
        expert_activation="clamped_swiglu",
        swiglu_alpha=float(hf.get("swiglu_alpha", 1.702)),
        swiglu_limit=float(hf.get("swiglu_limit", 7.0)),
    )


def _qwen2_moe_check(hf: dict[str, Any], layer_types: tuple[str, ...]) -> None:
    """CheckpointError for a Qwen2-MoE config.json with sliding-window attention: transformers' versions disagree on
    which of its layers slide (and whether a mask or only flash attention applies the window), and its released
    checkpoints (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B) set use_sliding_window false."""
    if hf.get("use_sliding_window") or "sliding" in layer_types:
        raise CheckpointError("qwen2_moe with use_sliding_window=true (or sliding layer_types) is not supported: "
                              "tempax reads Qwen2-MoE with full attention in every layer, as its released "
                              "checkpoints use it; set use_sliding_window to false")


def _qwen2_moe_export_check(c: ModelConfig) -> None:
    """CheckpointError when a qwen2_moe config has switches Qwen2-MoE's config.json cannot state."""
    differ = [f"{k}={getattr(c, k)!r}" for k, v in (("o_bias", False), ("qk_norm", False), ("mlp_bias", False),
                                                      ("layer_types", ())) if getattr(c, k) != v]
    if differ:
        raise CheckpointError(f"a qwen2_moe config.json cannot express {', '.join(differ)}; export it as another "
                              "family or keep Qwen2-MoE's settings")


def _from_hf(hf: dict[str, Any], model_type: str) -> ModelConfig:
    hidden = int(hf["hidden_size"])
    heads = int(hf["num_attention_heads"])
    num_layers = int(hf["num_hidden_layers"])
    head_dim = int(hf.get("head_dim") or hidden // heads)
    rope, rope_local = _ropes(hf)
    gemma = model_type.startswith("gemma")
    family = {"gemma3_text": "gemma3", "mistral": "llama"}.get(model_type, model_type)
    if model_type in MOE_MODEL_TYPES and hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{model_type} with hidden_act={hf.get('hidden_act')!r} is not supported (silu)")
    layer_types = _layer_types(hf, model_type, num_layers)
    if model_type == "qwen2_moe":
        _qwen2_moe_check(hf, layer_types)
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
    if act in ("gelu_pytorch_tanh", "gelu_tanh", "gelu"):
        # Gemma checkpoints say "gelu" but were trained with the tanh approximation (as transformers does).
        activation = "gelu_tanh"
    elif act == "silu":
        activation = "silu"
    else:
        raise CheckpointError(f"activation {act!r} is not supported (silu, gelu_pytorch_tanh)")
    attention_bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        family=family,
        vocab_size=int(hf["vocab_size"]),
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        intermediate_size=int(hf["intermediate_size"]),
        rope=rope,
        rope_local=rope_local,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        norm_offset=gemma,
        embed_scale=gemma,
        activation=activation,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", gemma)),
        # Qwen2 always has q/k/v biases; Qwen2-MoE too unless its config (transformers 5's `qkv_bias`) says not.
        qkv_bias=(model_type == "qwen2" or attention_bias
                  or (model_type == "qwen2_moe" and bool(hf.get("qkv_bias", True)))),
        o_bias=attention_bias and model_type not in ("qwen2", "qwen2_moe"),
        mlp_bias=bool(hf.get("mlp_bias", False)),
        qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3_text"),
        post_norms=model_type in ("gemma2", "gemma3_text"),
        attn_logit_softcap=hf.get("attn_logit_softcapping") if model_type == "gemma2" else None,
        final_logit_softcap=hf.get("final_logit_softcapping") if model_type in ("gemma2", "gemma3_text") else None,
        query_pre_attn_scalar=(
            float(hf["query_pre_attn_scalar"]) if model_type in ("gemma2", "gemma3_text") else None
        ),
        sliding_window=int(hf["sliding_window"]) if layer_types and "sliding" in layer_types else None,
        layer_types=layer_types if "sliding" in layer_types else (),
        max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
        pad_token_id=hf.get("pad_token_id"),
        moe=_moe_from_hf(hf, model_type),
        attention_sinks=model_type == "gpt_oss",
        # Phi-3's alone among these (transformers 5 keeps it in rope_parameters, older configs at the top level)
        partial_rotary_factor=float((hf.get("rope_parameters") or {}).get("partial_rotary_factor")
                                    or hf.get("partial_rotary_factor") or 1.0) if model_type == "phi3" else 1.0,
    )


def _rope_params(r: RopeConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_theta": r.theta, "rope_type": r.scaling or "default"}
    if r.scaling and (r.scaling != "proportional" or r.factor != 1.0):  # transformers warns of a proportional 1
        out["factor"] = r.factor
    if r.scaling == "llama3":
        out.update(
            low_freq_factor=r.low_freq_factor,
            high_freq_factor=r.high_freq_factor,
            original_max_position_embeddings=r.original_max_position_embeddings,
        )
    if r.scaling == "yarn":
        out.update(
            original_max_position_embeddings=r.original_max_position_embeddings,
            beta_fast=r.beta_fast,
            beta_slow=r.beta_slow,
            truncate=r.truncate,
        )
        if r.attention_factor is not None:
            out["attention_factor"] = r.attention_factor
    if r.scaling == "proportional":
        out["partial_rotary_factor"] = r.rotated_fraction
    if r.scaling == "longrope":
        out.update(original_max_position_embeddings=r.original_max_position_embeddings,
                   short_factor=list(r.short_factor), long_factor=list(r.long_factor))
        if r.attention_factor is not None:
            out["attention_factor"] = r.attention_factor
    return out


def _moe_to_hf(c: ModelConfig) -> dict[str, Any]:
    """The mixture-of-experts keys of a Qwen2-MoE, Qwen3-MoE, Mixtral or gpt-oss `config.json` (inverse of
    `_moe_from_hf`)."""
    moe = c.moe
    if moe is None:
        raise CheckpointError(f"a {c.family} config needs its moe settings (ModelConfig.moe is None)")
    expected = _moe_from_hf({"num_experts": moe.num_experts, "num_experts_per_tok": moe.experts_per_token,
                             "intermediate_size": moe.expert_intermediate_size,
                             "moe_intermediate_size": moe.expert_intermediate_size,
                             "norm_topk_prob": moe.normalize_top_k,
                             "shared_expert_intermediate_size": moe.shared_expert_intermediate_size}, c.family)
    fixed = ("router_activation", "routed_scaling", "router_bias", "expert_bias", "expert_activation",
             "shared_expert_intermediate_size", "shared_expert_gate")
    differ = [f for f in fixed if getattr(moe, f) != getattr(expected, f)]
    if c.family not in _QWEN_MOE:
        differ += [f for f in ("decoder_sparse_step", "mlp_only_layers") if getattr(moe, f) != getattr(expected, f)]
    if differ:
        raise CheckpointError(f"a {c.family} config.json cannot express moe settings {', '.join(differ)} different "
                              f"from the family's; export it as another family or keep the family's values")
    hf: dict[str, Any] = {
        "num_experts_per_tok": moe.experts_per_token,
        "router_aux_loss_coef": moe.router_aux_loss_coef,
        "output_router_logits": moe.train_aux_loss,
    }
    if c.family in _QWEN_MOE:
        hf.update(num_experts=moe.num_experts, moe_intermediate_size=moe.expert_intermediate_size,
                  norm_topk_prob=moe.normalize_top_k, decoder_sparse_step=moe.decoder_sparse_step,
                  mlp_only_layers=list(moe.mlp_only_layers))
        if c.family == "qwen2_moe":
            hf["shared_expert_intermediate_size"] = moe.shared_expert_intermediate_size
        return hf
    if not moe.normalize_top_k:
        raise CheckpointError(f"{c.family} always renormalises the top-k router weights (moe.normalize_top_k)")
    hf.update(num_local_experts=moe.num_experts, intermediate_size=moe.expert_intermediate_size)
    if c.family == "gpt_oss":
        hf.update(swiglu_alpha=moe.swiglu_alpha, swiglu_limit=moe.swiglu_limit)
    else:
        hf["router_jitter_noise"] = 0.0
    return hf


def _shape_keys(c: ModelConfig, arch: str, model_type: str) -> dict[str, Any]:
    """The keys every exported config.json starts with: the class, the model type and the shapes."""
    return {"architectures": [arch], "model_type": model_type, "vocab_size": c.vocab_size,
            "hidden_size": c.hidden_size, "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim}


def _to_hf(c: ModelConfig) -> dict[str, Any]:
    model_type = {"gemma3": "gemma3_text"}.get(c.family, c.family)
    arch = _ARCH.get(c.family)
    if arch is None:
        raise CheckpointError(f"cannot export family {c.family!r} to a Hugging Face config")
    hf: dict[str, Any] = {
        **_shape_keys(c, arch, model_type),
        "intermediate_size": c.intermediate_size,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "torch_dtype": c.param_dtype,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_id,
        "pad_token_id": c.pad_token_id,
    }
    act = "silu" if c.activation == "silu" else "gelu_pytorch_tanh"
    if c.family.startswith("gemma"):
        hf["hidden_activation"] = act
    hf["hidden_act"] = act
    if c.family in ("llama", "mistral"):
        hf["attention_bias"] = c.qkv_bias
        hf["mlp_bias"] = c.mlp_bias
    if c.family in ("qwen3_moe", "gpt_oss"):
        hf["attention_bias"] = c.qkv_bias
    if c.family == "qwen2_moe":
        _qwen2_moe_export_check(c)
        hf["qkv_bias"] = c.qkv_bias
    if c.family in MOE_MODEL_TYPES:
        hf.update(_moe_to_hf(c))
    if c.layer_types and c.family == "gemma3":
        local = c.rope_local or c.rope
        hf["rope_parameters"] = {"full_attention": _rope_params(c.rope), "sliding_attention": _rope_params(local)}
    else:
        hf["rope_parameters"] = _rope_params(c.rope)
    if c.layer_types:
        hf["layer_types"] = ["sliding_attention" if t == "sliding" else "full_attention" for t in c.layer_types]
        hf["sliding_window"] = c.sliding_window
        if c.family in ("qwen2", "qwen3", "mistral", "qwen3_moe"):
            hf["use_sliding_window"] = True
    elif c.family in ("qwen2", "qwen3", "qwen3_moe", "qwen2_moe"):
        hf["use_sliding_window"] = False
    elif c.family == "mixtral":
        hf["sliding_window"] = None
    if c.family in ("gemma2", "gemma3"):
        hf["query_pre_attn_scalar"] = c.query_pre_attn_scalar or c.head_dim
        hf["final_logit_softcapping"] = c.final_logit_softcap
        if c.family == "gemma2":
            hf["attn_logit_softcapping"] = c.attn_logit_softcap
    return hf


# --------------------------------------------------------------------------------------------------------------
# SmolLM3, OLMo 2/3 and Phi-3: Llama's decoder with NoPE layers (SmolLM3), norms after the attention and MLP outputs
# and a q/k norm over the whole projection (OLMo 2; OLMo 3 adds sliding windows), or partial rotary embedding
# (Phi-3, whose fused qkv_proj / gate_up_proj exist only in its checkpoint files: `tempax.models.fused`).

DENSE_FAMILY_TYPES = ("smollm3", "olmo2", "olmo3", "phi3")
_OLMO = ("olmo2", "olmo3")

# transformers' values for the keys a config.json of these families may leave out.
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "smollm3": {"rope_theta": 2000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True},
    "olmo2": {"rope_theta": 10000.0, "rms_norm_eps": 1e-5},
    "olmo3": {"rope_theta": 500000.0, "rms_norm_eps": 1e-5, "sliding_window": 4096},
    "phi3": {"rope_theta": 10000.0, "rms_norm_eps": 1e-5},
}


def _dense_family_hf(hf: dict[str, Any], model_type: str) -> dict[str, Any]:
    """`hf` with the family's defaults for missing keys (and Phi-3's LongRoPE in the generic form)."""
    defaults = {k: v for k, v in _FAMILY_DEFAULTS[model_type].items() if hf.get(k) is None}
    hf = {**hf, **defaults}
    return _phi3_longrope(hf) if model_type == "phi3" else hf


def _phi3_longrope(hf: dict[str, Any]) -> dict[str, Any]:
    """A Phi-3 config.json's LongRoPE in the form `_rope_from_params` reads, as transformers reads it: the older
    names "su" and "yarn" (which Phi-3 configs used for LongRoPE) become "longrope", the original context comes
    from the top-level key when the rope dictionary lacks it, and a missing factor is max_position_embeddings over
    that original context."""
    key = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    params = dict(hf.get(key) or {})
    if params.get("rope_type", params.get("type")) not in ("su", "yarn", "longrope"):
        return hf
    params.pop("type", None)
    original = int(params.get("original_max_position_embeddings") or hf.get("original_max_position_embeddings")
                   or 4096)
    params.update(rope_type="longrope", original_max_position_embeddings=original)
    if params.get("factor") is None:
        params["factor"] = int(hf.get("max_position_embeddings") or 4096) / original
    return {**hf, key: params}


def _dense_family_from_hf(cfg: ModelConfig, hf: dict[str, Any]) -> ModelConfig:
    """The family switches of a SmolLM3, OLMo 2/3 or Phi-3 config.json on top of the generic reading `cfg`."""
    model_type, n = hf["model_type"], cfg.num_layers
    changes: dict[str, Any] = {}
    if model_type == "smollm3":
        # no_rope_layers: 1 = this layer uses rope, 0 = NoPE; absent, every no_rope_layer_interval-th layer is NoPE.
        interval = int(hf.get("no_rope_layer_interval") or 4)
        flags = hf.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
        if len(flags) < n:
            raise CheckpointError(f"no_rope_layers has {len(flags)} entries for {n} layers")
        nope = tuple(i for i in range(n) if not flags[i])
        kinds: tuple[str, ...] = ()
        window = hf.get("sliding_window")
        if hf.get("use_sliding_window") and window:  # transformers windows the layers layer_types names (NoPE ones)
            names = hf.get("layer_types")
            kinds = (tuple("sliding" if "sliding" in t else "full" for t in names) if names
                     else tuple("sliding" if i in nope else "full" for i in range(n)))
        sliding = "sliding" in kinds
        changes.update(nope_layers=nope, layer_types=kinds if sliding else (),
                       sliding_window=int(window) if sliding else None)
    if model_type in _OLMO:
        changes.update(qk_norm=True, qk_norm_across_heads=True, pre_norms=False, post_norms=True)
    if model_type == "olmo3":
        kinds = cfg.layer_types
        if not hf.get("layer_types"):  # transformers' default: every fourth layer full, the others sliding
            kinds = tuple("full" if (i + 1) % 4 == 0 else "sliding" for i in range(n))
        sliding = "sliding" in kinds
        # Olmo 3's sliding layers use the unscaled rope of the same base (a rope scaling applies to full layers).
        changes.update(layer_types=kinds if sliding else (),
                       sliding_window=int(hf["sliding_window"]) if sliding else None,
                       rope_local=cfg.rope_local or RopeConfig(theta=cfg.rope.theta))
    if model_type == "phi3":
        window = hf.get("sliding_window")
        changes.update(layer_types=("sliding",) * n if window else (), sliding_window=int(window) if window else None)
    return cfg.replace(**changes)


def _dense_family_check(c: ModelConfig) -> None:
    """CheckpointError when `c` has switches its family's config.json cannot state (transformers would build a
    different model from it)."""
    olmo = c.family in _OLMO
    expected: dict[str, Any] = {
        "pre_norms": not olmo, "post_norms": olmo, "qk_norm": olmo, "qk_norm_across_heads": olmo,
        "norm_offset": False, "embed_scale": False, "activation": "silu", "attn_logit_softcap": None,
        "final_logit_softcap": None, "attention_sinks": False, "moe": None,
    }
    if c.family != "smollm3":
        expected["nope_layers"] = ()
    if c.family != "phi3":
        expected["partial_rotary_factor"] = 1.0
    if c.family in ("olmo2", "phi3"):
        expected["mlp_bias"] = False
    if c.family == "phi3":
        expected.update(qkv_bias=False, o_bias=False)
    if c.family == "olmo2":
        expected["layer_types"] = ()
    differ = [f"{k}={getattr(c, k)!r}" for k, v in expected.items() if getattr(c, k) != v]
    if c.attn_scale != c.head_dim ** -0.5:
        differ.append(f"query_pre_attn_scalar={c.query_pre_attn_scalar!r}")
    if c.qkv_bias != c.o_bias:
        differ.append(f"qkv_bias={c.qkv_bias} with o_bias={c.o_bias} (attention_bias sets both)")
    if c.family == "phi3" and c.layer_types and set(c.layer_types) != {"sliding"}:
        differ.append("some layers sliding and others not (Phi-3's sliding_window windows every layer)")
    if c.rope_local is not None and c.family != "olmo3":
        differ.append("a separate rope for sliding layers")
    if c.family == "olmo3" and c.rope_local is not None and c.rope_local != RopeConfig(theta=c.rope.theta):
        differ.append(f"rope_local={c.rope_local} (Olmo 3's sliding layers use the unscaled rope of the same base)")
    if differ:
        raise CheckpointError(f"a {c.family} config.json cannot express {', '.join(differ)}; export it as another "
                              "family or keep the family's settings")


def _dense_switches_unset(c: ModelConfig) -> None:
    """CheckpointError when a family other than SmolLM3, OLMo 2/3 and Phi-3 has one of their switches set (its
    config.json has no key for it)."""
    defaults = {"nope_layers": (), "pre_norms": True, "qk_norm_across_heads": False, "partial_rotary_factor": 1.0}
    differ = [f"{k}={getattr(c, k)!r}" for k, v in defaults.items() if getattr(c, k) != v]
    if differ:
        raise CheckpointError(f"a {c.family} config.json cannot express {', '.join(differ)}; export it as a family "
                              f"that has it ({', '.join(DENSE_FAMILY_TYPES)}) or keep the default")


def _dense_family_to_hf(c: ModelConfig, hf: dict[str, Any]) -> dict[str, Any]:
    """The SmolLM3, OLMo 2/3 or Phi-3 keys on top of the generic `config.json` dictionary `hf`."""
    _dense_family_check(c)
    hf["attention_bias"] = c.qkv_bias
    if c.family == "smollm3":
        hf["mlp_bias"] = c.mlp_bias
        hf["no_rope_layers"] = [0 if i in c.nope_layers else 1 for i in range(c.num_layers)]
        hf["use_sliding_window"] = bool(c.layer_types)
    if c.family == "olmo3":
        hf["rope_parameters"] = {"full_attention": _rope_params(c.rope),
                                 "sliding_attention": _rope_params(c.rope_local or RopeConfig(theta=c.rope.theta))}
        hf["layer_types"] = ["sliding_attention" if c.layer_type(i) == "sliding" else "full_attention"
                             for i in range(c.num_layers)]
        hf["sliding_window"] = c.sliding_window
    if c.family == "phi3":
        hf.pop("layer_types", None)
        hf["sliding_window"] = c.sliding_window if c.layer_types else None
        hf["rope_parameters"]["partial_rotary_factor"] = c.partial_rotary_factor
        if c.rope.scaling == "longrope":
            hf["original_max_position_embeddings"] = c.rope.original_max_position_embeddings
    return hf


def memory_for_weights(cfg: ModelConfig) -> dict[str, int]:
    """Bytes needed for the weights alone in each storage format (4-bit counts NF4 blocks of 64 + a scale)."""
    n = cfg.num_params()
    return {
        "float32": n * 4,
        "bfloat16": n * 2,
        "int8": n,
        "nf4": math.ceil(n / 2 + n / 64 * 4),
    }


# --------------------------------------------------------------------------------------------------------------
# Qwen3.5 (dense and MoE): three Gated DeltaNet layers to one gated softmax-attention layer

def _qwen3_5_from_hf(hf: dict[str, Any], model_type: str) -> ModelConfig:
    """The config of a Qwen3.5 or Qwen3.5-MoE text model: its own config.json (`qwen3_5_text`,
    `qwen3_5_moe_text`) or the multimodal one's `text_config` (the vision tower is not read)."""
    if "text_config" in hf:
        hf = {"tie_word_embeddings": hf.get("tie_word_embeddings", False), **hf["text_config"]}
    family = QWEN3_5_MODEL_TYPES[model_type]
    num_layers = int(hf["num_hidden_layers"])
    names = hf.get("layer_types") or ["linear_attention" if (i + 1) % int(hf.get("full_attention_interval", 4))
                                      else "full_attention" for i in range(num_layers)]
    unknown = sorted(set(names) - {"linear_attention", "full_attention"})
    if unknown or len(names) != num_layers:
        raise CheckpointError(f"{model_type} layer_types {unknown or names} are not linear_attention / "
                              f"full_attention for each of the {num_layers} layers")
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{model_type} hidden_act={hf.get('hidden_act')!r}: Qwen3.5's MLP is SwiGLU (silu)")
    params = dict(hf.get("rope_parameters") or {})
    partial = float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25)))
    rope = _rope_from_params({k: v for k, v in params.items() if k not in ("mrope_section", "mrope_interleaved",
                                                                          "partial_rotary_factor")},
                             float(hf.get("rope_theta", 10000000.0)))
    head_dim = int(hf.get("head_dim") or 256)
    attention_bias = bool(hf.get("attention_bias", False))
    moe = None
    if family == "qwen3_5_moe":  # every layer sparse: routed experts renormalised, a gated shared expert
        moe = MoeConfig(
            num_experts=int(hf["num_experts"]), experts_per_token=int(hf["num_experts_per_tok"]),
            expert_intermediate_size=int(hf["moe_intermediate_size"]), normalize_top_k=True,
            shared_expert_intermediate_size=int(hf["shared_expert_intermediate_size"]), shared_expert_gate=True,
            router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.001)),
            train_aux_loss=bool(hf.get("output_router_logits", False)))
    return ModelConfig(
        family=family,
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        num_layers=num_layers,
        num_heads=int(hf["num_attention_heads"]),
        num_kv_heads=int(hf["num_key_value_heads"]),
        head_dim=head_dim,
        intermediate_size=int(hf.get("intermediate_size") or hf.get("moe_intermediate_size")),
        rope=rope,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        norm_offset=True,  # (1 + w), weights stored around 0
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        qk_norm=True,
        max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
        pad_token_id=hf.get("pad_token_id"),
        moe=moe,
        partial_rotary_factor=partial,
        linear_attention=LinearAttentionConfig(
            num_key_heads=int(hf.get("linear_num_key_heads", 16)),
            num_value_heads=int(hf.get("linear_num_value_heads", 32)),
            key_head_dim=int(hf.get("linear_key_head_dim", 128)),
            value_head_dim=int(hf.get("linear_value_head_dim", 128)),
            conv_kernel=int(hf.get("linear_conv_kernel_dim", 4))),
        linear_attention_layers=tuple(i for i, name in enumerate(names) if name == "linear_attention"),
        attn_output_gate=True,
    )


def _qwen3_5_to_hf(c: ModelConfig) -> dict[str, Any]:
    """The text model's config.json (`Qwen3_5ForCausalLM` / `Qwen3_5MoeForCausalLM`, as transformers'
    `save_pretrained` writes it), after checking the config holds only what Qwen3.5 can state."""
    expected = dict(norm_offset=True, qk_norm=True, attn_output_gate=True, embed_scale=False, activation="silu",
                    post_norms=False, pre_norms=True, attn_logit_softcap=None, final_logit_softcap=None,
                    query_pre_attn_scalar=None, layer_types=(), nope_layers=(), attention_sinks=False,
                    qk_norm_across_heads=False, mlp_bias=False, rope_local=None)
    differ = [f"{k}={getattr(c, k)!r}" for k, v in expected.items() if getattr(c, k) != v]
    if c.qkv_bias != c.o_bias:
        differ.append(f"qkv_bias={c.qkv_bias} with o_bias={c.o_bias}")
    if (c.moe is not None) != (c.family == "qwen3_5_moe") or c.linear_attention is None:
        differ.append(f"moe={c.moe is not None} linear_attention={c.linear_attention is not None}")
    if differ:
        raise CheckpointError(f"a {c.family} config.json cannot express {', '.join(differ)}")
    la = c.linear_attention
    hf: dict[str, Any] = {
        **_shape_keys(c, _ARCH[c.family], f"{c.family}_text"),
        "hidden_act": "silu",
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": c.tie_word_embeddings,
        "attention_bias": c.qkv_bias,
        "rope_parameters": {**_rope_params(c.rope), "partial_rotary_factor": c.partial_rotary_factor},
        "layer_types": ["linear_attention" if c.is_linear_attention_layer(i) else "full_attention"
                        for i in range(c.num_layers)],
        "linear_conv_kernel_dim": la.conv_kernel,
        "linear_key_head_dim": la.key_head_dim,
        "linear_value_head_dim": la.value_head_dim,
        "linear_num_key_heads": la.num_key_heads,
        "linear_num_value_heads": la.num_value_heads,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_id,
        "pad_token_id": c.pad_token_id,
        "dtype": c.param_dtype,
    }
    hf["intermediate_size"] = c.intermediate_size  # a Qwen3.5-MoE config keeps it too (every layer is sparse)
    if c.moe is not None:
        m = c.moe
        if not (m.normalize_top_k and m.shared_expert_gate and m.shared_expert_intermediate_size
                and m.router_activation == "softmax" and m.decoder_sparse_step == 1 and not m.mlp_only_layers
                and not m.router_bias and not m.expert_bias and m.expert_activation == "silu"
                and m.routed_scaling == 1.0):
            raise CheckpointError(f"a qwen3_5_moe config.json cannot express moe={m}: Qwen3.5-MoE routes with a "
                                  "renormalised softmax top-k in every layer and has one gated shared expert")
        hf.update(num_experts=m.num_experts, num_experts_per_tok=m.experts_per_token,
                  moe_intermediate_size=m.expert_intermediate_size,
                  shared_expert_intermediate_size=m.shared_expert_intermediate_size,
                  router_aux_loss_coef=m.router_aux_loss_coef, output_router_logits=m.train_aux_loss)
    return hf


# --------------------------------------------------------------------------------------------------------------
# Gemma 4 (text): Gemma 3's sandwich norms and sliding/full layers, plus value norms, a proportional rope on the
# full layers, per-layer inputs, layer scalars and keys and values shared by the last layers

def _gemma4_from_hf(hf: dict[str, Any], model_type: str, source: str) -> ModelConfig:
    """The config of a Gemma 4 text model: its own config.json (`gemma4_text`) or the multimodal one's
    `text_config` (the vision and audio towers are not read). Missing keys take transformers' defaults; a switch
    tempax cannot run exactly is refused with a CheckpointError naming it."""
    if model_type == "gemma4":
        if not isinstance(hf.get("text_config"), dict):
            raise CheckpointError(f"{source}: a gemma4 config.json needs its text model's settings in text_config")
        hf = {"tie_word_embeddings": hf.get("tie_word_embeddings", True), **hf["text_config"]}
    where = f"{source} ({model_type})"
    num_layers = int(hf["num_hidden_layers"])
    names = list(hf.get("layer_types") or ["sliding_attention" if (i + 1) % 6 else "full_attention"
                                           for i in range(num_layers)])
    unknown = sorted(set(names) - {"sliding_attention", "full_attention"})
    if unknown or len(names) != num_layers:
        raise CheckpointError(f"{where}: layer_types {unknown or names} are not sliding_attention / full_attention "
                              f"for each of the {num_layers} layers")
    names[-1] = "full_attention"  # transformers makes the last layer a full one whatever the config says
    kinds = tuple("sliding" if t == "sliding_attention" else "full" for t in names)
    refused = []
    if hf.get("enable_moe_block"):
        missing = [k for k in ("num_experts", "top_k_experts", "moe_intermediate_size") if hf.get(k) is None]
        if missing:
            refused.append(f"enable_moe_block=true without {', '.join(missing)}")
    if hf.get("use_bidirectional_attention") == "all":
        refused.append("use_bidirectional_attention='all' (tempax's decoder is causal)")
    head_dim = int(hf.get("head_dim") or 256)
    num_kv_heads = int(hf.get("num_key_value_heads") or 4)
    per_layer = hf.get("per_layer_config")
    if per_layer is None:  # as transformers fills it: the full layers take global_head_dim (and KV heads)
        override: dict[str, Any] = {"head_dim": hf.get("global_head_dim", 512)}
        if hf.get("attention_k_eq_v", False) and hf.get("num_global_key_value_heads") is not None:
            override["num_key_value_heads"] = hf["num_global_key_value_heads"]
        per_layer = {i: override for i, kind in enumerate(kinds) if kind == "full"}
    # keys: layer indices (as transformers writes them) or layer kinds. The full layers may take a shape of their
    # own (a layer stack of their own), the same in every full layer; the sliding layers keep the base shape.
    base = {"head_dim": head_dim, "num_key_value_heads": num_kv_heads}

    # transformers writes the indices zero-padded ("04")
    by_index = {int(key): over for key, over in per_layer.items() if str(key).isdigit()}

    def shape_of(i: int) -> dict[str, Any]:
        name = "full_attention" if kinds[i] == "full" else "sliding_attention"
        over = by_index.get(i, per_layer.get(name, {})) or {}
        return {**base, **over}

    shapes = {kind: {json.dumps(shape_of(i), sort_keys=True) for i in range(num_layers) if kinds[i] == kind}
              for kind in ("full", "sliding")}
    full_shape = json.loads(next(iter(shapes["full"])))
    odd = [f"{kind} layers {sorted(found)}" for kind, found in shapes.items()
           if len(found) > 1 or (kind == "sliding" and found and json.loads(next(iter(found))) != base)]
    if set(full_shape) != set(base):
        odd.append(f"full layers {full_shape}")
    if odd:
        refused.append(f"per-layer settings other than one head_dim and num_key_value_heads for all full layers: "
                       f"{'; '.join(odd)} (per_layer_config; tempax's layer stacks hold one shape for each kind of "
                       "layer, the sliding layers the base one)")
    shared = int(hf.get("num_kv_shared_layers") or 0)
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh", "silu"):
        refused.append(f"hidden_activation={act!r} (gelu_pytorch_tanh or silu)")
    params = hf.get("rope_parameters") or {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}
    ropes = {}
    for kind in ("full_attention", "sliding_attention"):
        p = params.get(kind) or {}
        if p.get("rope_type", "default") not in ("default", "proportional", "linear"):
            refused.append(f"rope_parameters.{kind}.rope_type={p.get('rope_type')!r} (default, linear or "
                           "proportional)")
            continue
        ropes[kind] = _rope_from_params(p, 10000.0)
    if refused:
        raise CheckpointError(f"{where}: Gemma 4 with {'; '.join(refused)} is not supported")
    attention_bias = bool(hf.get("attention_bias", False))
    softcap = hf.get("final_logit_softcapping")
    sliding = "sliding" in kinds
    global_head_dim, global_kv_heads = int(full_shape["head_dim"]), int(full_shape["num_key_value_heads"])
    if not sliding:  # every layer a full one: the full layers' shape is the model's
        head_dim, num_kv_heads = global_head_dim, global_kv_heads
    vocab_size = int(hf.get("vocab_size", 262144))
    per_layer_vocab = int(hf.get("vocab_size_per_layer_input", 262144) or 0)
    activation = "silu" if act == "silu" else "gelu_tanh"
    return ModelConfig(
        family="gemma4",
        vocab_size=vocab_size,
        hidden_size=int(hf["hidden_size"]),
        num_layers=num_layers,
        num_heads=int(hf["num_attention_heads"]),
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=int(hf["intermediate_size"]),
        rope=ropes["full_attention"],
        rope_local=ropes["sliding_attention"] if sliding else None,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        norm_offset=False,  # Gemma 4's norms multiply by the weight itself, not (1 + w)
        embed_scale=True,
        activation=activation,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        qk_norm=True,
        post_norms=True,
        final_logit_softcap=None if softcap is None else float(softcap),
        query_pre_attn_scalar=1.0,  # attention scores are not scaled (the q/k norms set their size)
        sliding_window=int(hf.get("sliding_window") or 512) if sliding else None,
        layer_types=kinds if sliding else (),
        max_position_embeddings=int(hf.get("max_position_embeddings", 131072)),
        bos_token_id=hf.get("bos_token_id", 2),
        eos_token_id=hf.get("eos_token_id", 1),
        pad_token_id=hf.get("pad_token_id", 0),
        v_norm=True,
        attention_k_eq_v=bool(hf.get("attention_k_eq_v", False)),
        kv_shared_layers=shared,
        per_layer_input_size=int(hf.get("hidden_size_per_layer_input", 256) or 0),
        # 0: the same as vocab_size (the released models' case), so a config reads back as it was written
        per_layer_input_vocab_size=0 if per_layer_vocab == vocab_size else per_layer_vocab,
        layer_scalar=True,
        global_head_dim=0 if global_head_dim == head_dim else global_head_dim,
        global_kv_heads=0 if global_kv_heads == num_kv_heads else global_kv_heads,
        wide_shared_mlp=bool(hf.get("use_double_wide_mlp", False)) and shared > 0,
        moe=_gemma4_moe(hf, activation),
    )


def _gemma4_moe(hf: dict[str, Any], activation: str) -> MoeConfig | None:
    """The `MoeConfig` of a Gemma 4 config with `enable_moe_block` (None without), as transformers' Gemma4TextRouter
    and Gemma4TextExperts compute it in every layer: a softmax over all experts of the normed and scaled input's
    scores, the top k renormalised and scaled per expert, experts of `hidden_activation` beside the dense MLP.
    transformers trains Gemma 4 without a load-balancing loss; `router_aux_loss_coef` and `output_router_logits`
    are read where a config (tempax's export) states them."""
    if not hf.get("enable_moe_block"):
        return None
    return MoeConfig(
        num_experts=int(hf["num_experts"]),
        experts_per_token=int(hf["top_k_experts"]),
        expert_intermediate_size=int(hf["moe_intermediate_size"]),
        normalize_top_k=True,
        expert_activation=activation,  # type: ignore[arg-type]
        router_input_norm=True,
        per_expert_scale=True,
        beside_dense_mlp=True,
        router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.001)),
        train_aux_loss=bool(hf.get("output_router_logits", False)),
    )


def _gemma4_to_hf(c: ModelConfig) -> dict[str, Any]:
    """The text model's config.json (`Gemma4ForCausalLM`), after checking the config holds only what Gemma 4 can
    state."""
    expected = dict(norm_offset=False, embed_scale=True, qk_norm=True, post_norms=True, pre_norms=True, v_norm=True,
                    layer_scalar=True, attn_logit_softcap=None, mlp_bias=False, attention_sinks=False,
                    nope_layers=(), qk_norm_across_heads=False, partial_rotary_factor=1.0, linear_attention_layers=(),
                    attn_output_gate=False)
    differ = [f"{k}={getattr(c, k)!r}" for k, v in expected.items() if getattr(c, k) != v]
    if c.attn_scale != 1.0:
        differ.append(f"query_pre_attn_scalar={c.query_pre_attn_scalar!r} (Gemma 4 does not scale its scores)")
    if c.qkv_bias != c.o_bias:
        differ.append(f"qkv_bias={c.qkv_bias} with o_bias={c.o_bias} (attention_bias sets both)")
    if c.layer_types and c.layer_types[-1] != "full":
        differ.append("a sliding last layer (transformers makes Gemma 4's last layer a full one)")
    for name, rope in (("rope", c.rope), ("rope_local", c.rope_local)):
        if rope is not None and rope.scaling not in (None, "linear", "proportional"):
            differ.append(f"{name}.scaling={rope.scaling!r}")
    moe: dict[str, Any] = {"enable_moe_block": c.moe is not None}
    if c.moe is not None:
        m = c.moe
        moe.update(num_experts=m.num_experts, top_k_experts=m.experts_per_token,
                   moe_intermediate_size=m.expert_intermediate_size, router_aux_loss_coef=m.router_aux_loss_coef,
                   output_router_logits=m.train_aux_loss)
        if m != _gemma4_moe(moe, c.activation):
            differ.append(f"moe={m} (Gemma 4's sparse block: a renormalised softmax top-k scaled per expert, a "
                          "normed and scaled router input, experts of the MLP's activation beside the dense MLP in "
                          "every layer, no shared expert or biases)")
    if differ:
        raise CheckpointError(f"a gemma4 config.json cannot express {', '.join(differ)}")
    kinds = [c.layer_type(i) for i in range(c.num_layers)]
    full = c.full_attention_config()
    return {
        **_shape_keys(c, _ARCH["gemma4"], "gemma4_text"),
        # the full layers' shape, stated per layer (transformers applies num_global_key_value_heads only with
        # attention_k_eq_v); global_head_dim too, which transformers reads when per_layer_config is absent
        "global_head_dim": full.head_dim,
        "per_layer_config": {str(i): {"head_dim": full.head_dim, "num_key_value_heads": full.num_kv_heads}
                             for i, kind in enumerate(kinds) if kind == "full"},
        "intermediate_size": c.intermediate_size,
        "hidden_activation": "silu" if c.activation == "silu" else "gelu_pytorch_tanh",
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "attention_bias": c.qkv_bias,
        "rope_parameters": {"full_attention": _rope_params(c.rope),
                            "sliding_attention": _rope_params(c.rope_local or c.rope)},
        "layer_types": ["sliding_attention" if k == "sliding" else "full_attention" for k in kinds],
        "sliding_window": c.sliding_window or 512,
        "final_logit_softcapping": c.final_logit_softcap,
        "hidden_size_per_layer_input": c.per_layer_input_size,
        "vocab_size_per_layer_input": c.per_layer_input_vocab_size or c.vocab_size,
        "attention_k_eq_v": c.attention_k_eq_v,
        "num_kv_shared_layers": c.kv_shared_layers,
        "use_double_wide_mlp": c.wide_shared_mlp,
        **moe,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_id,
        "pad_token_id": c.pad_token_id,
        "dtype": c.param_dtype,
    }
