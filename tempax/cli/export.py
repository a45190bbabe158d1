"""`tempax export SOURCE OUT [--gguf [--quant TYPE]]`: a run's checkpoint (or any model) for other tools.

SOURCE is a training run's directory or any model source `tempax.load` takes (a Hugging Face folder, a .gguf
file, a registered name, a Hub id, `preset:<name>`). For a run, the model it trained is rebuilt (its
`config.yaml`: model source, LoRA/QLoRA), the trainable arrays of the latest (or `--step`) checkpoint are loaded
and LoRA adapters folded into the weights (`W + alpha/r * A B`, a QLoRA base dequantized first).

OUT is then a Hugging Face folder (config.json + safetensors + tokenizer + a README.md model card + the run's
recipe as tempax_config.yaml), loadable by `transformers.AutoModelForCausalLM.from_pretrained(OUT)` and by
`tempax.load(OUT)`; or, with `--gguf` (or an OUT ending in .gguf), one llama.cpp GGUF file holding the weights in
`--quant` f32|f16|bf16|q8_0|q4_0 (default f16), the tokenizer and the model card as `general.*` metadata
(`tempax.models.gguf_export`, `tempax.cli.model_card`). `--adapters` writes a run's adapters alone in PEFT layout.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any
from tempax.cli import model_card
from tempax.configlib import from_dict
from tempax.errors import CheckpointError, ConfigError
from tempax.models.gguf_export import GGUF_QUANTS, check_exportable, save_gguf
from tempax.models.registry import load
from tempax.models.tokenizer import load_tokenizer

# Modules that load JAX are imported in the functions using them: `tempax COMMAND --help` stays light.


def load_trained_model(run_dir: str, step: int | None = None) -> tuple[Any, Any, dict[str, Any]]:
    """(model with the checkpoint's weights, tokenizer or None, checkpoint meta) of a training run."""
    import yaml

    from tempax.algorithms.common import ModelSpec
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
        tokenizer = load_tokenizer(tok_dir)
    return model, tokenizer, meta


def _check_keys(meta: dict[str, Any], params: dict[str, Any], ckpt_dir: str) -> None:
    saved_keys = meta.get("keys")
    if saved_keys is not None and sorted(saved_keys) != sorted(params):
        raise CheckpointError(
            f"the checkpoint in {ckpt_dir} holds {len(saved_keys)} arrays but the model from config.yaml has "
            f"{len(params)} trainable ones; config.yaml and the checkpoint disagree"
        )


def is_run_dir(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.yaml"))


def export(source: str, out: str, *, step: int | None = None, dtype: str | None = None, adapters_only: bool = False,
           gguf: bool = False, quant: str | None = None, command: str | None = None) -> str:
    """Writes OUT (see the module docstring); returns its path."""
    from flax import nnx

    from tempax.models.lora import has_adapters, merge_lora, save_adapters
    from tempax.models.quant import QuantizedLinear

    gguf = gguf or out.endswith(".gguf")
    if quant is not None and not gguf:
        raise ConfigError("--quant applies to GGUF files; add --gguf (or name OUT *.gguf)")
    if gguf and (adapters_only or dtype):
        raise ConfigError("--gguf writes the merged model in --quant's type; drop --adapters / --dtype")
    run_dir = source if is_run_dir(source) else None
    if run_dir is not None:
        model, tokenizer, meta = load_trained_model(run_dir, step)
    else:
        if step is not None or adapters_only:
            raise ConfigError(f"{source} is not a training run (no config.yaml); --step and --adapters need one")

        model, tokenizer = load(source)
        meta = {}
    if adapters_only:
        if not has_adapters(model):
            raise ConfigError(f"{run_dir} trained every weight (no adapters); export without --adapters")
        save_adapters(model, out, base_model_name_or_path=meta.get("model_source"))
        if tokenizer is not None:
            tokenizer.hf.save_pretrained(out)
        return out
    if has_adapters(model) or any(isinstance(m, QuantizedLinear) for _, m in nnx.iter_modules(model)):
        model = merge_lora(model)
    card = model_card.gather(source=source, run_dir=run_dir, export_command=command)
    if gguf:
        check_exportable(model.config)  # before the notes below: a refused model is the one thing to say
        if tokenizer is None:
            print(f"tempax export: {source} has no tokenizer, so the GGUF carries none and llama.cpp will not run it; "
                  "export a run or a model with a tokenizer", file=sys.stderr)

        return save_gguf(model, out, tokenizer=tokenizer, quant=quant or "f16", metadata=model_card.gguf_metadata(card))
    from tempax.models.hf_io import save_hf_checkpoint

    save_hf_checkpoint(model, out, tokenizer=tokenizer, dtype=dtype)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(model_card.readme(card))
    if card.recipe:
        with open(os.path.join(out, "tempax_config.yaml"), "w") as f:
            f.write(card.recipe)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE",
                        help="a training run's directory, or any model source (HF folder, .gguf, registered name)")
    parser.add_argument("out", metavar="OUT", help="folder for the Hugging Face checkpoint, or the .gguf file")
    parser.add_argument("--step", type=int, help="checkpoint step of a run (default: the latest)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="HF weight dtype (default: the model's)")
    parser.add_argument("--adapters", action="store_true", help="write only the LoRA adapters (PEFT layout)")
    parser.add_argument("--gguf", action="store_true", help="write one llama.cpp GGUF file (implied by OUT.gguf)")

    parser.add_argument("--quant", choices=GGUF_QUANTS,
                        help="GGUF weight type (default f16; q4_0 keeps the output projection in q8_0)")


def export_command(args: argparse.Namespace) -> str:
    """The command line that repeats this export (for the model card)."""
    import shlex

    words = ["tempax", "export", args.source, args.out]
    for flag, value in (("--step", args.step), ("--dtype", args.dtype), ("--quant", args.quant)):
        if value is not None:
            words += [flag, str(value)]
    words += [flag for flag, on in (("--gguf", args.gguf), ("--adapters", args.adapters)) if on]
    return " ".join(shlex.quote(w) for w in words)


def run(args: argparse.Namespace) -> int:
    command = export_command(args)
    path = export(args.source, args.out, step=args.step, dtype=args.dtype, adapters_only=args.adapters,
                  gguf=args.gguf, quant=args.quant, command=command)
    print(f"exported {args.source} -> {path}")
    return 0
