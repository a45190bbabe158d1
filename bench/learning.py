"""The learning table: each algorithm's recipe, run in its own process, and its held-out metric before -> after.

    python bench/learning.py                        # every row below, at its recipe's settings (long on CPU)
    python bench/learning.py --only rft,dpo         # some rows
    python bench/learning.py --table runs/learning  # print the table of runs already made there, run nothing

Each row runs `python -m tempax.cli.main COMMAND --config RECIPE train.run_dir=OUT/NAME [overrides]` in a child
process, takes its wall time and its CPU time (user + system of the child, `resource.getrusage`), then reads what
the run wrote:
  * generation-evaluated algorithms (GRPO, RFT): eval.json, greedy answer accuracy on the held-out problems
    before and after training; the 95% interval is Newcombe's for the difference of two proportions
    (`tempax.eval.metrics.difference_interval`; it treats the two evaluations as independent samples, which
    over-states the uncertainty of a before/after on the same problems, so a gain beyond it is a real gain);
  * held-out-loss algorithms (DPO, KTO, the reward model): eval_summary.json, preference accuracy on the held-out
    pairs before and after (`eval_pairs` of them), with the same interval.
The baseline a row beats is its starting model (the metric before training). Rows a recipe cannot evaluate before
training show '-' there. Printed as one Markdown table with the CPU named.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tempax.eval.metrics import difference_interval, wilson_interval  # noqa: E402


@dataclass(frozen=True)
class Row:
    """One algorithm's recipe, what it trains on, and which of its files holds the metric."""

    name: str
    command: str
    recipe: str
    data: str
    reads: str  # "generation": eval.json answer accuracy; "pairs": eval_summary.json accuracy
    overrides: tuple[str, ...] = field(default_factory=tuple)


ROWS = (
    Row("DPO", "dpo", "recipes/dpo_smollm2_lora.yaml", "hh-rlhf pairs", "pairs", ("eval_before=true",)),
    Row("KTO", "kto", "recipes/kto_smollm2_lora.yaml", "hh-rlhf, unpaired", "pairs", ("eval_before=true",)),
    Row("reward model", "reward-model", "recipes/reward_model_smollm2_lora.yaml", "hh-rlhf pairs", "pairs",
        ("eval_before=true",)),
    Row("GRPO", "grpo", "recipes/grpo_gsm8k_smollm2.yaml", "GSM8K problems + checker", "generation"),
    Row("RFT", "rft", "recipes/rft_arithmetic_smollm2.yaml", "arithmetic problems + checker", "generation"),
)


@dataclass
class Outcome:
    """A row's measured numbers (None where the run did not produce them)."""

    row: Row
    wall_s: float | None = None
    cpu_s: float | None = None
    before: tuple[int, int] | None = None  # (successes, n)
    after: tuple[int, int] | None = None
    error: str | None = None


def read_counts(row: Row, run_dir: str) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """(before, after) as (successes, n) of the row's metric, from the files its run wrote."""
    if row.reads == "generation":
        with open(os.path.join(run_dir, "eval.json")) as f:
            stages = json.load(f)

        def counts(stage: str) -> tuple[int, int] | None:
            greedy = (stages.get(stage) or {}).get("greedy")
            if not greedy:
                return None
            n = int(greedy["num_problems"])
            return round(greedy["answer_accuracy"] * n), n

        return counts("before"), counts("after")
    with open(os.path.join(run_dir, "eval_summary.json")) as f:
        summary = json.load(f)
    n = int(summary.get("eval_pairs") or 0)

    def pairs(stage: str) -> tuple[int, int] | None:
        metrics = summary.get(stage)
        if not metrics or "accuracy" not in metrics or n < 1:
            return None
        return round(metrics["accuracy"] * n), n

    return pairs("before"), pairs("after")


def run_row(row: Row, out_dir: str) -> Outcome:
    """Runs the row's recipe in a child process and reads its numbers."""
    run_dir = os.path.join(out_dir, row.name.replace(" ", "_"))
    cmd = [sys.executable, "-m", "tempax.cli.main", row.command, "--config", row.recipe,
           f"train.run_dir={run_dir}", "train.progress_bar=false", *row.overrides]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(run_dir + ".log", "w") as f:
        f.write(proc.stdout + proc.stderr)
    outcome = Outcome(row, wall_s=wall, cpu_s=cpu)
    if proc.returncode != 0:
        outcome.error = f"exit status {proc.returncode} (see {run_dir}.log)"
        return outcome
    outcome.before, outcome.after = read_counts(row, run_dir)
    return outcome


def _percent(counts: tuple[int, int] | None) -> str:
    if counts is None:
        return "-"
    k, n = counts
    lo, hi = wilson_interval(k, n)
    return f"{100 * k / n:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] of {n}"


def table(outcomes: list[Outcome], cpu: str) -> str:
    """The Markdown learning table of the outcomes."""
    lines = [f"Held-out gains at each recipe's settings ({cpu}; 95% intervals):", "",
             "| algorithm | data | budget wall / CPU s | metric before -> after | gain, 95% interval | baseline |",
             "|---|---|---|---|---|---|"]
    for o in outcomes:
        metric = "answer accuracy" if o.row.reads == "generation" else "preference accuracy"
        budget = f"{o.wall_s:.0f} / {o.cpu_s:.0f}" if o.wall_s is not None else "-"
        if o.error:
            lines.append(f"| {o.row.name} | {o.row.data} | {budget} | failed: {o.error} | - | - |")
            continue
        gain = "-"
        if o.before and o.after:
            d, lo, hi = difference_interval(o.after[0], o.after[1], o.before[0], o.before[1])
            verdict = "beyond" if lo > 0 else ("below" if hi < 0 else "inside")
            gain = f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] ({verdict} its interval)"
        lines.append(f"| {o.row.name} | {o.row.data} | {budget} | {metric}: {_percent(o.before)} -> "
                     f"{_percent(o.after)} | {gain} | the starting model |")
    return "\n".join(lines)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="comma-separated row names (default: all)")
    parser.add_argument("--out", default="runs/learning", help="where the runs go")
    parser.add_argument("--table", default=None, metavar="OUT",
                        help="print the table of the runs already in OUT (no budgets), run nothing")
    args = parser.parse_args(argv)
    names = {n.strip().lower() for n in args.only.split(",")} if args.only else None
    rows = [r for r in ROWS if names is None or r.name.lower() in names or r.command in names]
    outcomes = []
    for row in rows:
        if args.table:
            o = Outcome(row)
            try:
                o.before, o.after = read_counts(row, os.path.join(args.table, row.name.replace(" ", "_")))
            except OSError as e:
                o.error = str(e)
        else:
            print(f"running {row.name}: tempax {row.command} --config {row.recipe}", file=sys.stderr, flush=True)
            o = run_row(row, args.out)
        outcomes.append(o)
    print(table(outcomes, cpu_name()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
