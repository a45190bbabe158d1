"""`tempax export SOURCE OUT [--gguf [--quant TYPE]] [--step N] [--dtype D] [--adapters] [--overwrite]`: a run's
checkpoint (or any model) as a Hugging Face folder or a llama.cpp GGUF file, with a model card. An existing OUT is
refused unless --overwrite.

The work is `tempax.export.exporter.export` (what is written, from which checkpoint) and
`tempax.export.model_card` (the card); this module parses arguments and prints.
"""

from __future__ import annotations

import argparse

from tempax.export.exporter import export
from tempax.models.gguf_export import GGUF_QUANTS


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
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing OUT (a file, or a folder an earlier export wrote) once the new one "
                        "is complete; without it an existing OUT is refused")


def export_command(args: argparse.Namespace) -> str:
    """The command line that repeats this export (for the model card)."""
    import shlex

    words = ["tempax", "export", args.source, args.out]
    for flag, value in (("--step", args.step), ("--dtype", args.dtype), ("--quant", args.quant)):
        if value is not None:
            words += [flag, str(value)]
    words += [flag for flag, on in (("--gguf", args.gguf), ("--adapters", args.adapters),
                                    ("--overwrite", args.overwrite)) if on]
    return " ".join(shlex.quote(w) for w in words)


def run(args: argparse.Namespace) -> int:
    command = export_command(args)
    path = export(args.source, args.out, step=args.step, dtype=args.dtype, adapters_only=args.adapters,
                  gguf=args.gguf, quant=args.quant, command=command, overwrite=args.overwrite)
    print(f"exported {args.source} -> {path}")
    return 0
