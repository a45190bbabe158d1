"""`tempax score MODEL ...`: rate (prompt, response) pairs with a reward model saved by `tempax reward-model`
(MODEL: that run's directory, or the `reward_model/` folder in it).

Inputs, any mix: `--prompt TEXT --response TEXT` pairs (repeat both, in order, for more) and `--input FILE`, a
dataset of {prompt, response | completion} rows or preference pairs {prompt?, chosen, rejected}, which get both
sides scored plus pairwise accuracy (the rows and the scoring: `tempax.eval.scoring`). Malformed rows are skipped,
counted and reported (never fatal unless nothing is left). Scores go to stdout, or one JSON object per row (the
row plus `score`, or `chosen_score` / `rejected_score`) to `--output FILE`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from itertools import islice
from typing import Any

from tempax.data.sources import as_rows, iter_rows, read_rows
from tempax.errors import ConfigError, DataError
from tempax.eval.scoring import score_rows

# Modules that load JAX are imported in the functions using them: `tempax COMMAND --help` stays light.


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a `tempax reward-model` run's directory, or the reward-model folder it "
                        "wrote (<run_dir>/reward_model)")
    parser.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable; pairs with --response)")
    parser.add_argument("--response", action="append", default=[], help="a response to --prompt (repeatable)")
    parser.add_argument("--input", help="a dataset file of {prompt, response} or {prompt, chosen, rejected} rows")
    parser.add_argument("--split", help="split of a dataset folder or Hub id given to --input")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="score only the first N rows of --input (a quick look at a large file)")
    parser.add_argument("--output", help="write one JSON object per scored row here (JSON Lines)")
    parser.add_argument("--batch-size", type=int, default=8, help="rows per forward pass")
    parser.add_argument("--max-length", type=int, default=None,
                        help="keep at most the last N tokens of each input (default: the length it was trained at)")
    parser.add_argument("--raw", action="store_true",
                        help="score prompt + response as plain text instead of through the chat template")


def run(args: argparse.Namespace) -> int:
    from tempax.models.reward_model import reward_model_folder
    from tempax.rewards.reward_model import RewardScorer

    if len(args.prompt) != len(args.response):
        raise ConfigError(f"got {len(args.prompt)} --prompt and {len(args.response)} --response; pass them in pairs")
    if not args.prompt and not args.input:
        raise ConfigError("nothing to score: pass --prompt TEXT --response TEXT, or --input FILE")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {args.limit}")
    scorer = RewardScorer.from_folder(reward_model_folder(args.model), max_length=args.max_length,
                                      batch_size=args.batch_size, chat=not args.raw)

    rows: list[Any] = [{"prompt": p, "response": r} for p, r in zip(args.prompt, args.response)]
    name = "command line"
    if args.input:
        if args.limit is None:
            read = read_rows(args.input, split=args.split)
        else:  # streamed: the rest of a large file is never read
            read = list(islice(iter_rows(args.input, split=args.split), args.limit))
            print(f"tempax score: scoring the first {len(read)} rows of {args.input} (--limit {args.limit})",
                  file=sys.stderr)
        rows = as_rows(rows, source="command line") + read
        name = args.input
    records, report, summary = score_rows(scorer, rows, name=name, progress=None)
    if report.num_skipped:
        print(report.summary(), file=sys.stderr)
        for where, reason, detail in report.bad_rows[:5]:
            print(f"  skipped {where}: {reason}" + (f" ({detail})" if detail else ""), file=sys.stderr)
    if not records:
        raise DataError(f"{name}: no row could be scored ({dict(report.skipped)})")
    if args.output:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    else:
        for rec in records:
            if "score" in rec:
                print(f"{rec['score']:+.4f}\t{_short(rec.get('response', rec.get('completion')))}")
            else:
                print(f"{rec['chosen_score']:+.4f} vs {rec['rejected_score']:+.4f}\t"
                      f"{'chosen wins' if rec['chosen_score'] > rec['rejected_score'] else 'REJECTED WINS'}")
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in summary.items()}), file=sys.stderr)
    return 0


def _short(value: Any, n: int = 80) -> str:
    text = value if isinstance(value, str) else " ".join(m.get("content", "") for m in value or [])
    text = text.replace("\n", " ")
    return text if len(text) <= n else text[: n - 3] + "..."
