"""`tempax tokenizer train FILES --vocab-size N --out DIR` and `tempax tokenizer extend MODEL --tokens ... --out DIR`.

The work is in `tempax.data.tokenizer_train`; this module parses arguments and prints.
"""

from __future__ import annotations

import argparse
import json
import time
from tempax.data.tokenizer_train import (
    corpus_texts, describe_tokenizer, extend_model, heldout_report, save_tokenizer, train_bpe,
)
from tempax.models.registry import load_tokenizer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="tokenizer_command", metavar="SUBCOMMAND", required=True)
    t = sub.add_parser("train", help="train a byte-level BPE tokenizer (special tokens, ChatML template)")
    t.add_argument("files", nargs="+", metavar="FILE", help="corpus: dataset files (any row kind) or .txt files")
    t.add_argument("--vocab-size", type=int, required=True, help="tokens in the vocabulary (incl. 256 bytes)")
    t.add_argument("--out", required=True, help="folder to save the tokenizer to")
    t.add_argument("--min-frequency", type=int, default=2, help="merge pairs seen at least this often")
    t.add_argument("--heldout", nargs="*", default=[], metavar="FILE",
                   help="held-out files: report round-trip exactness and tokens per character on them")
    t.add_argument("--compare", metavar="MODEL", help="also report MODEL's tokenizer's tokens per character")

    e = sub.add_parser("extend", help="add tokens to a model's tokenizer and grow its embedding / LM head")
    e.add_argument("model", metavar="MODEL", help="model source (registered name, .gguf, HF folder, Hub id)")
    e.add_argument("--tokens", nargs="*", default=[], help="tokens to add")
    e.add_argument("--tokens-file", help="a file with one token per line to add")
    e.add_argument("--out", required=True, help="folder for the extended model + tokenizer (HF layout)")


def run(args: argparse.Namespace) -> int:
    return _train(args) if args.tokenizer_command == "train" else _extend(args)


def _train(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    tok = train_bpe(corpus_texts(args.files), args.vocab_size, min_frequency=args.min_frequency)
    save_tokenizer(tok, args.out)
    out = {"out": args.out, **describe_tokenizer(tok), "train_seconds": round(time.perf_counter() - start, 1)}
    if args.heldout:
        compare = {args.compare: load_tokenizer(args.compare)} if args.compare else None
        out.update(heldout_report(tok, list(corpus_texts(args.heldout)), compare))
    print(json.dumps(out, indent=2))
    return 0


def _extend(args: argparse.Namespace) -> int:
    tokens = list(args.tokens)
    if args.tokens_file:
        with open(args.tokens_file, encoding="utf-8") as f:
            tokens += [line.rstrip("\n") for line in f if line.strip()]
    ext = extend_model(args.model, tokens, args.out)
    print(f"added {len(ext.added)} tokens ({', '.join(f'{t}={i}' for t, i in ext.added.items())}); embedding rows "
          f"{ext.old_vocab} -> {ext.new_vocab} (new rows = mean of the old); saved to {ext.folder}")
    print(f"continue pre-training with: tempax pretrain model.source={ext.folder} ...")
    return 0
