"""`tempax score MODEL ...`: rate (prompt, response) pairs with a reward model saved by `tempax reward-model`
(MODEL: that run's directory, or the `reward_model/` folder in it).

Inputs, any mix:
  --prompt TEXT --response TEXT        one pair from the command line (repeat both, in order, for more);
  --input FILE                         a dataset (JSON Lines, JSON, parquet, gzip; see `tempax.data.sources`)
                                       whose rows are either
                                         {"prompt": str | messages, "response" | "completion": str | messages}
                                       or preference pairs {"prompt"?, "chosen", "rejected"} (HH-RLHF dialogues
                                       too), which get both sides scored plus pairwise accuracy.
Malformed rows are skipped, counted and reported (never fatal unless nothing is left). Scores go to stdout, or
one JSON object per row (the row plus `score`, or `chosen_score` / `rejected_score`) to `--output FILE`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from tempax.errors import ConfigError, DataError
from tempax.data.formats import RowError, as_turns
from tempax.data.preference import parse_preference_row
from tempax.data.report import DataReport
from tempax.data.sources import as_rows, iter_rows, read_rows
from tempax.progress import work_bar

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


def _response_of(data: dict[str, Any]) -> Any:
    for key in ("response", "completion"):
        if data.get(key) is not None:
            return data[key]
    return None


def _parse_single(data: dict[str, Any]) -> tuple[Any, Any]:
    """(prompt, response) of a {prompt, response|completion} row; RowError for a malformed one."""
    if data.get("prompt") is None:
        raise RowError("missing_field", f"missing field 'prompt' (row has {sorted(data)})")
    response = _response_of(data)
    if response is None:
        raise RowError("missing_field", f"missing field 'response' or 'completion' (row has {sorted(data)})")
    prompt = as_turns(data["prompt"], "user", "prompt")
    try:
        reply = as_turns(response, "assistant", "response")
    except RowError as e:
        raise RowError("empty_response" if e.reason == "empty_content" else e.reason, e.detail) from None
    return prompt, reply


def score_rows(
    scorer: Any, rows: list[Any], *, name: str = "<input>", progress: bool | None = False
) -> tuple[list[dict[str, Any]], Any, dict[str, float]]:
    """Scores dataset rows; returns (output records, DataReport, summary).

    A row with `chosen` and `rejected` is a preference pair (both sides scored, `chosen_score` /
    `rejected_score`); otherwise it needs `prompt` and `response` (or `completion`) and gets `score`.
    `progress` is `tempax.progress.work_bar`'s `enabled` for the bar over the scored sequences.
    """
    rows = as_rows(rows)
    report = DataReport(name=name)
    report.total = len(rows)
    seqs: list[list[int]] = []
    jobs: list[tuple[dict[str, Any], str, int]] = []  # (row data, kind, index of its first sequence)
    for row in rows:
        if row.data is None:
            report.skip(row.where, row.reason, row.error or "")
            continue
        data = row.data
        try:
            if "chosen" in data or "rejected" in data:
                msgs = parse_preference_row(data)
                jobs.append((data, "pair", len(seqs)))
                seqs += [scorer.encode(msgs.prompt, msgs.chosen), scorer.encode(msgs.prompt, msgs.rejected)]
            else:
                prompt, reply = _parse_single(data)
                jobs.append((data, "single", len(seqs)))
                seqs.append(scorer.encode(prompt, reply))
        except RowError as e:
            report.skip(row.where, e.reason, e.detail)
            continue
        report.kept += 1
    scores: list[float] = []
    step = max(int(getattr(scorer, "batch_size", 1)), 1)  # one forward pass at a time, so the bar moves
    with work_bar(len(seqs), f"scoring {os.path.basename(name)}", unit="seq", enabled=progress) as bar:
        for start in range(0, len(seqs), step):
            scores += scorer.score_ids(seqs[start:start + step])
            bar.update(len(seqs[start:start + step]))
    records: list[dict[str, Any]] = []
    singles: list[float] = []
    margins: list[float] = []
    for data, kind, i in jobs:
        if kind == "pair":
            c, r = scores[i], scores[i + 1]
            margins.append(c - r)
            records.append({**data, "chosen_score": c, "rejected_score": r})
        else:
            singles.append(scores[i])
            records.append({**data, "score": scores[i]})
    summary: dict[str, float] = {}
    if singles:
        summary.update(num_scored=len(singles), mean_score=sum(singles) / len(singles))
    if margins:
        summary.update(
            num_pairs=len(margins),
            accuracy=sum(m > 0 for m in margins) / len(margins),
            mean_margin=sum(margins) / len(margins),
        )
    return records, report, summary


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
        from itertools import islice


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
