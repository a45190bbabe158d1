"""`tempax export RUN_DIR OUT`: a run's checkpoint as a Hugging Face model folder (adapters merged).

Rebuilds the model the run trained (its `config.yaml`: model source, LoRA/QLoRA), loads the trainable arrays of the
latest (or `--step`) checkpoint, folds LoRA adapters into the weights (`W + alpha/r * A B`, a QLoRA base
dequantized first) and writes config.json + safetensors + the run's tokenizer to OUT, loadable by
`transformers.AutoModelForCausalLM.from_pretrained(OUT)` and by `tempax.load(OUT)`. `--adapters` writes the
adapters alone in PEFT layout instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def load_trained_model(run_dir: str, step: int | None = None) -> tuple[Any, Any, dict[str, Any]]:
    """(model with the checkpoint's weights, tokenizer or None, checkpoint meta) of a training run."""
    import yaml

    from tempax.algorithms.common import ModelSpec
    from tempax.configlib import from_dict
    from tempax.errors import CheckpointError
    from tempax.models.lora import LoraConfig
    from tempax.train.checkpoint import Checkpointer, DamagedCheckpoint
    from tempax.train.state import ModelParts

    cfg_path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(cfg_path):
        raise CheckpointError(f"{cfg_path} not found; RUN_DIR must be the run_dir of a tempax training run")
    with open(cfg_path) as f:
        raw = yaml.safe_load(f) or {}
    spec = from_dict(ModelSpec, raw.get("model") or {})
    lora_cfg = from_dict(LoraConfig, raw["lora"]) if raw.get("lora") else None
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(ckpt_dir):
        raise CheckpointError(f"{run_dir} has no checkpoints/ folder; nothing to export")
    checkpointer = Checkpointer(ckpt_dir, async_save=False)
    if checkpointer.latest_step() is None:
        raise CheckpointError(f"{ckpt_dir} holds no complete checkpoint")
    if step is not None and step not in checkpointer.all_steps():
        raise CheckpointError(f"{ckpt_dir} has no checkpoint of step {step}; its steps: "
                              + ", ".join(map(str, sorted(checkpointer.all_steps()))))
    model, tokenizer = spec.build(seed=int((raw.get("train") or {}).get("seed", 0)))
    trainable: Any = __import__("flax").nnx.Param
    if lora_cfg is not None:
        from flax import nnx

        from tempax.models.lora import apply_lora, lora_filter

        model = apply_lora(model, lora_cfg, rngs=nnx.Rngs(0))
        trainable = lora_filter
    parts, params = ModelParts.split(model, trainable)
    import jax
    import jax.numpy as jnp

    abstract = {k: jax.ShapeDtypeStruct(v.shape, jnp.float32) for k, v in params.items()}
    try:
        meta = checkpointer.read_meta(step)
        _check_keys(meta, params, ckpt_dir)
        restored = checkpointer.restore_params(abstract, step, say=lambda text: print(text, file=sys.stderr))
    except DamagedCheckpoint as e:
        candidates = checkpointer.intact_steps({"params": abstract, "meta": {}}, read_params=abstract)
        intact = [s for s in candidates if s != e.step]
        checkpointer.close()
        way_out = (f"intact checkpoints: {', '.join(map(str, intact))}; export one with --step {intact[0]}"
                   if intact else "no other checkpoint of this run is intact")
        raise CheckpointError(f"{e}; {way_out}") from None
    checkpointer.close()
    restored = {k: v.astype(params[k].dtype) for k, v in restored.items()}
    model = parts.merge(restored)
    tok_dir = os.path.join(run_dir, "tokenizer")
    if os.path.isdir(tok_dir):
        from tempax.models.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(tok_dir)
    return model, tokenizer, meta


def _check_keys(meta: dict[str, Any], params: dict[str, Any], ckpt_dir: str) -> None:
    from tempax.errors import CheckpointError

    saved_keys = meta.get("keys")
    if saved_keys is not None and sorted(saved_keys) != sorted(params):
        raise CheckpointError(
            f"the checkpoint in {ckpt_dir} holds {len(saved_keys)} arrays but the model from config.yaml has "
            f"{len(params)} trainable ones; config.yaml and the checkpoint disagree"
        )


def export_run(run_dir: str, out: str, *, step: int | None = None, dtype: str | None = None,
               adapters_only: bool = False) -> str:
    from tempax.errors import ConfigError
    from tempax.models.hf_io import save_hf_checkpoint
    from tempax.models.lora import has_adapters, merge_lora, save_adapters

    model, tokenizer, meta = load_trained_model(run_dir, step)
    if adapters_only:
        if not has_adapters(model):
            raise ConfigError(f"{run_dir} trained every weight (no adapters); export without --adapters")
        save_adapters(model, out, base_model_name_or_path=meta.get("model_source"))
        if tokenizer is not None:
            tokenizer.hf.save_pretrained(out)
        return out
    from tempax.models.quant import QuantizedLinear
    from flax import nnx

    if has_adapters(model) or any(isinstance(m, QuantizedLinear) for _, m in nnx.iter_modules(model)):
        model = merge_lora(model)
    return save_hf_checkpoint(model, out, tokenizer=tokenizer, dtype=dtype)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a training run's directory")
    parser.add_argument("out", metavar="OUT", help="folder to write the Hugging Face checkpoint to")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="weight dtype (default: the model's)")
    parser.add_argument("--adapters", action="store_true", help="write only the LoRA adapters (PEFT layout)")


def run(args: argparse.Namespace) -> int:
    path = export_run(args.run_dir, args.out, step=args.step, dtype=args.dtype, adapters_only=args.adapters)
    print(f"exported {args.run_dir} -> {path}")
    return 0
