"""`tempax model-info SOURCE [--json]`: family, shapes, parameter count and weight memory, without loading weights.

The facts are `tempax.export.model_info` (SOURCE: a model source or a training run's directory); this module
parses arguments and prints.
"""

from __future__ import annotations

import argparse
import json
import sys

from tempax.export.model_info import format_info, info_dict, inspect_source


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE",
                        help="model name, preset:<name>, .gguf file, Hugging Face folder, Hub repo id (owner/name) or "
                        "a training run's directory")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def run(args: argparse.Namespace) -> int:
    info, note = inspect_source(args.source)
    if note:
        print(f"tempax model-info: {note}", file=sys.stderr)
    print(json.dumps(info_dict(info), indent=2) if args.json else format_info(info))
    return 0
