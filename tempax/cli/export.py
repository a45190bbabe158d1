"""`tempax export SOURCE OUT [--gguf [--quant TYPE]]`: a run's checkpoint (or any model) for other tools.

SOURCE is a training run's directory or any model source `tempax.load` takes (a Hugging Face folder, a .gguf
file, a registered name, a Hub id, `preset:<name>`). For a run, the model it trained is rebuilt by
`tempax.train.run_model.load_run` (its `config.yaml`: model source, LoRA/QLoRA; the trainable arrays of the
latest, or `--step`, checkpoint) and LoRA adapters folded into the weights (`W + alpha/r * A B`, a QLoRA base
dequantized first). A damaged latest checkpoint is an error naming the intact steps rather than a silent older
export.

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

from tempax.cli import model_card
from tempax.errors import ConfigError
from tempax.models.gguf_export import GGUF_QUANTS, check_exportable, save_gguf
from tempax.models.registry import is_run_dir, load

# Modules that load JAX are imported in the functions using them: `tempax COMMAND --help` stays light.


def export(source: str, out: str, *, step: int | None = None, dtype: str | None = None, adapters_only: bool = False,
           gguf: bool = False, quant: str | None = None, command: str | None = None) -> str:
    """Writes OUT (see the module docstring); returns its path."""
    from tempax.models.lora import has_adapters, save_adapters
    from tempax.train.run_model import load_run, merged

    gguf = gguf or out.endswith(".gguf")
    if quant is not None and not gguf:
        raise ConfigError("--quant applies to GGUF files; add --gguf (or name OUT *.gguf)")
    if gguf and (adapters_only or dtype):
        raise ConfigError("--gguf writes the merged model in --quant's type; drop --adapters / --dtype")
    run_dir = source if os.path.isdir(source) and is_run_dir(source) else None
    if run_dir is not None:
        trained = load_run(run_dir, step=step, merge=False, fallback=False)
        model, tokenizer, meta = trained.model, trained.tokenizer, trained.meta
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
    model = merged(model)
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
