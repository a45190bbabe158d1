"""Tiny models for tests: a tempax model and the same weights in a transformers model."""

from __future__ import annotations

import functools
import os
import tempfile

import numpy as np
import pytest

from tempax.models.config import ModelConfig
from tempax.models.presets import PRESETS, TINY_FAMILIES, TINY_MOE_FAMILIES, tiny_preset_name

__all__ = ["HEAVY_FAMILIES", "TINY_FAMILIES", "TINY_MOE_FAMILIES", "as_multimodal_checkpoint", "family_cases",
           "tiny_config", "hf_reference_pair", "product_counts", "tiny_tempax_model"]

# The families whose tiny models make a family-by-family test several times slower than the rest: Qwen3.5's hybrid
# stacks (linear-attention blocks beside attention, each its own programs) and Gemma 4's (per-layer inputs, layers
# that share earlier keys, a full layer of its own head shape). In tests parametrized over every family their cases
# run in the heavy tier (`.ci/run`, right after the default suite); each family's own test file keeps its logits,
# cache and gradient checks against transformers in the default suite.
HEAVY_FAMILIES = ("gemma4", "qwen3_5", "qwen3_5_moe")


def family_cases(families) -> list:
    """`pytest.param`s of `families` for a parametrize or fixture list, the `HEAVY_FAMILIES` marked heavy."""
    return [pytest.param(f, marks=pytest.mark.heavy if f in HEAVY_FAMILIES else (), id=f) for f in families]


def tiny_config(family: str) -> ModelConfig:
    return PRESETS[tiny_preset_name(family)]


@functools.lru_cache(maxsize=None)
def _hf_checkpoint(family: str, seed: int = 0) -> str:
    """A transformers model of the tiny config with non-trivial weights, saved to a temp folder (cached)."""
    import torch
    import transformers

    cfg = tiny_config(family)
    hf_cfg = transformers.AutoConfig.for_model(**cfg.to_hf_config())
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            # Norm weights start at 1 (or 0 for Gemma); perturb everything so every weight matters.
            p.add_(torch.randn_like(p) * 0.05)
    folder = tempfile.mkdtemp(prefix=f"tempax-tiny-{family}-")
    model.save_pretrained(folder)
    return folder


def hf_reference_pair(family: str):
    """(transformers model, tempax model) holding the same random weights, in float32."""
    import transformers

    from tempax.models.hf_io import load_hf_checkpoint

    folder = _hf_checkpoint(family)
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    return ref, load_hf_checkpoint(folder)


def tiny_tempax_model(family: str = "llama", seed: int = 0, **changes):
    from flax import nnx

    from tempax.models.decoder import Decoder

    cfg = tiny_config(family)
    if changes:
        cfg = cfg.replace(**changes)
    return Decoder(cfg, rngs=nnx.Rngs(seed))


def random_ids(shape, vocab: int = 128, seed: int = 0) -> np.ndarray:
    return np.random.RandomState(seed).randint(0, vocab, shape).astype(np.int32)


def as_multimodal_checkpoint(text_folder, folder, model_type: str, architecture: str,
                             tower_tensors: dict[str, np.ndarray]) -> None:
    """Writes to `folder` the text-only checkpoint in `text_folder` as a multimodal one publishes its language
    model: tensors under `model.language_model.*`, `tower_tensors` (a vision tower's, a multi-token head's) beside
    them, and the text config as `text_config` of a `model_type` config naming `architecture`."""
    import json
    from pathlib import Path

    from safetensors.numpy import load_file, save_file

    text_folder, folder = Path(text_folder), Path(folder)
    tensors = load_file(str(text_folder / "model.safetensors"))
    renamed = {(k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
               for k, v in tensors.items()}
    folder.mkdir(parents=True, exist_ok=True)
    save_file({**renamed, **tower_tensors}, str(folder / "model.safetensors"))
    text = json.loads((text_folder / "config.json").read_text())
    text.pop("architectures", None)
    (folder / "config.json").write_text(json.dumps(
        {"model_type": model_type, "architectures": [architecture], "text_config": text}))


def product_counts(closed_jaxpr) -> dict[str, int]:
    """How many dense (dot_general) and grouped (ragged_dot_general) products a program holds, its nested programs
    (scans, custom gradients) included: a loop over experts would multiply them by the number of experts."""
    import jax.extend

    counts = {"dot_general": 0, "ragged_dot_general": 0}

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in counts:
                counts[eqn.primitive.name] += 1
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(closed_jaxpr.jaxpr)
    return counts
