"""The decoder's configuration: one dataclass whose fields carry every difference between families.

Llama 3 / SmolLM2, Qwen2/2.5, Qwen3, Gemma, Gemma 2 and Gemma 3 are the same decoder-only transformer with a
handful of switches (qkv bias, q/k norm, norm offset, embedding scaling, soft-capping, sliding windows, extra
post-norms, per-layer rope bases). `ModelConfig.from_hf_config` reads a Hugging Face `config.json` (both the
transformers-4 `rope_theta`/`rope_scaling` keys and the transformers-5 `rope_parameters` form) and
`to_hf_config` writes one that `transformers` loads.
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

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "gemma3", "mistral")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding for one kind of layer.

    Attributes:
      theta: base of the inverse frequencies.
      scaling: None, "linear" (positions divided by `factor`) or "llama3" (Llama 3.1 frequency-band scaling).
      factor: scaling factor for "linear" and "llama3".
      low_freq_factor, high_freq_factor, original_max_position_embeddings: the "llama3" band edges.
    """

    theta: float = 10000.0
    scaling: Literal["linear", "llama3"] | None = None
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


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

    def __post_init__(self) -> None:
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

    # ----------------------------------------------------------------------------------------------------------
    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def layer_type(self, i: int) -> str:
        return self.layer_types[i] if self.layer_types else "full"

    def rope_for(self, i: int) -> RopeConfig:
        if self.layer_type(i) == "sliding" and self.rope_local is not None:
            return self.rope_local
        return self.rope

    @property
    def attn_scale(self) -> float:
        base = self.query_pre_attn_scalar if self.query_pre_attn_scalar else self.head_dim
        return float(base) ** -0.5

    def num_params(self) -> int:
        """Parameter count; a tied embedding/LM-head matrix is counted once."""
        d, h, n, k = self.hidden_size, self.head_dim, self.num_heads, self.num_kv_heads
        attn = d * n * h + 2 * d * k * h + n * h * d
        if self.qkv_bias:
            attn += n * h + 2 * k * h
        if self.o_bias:
            attn += d
        if self.qk_norm:
            attn += 2 * h
        mlp = 3 * d * self.intermediate_size
        if self.mlp_bias:
            mlp += 2 * self.intermediate_size + d
        norms = (4 if self.post_norms else 2) * d
        per_layer = attn + mlp + norms
        embed = self.vocab_size * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.num_layers * per_layer + embed + head + d

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
    raise CheckpointError(f"rope type {kind!r} is not supported (supported: default, linear, llama3)")


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
    return ()


def _from_hf(hf: dict[str, Any], model_type: str) -> ModelConfig:
    hidden = int(hf["hidden_size"])
    heads = int(hf["num_attention_heads"])
    num_layers = int(hf["num_hidden_layers"])
    head_dim = int(hf.get("head_dim") or hidden // heads)
    rope, rope_local = _ropes(hf)
    gemma = model_type.startswith("gemma")
    family = {"gemma3_text": "gemma3", "mistral": "llama"}.get(model_type, model_type)
    layer_types = _layer_types(hf, model_type, num_layers)
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
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=attention_bias and model_type != "qwen2",
        mlp_bias=bool(hf.get("mlp_bias", False)),
        qk_norm=model_type in ("qwen3", "gemma3_text"),
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
    )


def _rope_params(r: RopeConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_theta": r.theta, "rope_type": r.scaling or "default"}
    if r.scaling:
        out["factor"] = r.factor
    if r.scaling == "llama3":
        out.update(
            low_freq_factor=r.low_freq_factor,
            high_freq_factor=r.high_freq_factor,
            original_max_position_embeddings=r.original_max_position_embeddings,
        )
    return out


def _to_hf(c: ModelConfig) -> dict[str, Any]:
    model_type = {"gemma3": "gemma3_text"}.get(c.family, c.family)
    arch = _ARCH.get(c.family)
    if arch is None:
        raise CheckpointError(f"cannot export family {c.family!r} to a Hugging Face config")
    hf: dict[str, Any] = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
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
    if c.layer_types and c.family == "gemma3":
        local = c.rope_local or c.rope
        hf["rope_parameters"] = {"full_attention": _rope_params(c.rope), "sliding_attention": _rope_params(local)}
    else:
        hf["rope_parameters"] = _rope_params(c.rope)
    if c.layer_types:
        hf["layer_types"] = ["sliding_attention" if t == "sliding" else "full_attention" for t in c.layer_types]
        hf["sliding_window"] = c.sliding_window
        if c.family in ("qwen2", "qwen3", "mistral"):
            hf["use_sliding_window"] = True
    elif c.family in ("qwen2", "qwen3"):
        hf["use_sliding_window"] = False
    if c.family in ("gemma2", "gemma3"):
        hf["query_pre_attn_scalar"] = c.query_pre_attn_scalar or c.head_dim
        hf["final_logit_softcapping"] = c.final_logit_softcap
        if c.family == "gemma2":
            hf["attn_logit_softcapping"] = c.attn_logit_softcap
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
