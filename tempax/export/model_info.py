"""The facts of a model, without loading its weights: family, shapes, parameter count, weight memory, the file's
tensor types, and the architectural features that set it apart (`tempax model-info` prints them).

SOURCE is anything `tempax.load` accepts: a registered name (`smollm2-135m-instruct`), `preset:<name>`, a `.gguf`
file, a Hugging Face folder or a Hub repo id; or a training run's directory, whose model has the shape of the
model it started from (`tempax.algorithms.run_dirs.shape_source`). Only config.json or the GGUF header is read.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from tempax.models.config import ModelConfig, memory_for_weights
from tempax.models.registry import ModelInfo, inspect_model, is_run_dir


def inspect_source(source: str) -> tuple[ModelInfo, str | None]:
    """(facts of the model `source` names, a note when it is a training run's directory: which model's shape its
    model has). A run's model is its newest checkpoint with adapters merged, so LoRA adds no shape to it."""
    if not (os.path.isdir(source) and is_run_dir(source)):
        return inspect_model(source), None
    from tempax.algorithms.run_dirs import shape_source  # the training layer, for run dirs only

    base, overrides = shape_source(source)
    info = inspect_model(base)
    if overrides:
        info = dataclasses.replace(info, config=info.config.replace(**overrides), stored_params=None)
    return info, (f"{source} is a training run; its model (the newest checkpoint, adapters merged) has the shape "
                  f"of {base}" + (" with its overrides" if overrides else ""))


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _count(n: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.1f}{unit} ({n:,})"
    return f"{n:,}"


def _features(c: ModelConfig) -> list[str]:
    """What sets the architecture apart from a plain Llama: rope settings, biases, norms, soft-capping, windows."""
    out = []
    rope = f"rope theta {c.rope.theta:g}"
    if c.rope.scaling:
        rope += f" ({c.rope.scaling} x{c.rope.factor:g})"
    if c.rope_local is not None and c.layer_types:
        rope += f", local theta {c.rope_local.theta:g}"
    out.append(rope)
    if c.qkv_bias:
        out.append("qkv bias")
    if c.qk_norm:
        out.append("q/k norm")
    if c.post_norms:
        out.append("sandwich norms")
    if c.norm_offset:
        out.append("norm (1 + w)")
    if c.embed_scale:
        out.append("embeddings x sqrt(hidden)")
    if c.activation != "silu":
        out.append(c.activation)
    if c.layer_types:
        n = sum(t == "sliding" for t in c.layer_types)
        out.append(f"sliding window {c.sliding_window} on {n}/{c.num_layers} layers")
    if c.attn_logit_softcap:
        out.append(f"attention softcap {c.attn_logit_softcap:g}")
    if c.final_logit_softcap:
        out.append(f"final softcap {c.final_logit_softcap:g}")
    return out


def info_dict(info: ModelInfo) -> dict[str, Any]:
    """The facts `model-info` prints, as plain JSON-able values."""
    c: ModelConfig = info.config
    r = info.resolved
    return {
        "source": r.source,
        "kind": r.kind,
        "location": r.location,
        "family": c.family,
        "layers": c.num_layers,
        "heads": c.num_heads,
        "kv_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "hidden": c.hidden_size,
        "mlp": c.intermediate_size,
        "vocab": c.vocab_size,
        "context_length": c.max_position_embeddings,
        "tied_embeddings": c.tie_word_embeddings,
        "parameters": c.num_params(),
        "stored_parameters": info.stored_params,
        "weight_bytes": memory_for_weights(c),
        "file_bytes": info.file_bytes,
        "tensor_types": info.tensor_types,
        "features": _features(c),
    }


def format_info(info: ModelInfo) -> str:
    """The facts as an aligned two-column table, one fact a line."""
    d = info_dict(info)
    kind = {"preset": "preset (random init)", "gguf": "GGUF file", "hf_folder": "Hugging Face folder",
            "hub": "Hugging Face Hub repo"}[d["kind"]]
    where = kind if d["location"] == d["source"] else f"{kind}: {d['location']}"
    if d["file_bytes"] is not None:
        where += f", {_bytes(d['file_bytes'])} on disk"
    if d["tensor_types"]:
        where += " (" + ", ".join(f"{k} x{v}" for k, v in d["tensor_types"].items()) + ")"
    mem = " | ".join(f"{k} {_bytes(v)}" for k, v in d["weight_bytes"].items())
    rows = [
        ("model", f"{d['source']}  [{where}]"),
        ("family", d["family"]),
        ("layers", str(d["layers"])),
        ("attention", f"{d['heads']} heads, {d['kv_heads']} kv heads, head dim {d['head_dim']}"),
        ("hidden", str(d["hidden"])),
        ("mlp", str(d["mlp"])),
        ("vocab", str(d["vocab"])),
        ("context length", str(d["context_length"])),
        ("tied embeddings", "yes" if d["tied_embeddings"] else "no"),
        ("parameters", _count(d["parameters"])),
        ("weight memory", mem),
        ("features", ", ".join(d["features"])),
    ]
    if d["stored_parameters"] is not None and d["stored_parameters"] != d["parameters"]:
        rows.insert(10, ("stored parameters", _count(d["stored_parameters"])))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
