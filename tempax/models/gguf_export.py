"""Writing a tempax `Decoder` (and its tokenizer) as a GGUF file that llama.cpp, ollama and LM Studio run.

The file is what llama.cpp's own converter (`convert_hf_to_gguf.py`) would write for the model's Hugging Face
checkpoint, so `tempax.models.gguf_io` reads it back unchanged (`save_gguf` lists the edits, `_tensor_type` the
quantisation); what llama.cpp cannot represent is refused before anything is written (`gguf_refusal`).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from tempax.errors import CheckpointError, ConfigError
from tempax.models.config import ModelConfig
from tempax.models.fused import fuse_tensors
from tempax.models.gguf_io import (
    GGUF_ARCHITECTURES,
    PERMUTED_ARCHITECTURES,
    gguf_architecture,
    llama3_rope_factors,
    permute_qk,
    smollm3_nope_layers,
)
from tempax.models.gguf_tokenizer import DIGITS_THEN_GPT2, SPLIT_PATTERNS

if TYPE_CHECKING:
    from tempax.models.decoder import Decoder

GGUF_QUANTS = ("f32", "f16", "bf16", "q8_0", "q4_0")

# Token types of llama.cpp's vocabulary (gguf.TokenType).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_SPACE = "\u2581"

_LAYER_PARTS = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up",  # Phi-3's fused projections
}
_TOP_LEVEL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}


def hf_to_gguf_name(hf_name: str, cfg: ModelConfig) -> str:
    """llama.cpp's tensor name for a Hugging Face one (inverse of `gguf_io.gguf_to_hf_name`)."""
    if hf_name in _TOP_LEVEL:
        return _TOP_LEVEL[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    if module == "post_attention_layernorm":
        # Gemma 2/3 norm the attention output with it; everyone else norms the MLP input (llama.cpp's ffn_norm).
        part = "post_attention_norm" if cfg.post_norms else "ffn_norm"
    else:
        part = _LAYER_PARTS[module]
    return f"blk.{layer}.{part}.{kind}"


# ------------------------------------------------------------------------------------------------------------
def _llamacpp_attention_scalar(cfg: ModelConfig) -> float:
    """The query scale llama.cpp computes for Gemma 2/3 (it reads no key for it): head_dim, except the 27B
    models (46 and 62 layers), which scale by hidden / heads."""
    return float(cfg.hidden_size // cfg.num_heads) if cfg.num_layers in (46, 62) else float(cfg.head_dim)


def _dense_family_refusal(cfg: ModelConfig) -> str | None:
    """What llama.cpp's smollm3, olmo2 (OLMo 2 and 3) and phi3 architectures cannot run, or None."""
    family, arch = cfg.family, gguf_architecture(cfg)
    if cfg.partial_rotary_factor != 1.0 and family != "phi3":
        return "partial rotary embedding, which this exporter writes for llama.cpp's phi3 only"
    if cfg.rope.scaling == "longrope" and family != "phi3":
        return "LongRoPE, which this exporter writes for llama.cpp's phi3 only"
    if family not in ("smollm3", "olmo2", "olmo3", "phi3"):
        return None
    if arch in ("olmo2", "phi3") and cfg.num_heads * cfg.head_dim != cfg.hidden_size:
        return (f"num_heads * head_dim = {cfg.num_heads * cfg.head_dim} differs from hidden_size = "
                f"{cfg.hidden_size}; llama.cpp's {arch} assumes they are equal")
    if arch == "olmo2" and cfg.tie_word_embeddings:
        return "a tied LM head; llama.cpp's olmo2 always reads a separate output tensor"
    if cfg.rope.scaling not in (None, "linear", "llama3", "longrope"):
        return f"{cfg.rope.scaling} RoPE scaling, which this exporter does not write for llama.cpp's {arch}"
    return None


def gguf_refusal(cfg: ModelConfig) -> str | None:
    """Why llama.cpp cannot run this model as its family's GGUF architecture, or None when it can.

    What llama.cpp cannot represent is refused before anything is written (`check_exportable`), e.g. Gemma 2 with a
    layer pattern other than alternating sliding/full (llama.cpp hard-codes it), or a Gemma 2/3 attention scale other
    than llama.cpp's rule (it ignores `attention.scale` for them).
    """
    family = cfg.family
    if cfg.linear_attention_layers:
        return ("linear-attention (Gated DeltaNet) layers: llama.cpp's qwen35 stores them in its own layout (value "
                "heads reordered, the decay as -exp(A_log)), which this exporter does not write")
    if family == "gemma4" or cfg.per_layer_input_size or cfg.kv_shared_layers or cfg.v_norm:
        return ("Gemma 4's switches (value norms, per-layer inputs, shared keys and values, layer scalars, a "
                "proportional rope, the sparse block beside the MLP): this exporter writes no llama.cpp gemma4 "
                "tensors or metadata")
    if gguf_architecture(cfg) not in GGUF_ARCHITECTURES:
        return f"family {family!r} has no llama.cpp architecture here (supported: {', '.join(GGUF_ARCHITECTURES)})"
    gemma = family.startswith("gemma")
    olmo = family in ("olmo2", "olmo3")
    expected = {"norm_offset": gemma, "embed_scale": gemma, "activation": "gelu_tanh" if gemma else "silu",
                "post_norms": family in ("gemma2", "gemma3") or olmo, "qk_norm": family in ("qwen3", "gemma3") or olmo,
                "pre_norms": not olmo, "qk_norm_across_heads": olmo,
                "nope_layers": smollm3_nope_layers(cfg.num_layers) if family == "smollm3" else ()}
    for field_name, value in expected.items():
        if getattr(cfg, field_name) != value:
            return f"{field_name}={getattr(cfg, field_name)!r}, but llama.cpp's {family} always has {value!r}"
    reason = _dense_family_refusal(cfg)
    if reason is not None:
        return reason
    if cfg.qkv_bias and family not in ("llama", "qwen2"):
        return f"q/k/v biases, which llama.cpp's {family} has no tensors for"
    if (cfg.o_bias or cfg.mlp_bias) and family != "llama":
        return f"output-projection or MLP biases, which llama.cpp's {family} has no tensors for"
    if family == "qwen2" and cfg.num_heads * cfg.head_dim != cfg.hidden_size:
        return (f"num_heads * head_dim = {cfg.num_heads * cfg.head_dim} differs from hidden_size = "
                f"{cfg.hidden_size}; llama.cpp's qwen2 assumes they are equal")
    if family in ("gemma", "gemma2") and not cfg.tie_word_embeddings:
        return f"an untied LM head; llama.cpp's {family} always reuses the embedding"
    if cfg.rope.scaling == "llama3" and family != "llama":
        return f"Llama 3 RoPE scaling on {family}; llama.cpp reads rope_freqs only for the llama architecture"
    if cfg.rope_local is not None and family not in ("gemma3", "olmo3"):
        return f"a separate RoPE for sliding layers, which llama.cpp's {family} does not read"
    if cfg.rope_local is not None and cfg.rope_local.scaling:
        return "a scaled RoPE on sliding layers; llama.cpp scales only the global layers"
    if family == "gemma2" and cfg.attn_logit_softcap is None:
        return "no attention soft-capping; llama.cpp's gemma2 always caps (50 unless the file says otherwise)"
    if family != "gemma2" and cfg.attn_logit_softcap is not None:
        return f"attention soft-capping, which llama.cpp's {family} does not apply"
    if cfg.final_logit_softcap is not None and family not in ("gemma2", "gemma3"):
        return f"final-logit soft-capping, which llama.cpp's {family} does not apply"
    if family == "gemma2" and cfg.final_logit_softcap is None:
        return "no final-logit soft-capping; llama.cpp's gemma2 caps at 30 unless the file says otherwise"
    if family in ("gemma2", "gemma3"):
        scalar = cfg.query_pre_attn_scalar or float(cfg.head_dim)
        if scalar != _llamacpp_attention_scalar(cfg):
            return (f"query_pre_attn_scalar={scalar:g}; llama.cpp's {family} ignores the file's attention scale and "
                    f"uses {_llamacpp_attention_scalar(cfg):g} (head_dim, or hidden/heads for the 27B models)")
    elif cfg.query_pre_attn_scalar is not None and cfg.query_pre_attn_scalar != cfg.head_dim:
        return f"query_pre_attn_scalar={cfg.query_pre_attn_scalar:g}, which llama.cpp's {family} does not read"
    sliding = "sliding" in cfg.layer_types
    if sliding and family not in ("gemma2", "gemma3", "olmo3"):
        return f"sliding-window layers, which llama.cpp's {family} does not window"
    if family == "gemma2":
        alternating = tuple("sliding" if i % 2 == 0 else "full" for i in range(cfg.num_layers))
        if cfg.layer_types != alternating:
            return ("a layer pattern other than sliding/full alternating from layer 0, which llama.cpp's gemma2 "
                    "hard-codes")
    return None


def check_exportable(cfg: ModelConfig) -> None:
    """ConfigError naming the family and what llama.cpp lacks, when the model cannot be written as GGUF."""
    reason = gguf_refusal(cfg)
    if reason is not None:
        raise ConfigError(f"cannot export this {cfg.family} model to GGUF: {reason}. Export a Hugging Face folder "
                          "instead (tempax export without --gguf).")


# ------------------------------------------------------------------------------------------------------------
def _backend_json(hf: Any) -> dict[str, Any]:
    return json.loads(hf.backend_tokenizer.to_str())


def _flatten(step: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A pre-tokenizer / normalizer as a flat list of its steps (a Sequence's members, in order)."""
    if not step:
        return []
    inner = step.get("pretokenizers") or step.get("normalizers")
    if step.get("type") == "Sequence" and inner is not None:
        return [s for part in inner for s in _flatten(part)]
    return [step]


def _byte_level_pre(pre: dict[str, Any] | None) -> str:
    """llama.cpp's `tokenizer.ggml.pre` name for a byte-level vocabulary's split rule."""
    steps = _flatten(pre)
    kinds = [s.get("type") for s in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and steps[1].get("use_regex", True):
        return DIGITS_THEN_GPT2[0]
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        pattern = (steps[0].get("pattern") or {}).get("Regex")
        names = [name for name, p in SPLIT_PATTERNS.items() if p == pattern]
        preferred = [n for n in ("llama-bpe", "qwen2") if n in names]
        if preferred or names:
            return (preferred or names)[0]
    raise CheckpointError(
        f"the tokenizer splits text with {json.dumps(pre)[:300]}, which is not a split llama.cpp names here "
        "(GPT-2's, SmolLM's, Llama 3's or Qwen 2's); its GGUF would tokenize differently"
    )


def _adds_space_prefix(hf: Any) -> bool:
    pieces = hf.convert_ids_to_tokens(hf.encode("a", add_special_tokens=False))
    return bool(pieces) and pieces[0].startswith(_SPACE)


def _added_flags(hf: Any) -> tuple[bool, bool]:
    """(adds BOS, adds EOS) as the tokenizer behaves on a plain string; flags alone miss post-processors."""
    plain = hf.encode("a", add_special_tokens=False)
    full = hf.encode("a", add_special_tokens=True)
    bos = hf.bos_token_id is not None and len(full) > len(plain) and full[0] == hf.bos_token_id
    eos = hf.eos_token_id is not None and len(full) > len(plain) and full[-1] == hf.eos_token_id
    return bos, eos


def tokenizer_metadata(tokenizer: Any, *, vocab_size: int, pre: str | None = None) -> dict[str, Any]:
    """The `tokenizer.*` GGUF metadata of a Hugging Face fast tokenizer (or a tempax `Tokenizer`).

    Byte-level BPE vocabularies (GPT-2 alphabet: SmolLM2, Qwen, Llama 3) become llama.cpp's "gpt2" model with the
    merges listed and `pre` naming the split pattern (read from the tokenizer's pre-tokenizer unless given);
    SentencePiece-style BPE (byte fallback, "▁" for spaces: Llama 2, Mistral, Gemma) becomes its "llama" model
    with scores -rank of the merge that makes each piece (SentencePiece merges the best-scoring pair first) and
    the merges too. Added special tokens are control tokens, other added tokens user-defined, `<0xNN>` pieces byte
    tokens. Embedding rows past the tokenizer's last id get `[PAD<i>]` unused tokens, as llama.cpp pads, since it
    needs one token per row. Special ids, BOS/EOS adding and the chat template are carried over.
    """
    hf = getattr(tokenizer, "hf", tokenizer)
    spec = _backend_json(hf)
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise CheckpointError(f"the tokenizer is a {model.get('type')} model; GGUF export writes BPE vocabularies only")
    byte_level = (spec.get("decoder") or {}).get("type") == "ByteLevel" or any(
        s.get("type") == "ByteLevel" for s in _flatten(spec.get("pre_tokenizer")))
    sentencepiece = bool(model.get("byte_fallback"))
    if not byte_level and not sentencepiece:
        raise CheckpointError("the tokenizer is neither byte-level BPE nor SentencePiece BPE with byte fallback; "
                              "llama.cpp has no vocabulary type for it")
    vocab = hf.get_vocab()
    n_tokens = max(vocab_size, max(vocab.values()) + 1)
    if n_tokens > vocab_size:
        raise CheckpointError(f"the tokenizer has ids up to {n_tokens - 1} but the model embeds only {vocab_size} "
                              "tokens; llama.cpp needs one embedding row per token")
    tokens = [f"[PAD{i}]" for i in range(n_tokens)]
    types = [_UNUSED] * n_tokens
    for token, i in vocab.items():
        tokens[i], types[i] = token, _NORMAL
    added = {int(i): t for i, t in hf.added_tokens_decoder.items()}
    for i, t in added.items():
        types[i] = _CONTROL if t.special else _USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    out: dict[str, Any] = {"tokenizer.ggml.merges": merges}
    if sentencepiece:
        for i, t in enumerate(tokens):
            if types[i] == _NORMAL and len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                types[i] = _BYTE
        if hf.unk_token_id is not None:
            types[hf.unk_token_id] = _UNKNOWN
        rank = {}
        for r, m in enumerate(merges):
            rank.setdefault(m.replace(" ", "", 1), r)
        out["tokenizer.ggml.model"] = "llama"
        out["tokenizer.ggml.scores"] = [-float(rank.get(t, 0)) if types[i] == _NORMAL else 0.0
                                        for i, t in enumerate(tokens)]
        out["tokenizer.ggml.add_space_prefix"] = _adds_space_prefix(hf)
    else:
        out["tokenizer.ggml.model"] = "gpt2"
        out["tokenizer.ggml.pre"] = pre or _byte_level_pre(spec.get("pre_tokenizer"))
    out["tokenizer.ggml.tokens"] = tokens
    out["tokenizer.ggml.token_type"] = types
    for key, value in (("bos_token_id", hf.bos_token_id), ("eos_token_id", hf.eos_token_id),
                       ("unknown_token_id", hf.unk_token_id), ("padding_token_id", hf.pad_token_id)):
        if value is not None:
            out[f"tokenizer.ggml.{key}"] = int(value)
    adds_bos, adds_eos = _added_flags(hf)
    out["tokenizer.ggml.add_bos_token"] = adds_bos
    out["tokenizer.ggml.add_eos_token"] = adds_eos
    template = getattr(hf, "chat_template", None)
    if isinstance(template, str) and template:
        out["tokenizer.chat_template"] = template
    return out


# ------------------------------------------------------------------------------------------------------------
def _tensor_type(name: str, array: np.ndarray, quant: str, cfg: ModelConfig) -> str:
    """The GGML type one tensor is stored in.

    Quantisation (`--quant`), per tensor, with the `gguf` package's own encoders (`gguf.quants.quantize`):
      f32 / f16 / bf16: every 2-D weight in that type. q8_0 / q4_0: every 2-D weight in blocks of 32 weights sharing a
      scale (8 or 4 bits each), except that q4_0 keeps the output projection (`output.weight`, or the tied
      embedding that serves as it) in q8_0, as llama.cpp keeps it at higher precision, since every logit goes through
      it. A weight whose rows are not whole 32-weight blocks falls back to f16. 1-D tensors (norms, biases, rope
      factors) stay f32 in every mode, as llama.cpp stores them.
    """
    if array.ndim < 2 or quant == "f32":
        return "F32"
    if quant in ("f16", "bf16"):
        return quant.upper()
    if array.shape[-1] % 32:
        return "F16"
    head = "output.weight" if not cfg.tie_word_embeddings else "token_embd.weight"
    if quant == "q4_0" and name == head:
        return "Q8_0"
    return quant.upper()


_FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0",
               "q4_0": "MOSTLY_Q4_0"}


def _add_value(writer: Any, key: str, value: Any) -> None:
    """One metadata entry, typed as llama.cpp's converter types it (token ids and counts uint32, flags bool)."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value) if value >= 0 else writer.add_int32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, (list, tuple)):
        writer.add_array(key, list(value))
    else:
        raise TypeError(f"GGUF metadata {key!r}: cannot store a {type(value).__name__}")


def _add_hyperparameters(w: Any, cfg: ModelConfig) -> None:
    import gguf

    w.add_block_count(cfg.num_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.rotary_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_freq_base(cfg.rope.theta)
    if cfg.rope.scaling == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(cfg.rope.factor)
    if cfg.rope_local is not None:
        w.add_rope_freq_base_swa(cfg.rope_local.theta)
    if "sliding" in cfg.layer_types:
        w.add_sliding_window(cfg.sliding_window)
        if cfg.family == "gemma3":
            w.add_sliding_window_pattern(_gemma3_pattern(cfg.layer_types))
        if cfg.family == "olmo3":  # one bool per layer, true = sliding, as llama.cpp's converter writes it
            w.add_sliding_window_pattern([t == "sliding" for t in cfg.layer_types])
    if cfg.attn_logit_softcap is not None:
        w.add_attn_logit_softcapping(cfg.attn_logit_softcap)
    if cfg.final_logit_softcap is not None:
        w.add_final_logit_softcapping(cfg.final_logit_softcap)


def _gemma3_pattern(layer_types: tuple[str, ...]) -> int | list[bool]:
    """llama.cpp's sliding_window_pattern: n when every n-th layer is full (layers n-1, 2n-1, ...), else one bool
    per layer (true = sliding)."""
    for n in range(1, len(layer_types) + 1):
        if all((t == "full") == ((i + 1) % n == 0) for i, t in enumerate(layer_types)):
            return n
    return [t == "sliding" for t in layer_types]


def save_gguf(
    model: "Decoder",
    path: str | os.PathLike,
    *,
    tokenizer: Any = None,
    quant: str = "f16",
    pre: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> str:
    """Writes `model` as a llama.cpp GGUF file at `path`; returns the path.

    The file is what llama.cpp's own converter (`convert_hf_to_gguf.py`) would write for the model's Hugging Face
    checkpoint, so `tempax.models.gguf_io` (which undoes exactly those edits) reads it back unchanged:
      * tensor names are llama.cpp's (`token_embd`, `blk.N.attn_q`, `blk.N.ffn_down`, `output_norm`, `output`); a tied
        LM head is simply absent;
      * the llama architecture (Llama, Mistral, SmolLM2) and smollm3 have their q/k rows permuted per head from
        rotate-half to interleaved RoPE order (`gguf_io.permute_qk`); Qwen, Gemma, OLMo and Phi-3 use NeoX RoPE and are
        stored as they are;
      * Phi-3's q/k/v and gate/up projections are written fused (`attn_qkv`; `ffn_up` holding gate then up rows), and
        OLMo 3 as llama.cpp's olmo2 with its sliding window and per-layer pattern;
      * Gemma norm weights are stored as `w + 1` (llama.cpp multiplies by the weight, tempax and HF by `1 + w`);
      * Llama 3 RoPE scaling becomes a `rope_freqs.weight` tensor of per-frequency divisors, Phi-3's LongRoPE the
        `rope_factors_long` / `rope_factors_short` tensors with its original context and cos/sin factor (llama.cpp
        picks the long divisors by the context size it runs with, where transformers and tempax pick them per call);
      * the tokenizer goes into `tokenizer.*` metadata (`tokenizer_metadata`).

    Args:
      model: a plain `Decoder` (merge LoRA adapters and dequantize a QLoRA base first: `lora.merge_lora`).
      tokenizer: a tempax `Tokenizer` or Hugging Face fast tokenizer, written as `tokenizer.*` metadata; None
        writes no tokenizer (llama.cpp then cannot run the file).
      quant: one of `GGUF_QUANTS`.
      pre: llama.cpp's pre-tokenizer name for a byte-level vocabulary; None reads it from the tokenizer.
      metadata: extra key -> value entries (the model card's `general.*` fields).
    """
    import gguf

    from tempax.models.decoder import rope_attention_factor  # here: the command line imports this module before JAX
    from tempax.models.weights import iter_hf_tensors

    if quant not in GGUF_QUANTS:
        raise ConfigError(f"--quant {quant!r} is not a GGUF type tempax writes; choose one of {', '.join(GGUF_QUANTS)}")
    cfg: ModelConfig = model.config
    check_exportable(cfg)
    path = os.fspath(path)
    token_meta = tokenizer_metadata(tokenizer, vocab_size=cfg.vocab_size, pre=pre) if tokenizer is not None else {}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, gguf_architecture(cfg))
    try:
        w.add_type(gguf.GGUFType.MODEL)
        _add_hyperparameters(w, cfg)
        w.add_file_type(gguf.LlamaFileType[_FILE_TYPES[quant]])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for key, value in {**token_meta, **(metadata or {})}.items():
            _add_value(w, key, value)
        if cfg.rope.scaling == "llama3":
            w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg.rope, cfg.head_dim).astype(np.float32))
        if cfg.rope.scaling == "longrope":  # Phi-3's converter: both divisor sets as tensors, the context it extends
            w.add_rope_scaling_attn_factors(rope_attention_factor(cfg.rope))
            w.add_rope_scaling_orig_ctx_len(cfg.rope.original_max_position_embeddings)
            w.add_tensor("rope_factors_long.weight", np.asarray(cfg.rope.long_factor, np.float32))
            w.add_tensor("rope_factors_short.weight", np.asarray(cfg.rope.short_factor, np.float32))
        permuted = gguf_architecture(cfg) in PERMUTED_ARCHITECTURES
        for hf_name, array in fuse_tensors(iter_hf_tensors(model), cfg):  # Phi-3: attn_qkv, ffn_up = gate + up
            array = np.asarray(array, np.float32)
            if permuted and ".q_proj." in hf_name:
                array = permute_qk(array, cfg.num_heads)
            elif permuted and ".k_proj." in hf_name:
                array = permute_qk(array, cfg.num_kv_heads)
            if cfg.norm_offset and hf_name.endswith("norm.weight"):
                array = array + 1.0
            name = hf_to_gguf_name(hf_name, cfg)
            qtype = gguf.GGMLQuantizationType[_tensor_type(name, array, quant, cfg)]
            if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
                w.add_tensor(name, array.astype(np.float32 if qtype == gguf.GGMLQuantizationType.F32 else np.float16))
            else:
                w.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    os.replace(tmp, path)  # a reader never sees a half-written file under the final name
    return path
