"""`tempax data clean IN OUT [--config C] [key=value ...] [--dry-run]`, `tempax data stats DATA --model M` and
`tempax data episodes --config RECIPE --policy POLICY --out OUT.jsonl [key=value ...]`.

The work is in `tempax.data.clean`, `tempax.data.stats` and `tempax.experiments.episodes`; this module parses
arguments and prints. `episodes` plays the recipe's environment (`env:`) on its task rows (`task:`) with a
scripted policy (`FILE.py:function` or `package.module:function`, called as `policy(messages, task_row)`) or
with the recipe's model sampling (`sample`), and writes the tool-calling transcripts an SFT warm-start trains on.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from tempax.algorithms.registry import load_recipe
from tempax.configlib import describe, load_config, recipe_command
from tempax.data.clean import CleanConfig, check_output, clean_file
from tempax.data.stats import dataset_stats, length_histogram
from tempax.envs.registry import load_object
from tempax.errors import ConfigError
from tempax.models.registry import load_tokenizer
from tempax.train.storage import write_atomic

_OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")  # key.path=value; a path with "=" after a "/" is still a path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)
    # After its first positional, `clean` hands the rest to `clean_parser` (intermixed parsing), so IN, OUT and
    # KEY=VALUE overrides may come before or after the options, as with `tempax sft`; the top-level parser alone
    # would stop at the first positional that follows an option.
    c = sub.add_parser("clean", help="normalise, filter, scrub PII, decontaminate and deduplicate a dataset",
                       description=_CLEAN_HELP)
    _clean_options(c)
    c.add_argument("argv", nargs=argparse.REMAINDER, metavar="IN [OUT] [KEY=VALUE ...]", help=_ITEMS_HELP)

    s = sub.add_parser("stats", help="rows, tokens, length histogram, turns and loss-token share of a dataset")
    s.add_argument("data", metavar="DATA", help="dataset file or folder")
    s.add_argument("--model", "-m", default="smollm2-135m-instruct",
                   help="model whose tokenizer and chat template count the tokens")
    s.add_argument("--seq-len", type=int, default=512, help="report the share of sequences longer than this")
    s.add_argument("--max-rows", type=int, help="look at the first N rows only")
    s.add_argument("--split", help="split of a folder or saved dataset")
    s.add_argument("--png", help="write the length histogram here (default: none)")
    s.add_argument("--json", action="store_true", help="print one JSON object instead of a table")

    e = sub.add_parser("episodes", help="play a recipe's environment with a policy and write tool-calling "
                                        "transcripts for an SFT warm-start", description=__doc__.split("\n\n")[1])
    e.add_argument("--config", "-c", required=True, metavar="RECIPE",
                   help="a recipe with env:, task:, rewards: and model: (a grpo or rft recipe)")
    e.add_argument("--policy", required=True, metavar="POLICY",
                   help="FILE.py:function / package.module:function (a scripted policy), or sample (the model)")
    e.add_argument("--out", required=True, metavar="OUT.jsonl", help="the transcripts, one JSON object a line")
    e.add_argument("--limit", type=int, help="play the first N task rows only")
    e.add_argument("--attempts", type=int, default=1, help="episodes per task row (sampling: several tries)")
    e.add_argument("--min-reward", type=float,
                   help="write only episodes whose total reward reaches this (default: every episode)")
    e.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of --policy sample")
    e.add_argument("--max-new-tokens", type=int, help="most tokens a sampled reply (default: the recipe's)")
    e.add_argument("--seed", type=int, default=0, help="seed of --policy sample")
    e.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides, e.g. env.max_turns=4")


_CLEAN_HELP = ("Streams IN to OUT (JSON Lines, .gz for gzip) through the steps of tempax/data/clean.py and prints a "
               "report of rows kept and dropped per reason.")
_ITEMS_HELP = ("dataset file or folder (jsonl/json/parquet, saved dataset); the cleaned JSON Lines file (.gz for gzip; "
               "omit with --dry-run); config overrides, e.g. near_dedup.threshold=0.8 pii.enabled=true "
               "decontaminate.eval_sets=[gsm8k/test.jsonl]")
_CLEAN_OPTIONS = ("config", "dry_run", "split", "report", "describe", "overwrite")


def _clean_options(c: argparse.ArgumentParser) -> None:
    c.add_argument("--config", "-c", metavar="YAML", help="a clean config (see examples/clean_sft.yaml)")
    c.add_argument("--dry-run", action="store_true", help="count what would be dropped; write no data")
    c.add_argument("--split", help="split of a folder or saved dataset")
    c.add_argument("--report", metavar="JSON", help="report path (default: OUT.report.json; none with --dry-run)")
    c.add_argument("--describe", action="store_true", help="list every config key with its type and help")
    c.add_argument("--overwrite", action="store_true",
                   help="replace an existing OUT and report (OUT may be IN: cleaning in place), once the new file is "
                   "complete; without it they are refused")


def clean_parser() -> argparse.ArgumentParser:
    c = argparse.ArgumentParser(prog="tempax data clean", description=_CLEAN_HELP)
    c.add_argument("items", nargs="*", metavar="IN [OUT] [KEY=VALUE ...]", help=_ITEMS_HELP)
    _clean_options(c)
    return c


def run(args: argparse.Namespace) -> int:
    return {"clean": _clean, "stats": _stats, "episodes": _episodes}[args.data_command](args)


def _clean(args: argparse.Namespace) -> int:
    inner = clean_parser().parse_intermixed_args(args.argv)
    for name in _CLEAN_OPTIONS:  # an option given before IN was taken by the outer parser
        setattr(inner, name, getattr(inner, name) or getattr(args, name))
    args = inner
    if args.describe:
        print(describe(CleanConfig))
        return 0
    if not args.items:
        raise ConfigError("tempax data clean needs IN (the dataset to clean); see tempax data clean --help")
    overrides = [a for a in args.items if _OVERRIDE.match(a)]
    paths = [a for a in args.items if not _OVERRIDE.match(a)]
    if len(paths) > 2:
        raise ConfigError(f"tempax data clean takes IN and OUT, got {len(paths)} paths: {paths}")
    if len(paths) < 2 and not args.dry_run:
        raise ConfigError("tempax data clean needs OUT (the cleaned file), or --dry-run to only count")
    cfg = load_config(CleanConfig, args.config, overrides)
    output = None if args.dry_run else paths[1]
    path = args.report or (None if output is None else output + ".report.json")
    if output is not None:
        check_output(paths[0], output, overwrite=args.overwrite)  # before reading a row
    if path and os.path.lexists(path) and not args.overwrite:
        raise ConfigError(f"report {path} exists; name another --report, or add --overwrite to replace it")
    report = clean_file(paths[0], output, cfg, split=args.split, overwrite=args.overwrite)
    print(report.table())
    if path:
        write_atomic(path, json.dumps(report.to_dict(), indent=2, ensure_ascii=False), what="the cleaning report")
        print(f"report: {path}")
    return 0


def _stats(args: argparse.Namespace) -> int:
    tokenizer = load_tokenizer(args.model)
    stats = dataset_stats(args.data, tokenizer, seq_len=args.seq_len, max_rows=args.max_rows, split=args.split)
    if args.png:
        os.makedirs(os.path.dirname(os.path.abspath(args.png)), exist_ok=True)
        length_histogram(stats, args.png)
    if args.json:
        print(json.dumps({**stats.to_dict(), "model": args.model, "png": args.png}, indent=2))
    else:
        print(f"tokenizer: {args.model}")
        print(stats.table())
        if args.png:
            print(f"histogram: {args.png}")
    if stats.skipped:  # said on stderr too, so neither --json nor a long table hides it
        bad = sum(stats.skipped.values())
        print(f"tempax data stats: warning: {bad} of {stats.rows} rows are malformed and not counted "
              f"({dict(stats.skipped)}); first: {'; '.join(stats.bad_row_lines(3))}", file=sys.stderr)
    return 0


def _episodes(args: argparse.Namespace) -> int:
    from tempax.experiments.episodes import reply_limit_warning, write_episodes  # loads the environments, rewards

    command = recipe_command(args.config) or "grpo"
    cfg = load_recipe(command, args.config, list(args.overrides))
    if getattr(cfg, "env", None) is None or getattr(cfg, "task", None) is None:
        raise ConfigError(f"{args.config}: tempax data episodes needs a recipe with env: and task: (grpo or rft)")
    if args.attempts < 1:
        raise ConfigError(f"--attempts must be >= 1, got {args.attempts}")
    policy = None  # --policy sample: the recipe's model
    if args.policy != "sample":
        policy = load_object(args.policy, "--policy")
        if not callable(policy):
            raise ConfigError(f"--policy={args.policy!r} is not a function (policy(messages, task_row) -> reply)")
    recorded = write_episodes(cfg, command, args.out, policy=policy, limit=args.limit, attempts=args.attempts,
                              min_reward=args.min_reward, temperature=args.temperature,
                              max_new_tokens=args.max_new_tokens, seed=args.seed)
    kept = f" (total reward >= {args.min_reward})" if args.min_reward is not None else ""
    print(f"{args.out}: {recorded.written} of {recorded.played} episodes{kept}; the longest reply takes "
          f"{recorded.longest_reply_tokens} tokens")
    warning = reply_limit_warning(recorded, cfg, command)
    if warning:
        print(warning)
    return 0
