"""The learning table: each algorithm's recipe, run in its own process, and its held-out metric before -> after.

    python bench/learning.py                        # every row below but the long one, at its recipe's settings
    python bench/learning.py --only dpo,kto         # some rows (the others are listed as not run)
    python bench/learning.py --table runs/learning  # print the table of runs already made there, run nothing
    python bench/learning.py --after-sft RUN[,RUN...]   # (d) - (a) of `tempax demo --compare rl_after_sft=true` runs

Each row runs `python -m tempax.cli.main COMMAND ARGS` in a child process (ARGS: the recipe, the row's run dir
and the row's overrides), takes its wall time and its CPU time (user + system of the child,
`resource.getrusage`; written beside the run as NAME.budget.json so `--table` shows it too), then reads what the
run wrote:
  * "generation" (GRPO on GSM8K): eval.json, greedy answer accuracy on the held-out problems before and after;
  * "pairs" (DPO, KTO, the reward model): eval_summary.json, preference accuracy on the held-out pairs before
    and after (`eval_pairs` of them; the rows ask for 200);
  * "loss" (SFT, distillation): metrics.jsonl, the held-out `eval/<key>` at the first and the last evaluation;
    distillation also runs its CE-only baseline (`loss.alpha=0`) and compares the two at the end;
  * "rm_score" (PPO): eval.json, the reward model's mean score of one sampled response per held-out prompt before
    and after, the paired gain +- its standard error and the KL to the reference;
  * "compare" (GRPO and RFT where demonstrations are scarce): `tempax demo --compare`'s outcomes.jsonl (and
    results.json for the stages' budgets): answers of the warm-start, (b) GRPO and (c) RFT on the same held-out
    problems, each against (a), SFT repeated on the same demonstrations with the same budget and kept at its best
    validation score; and (d), GRPO started from (a) with (b)'s budget, against (a): does RL add to the best SFT?
Intervals are 95%: for proportions Newcombe's (`tempax.eval.metrics`; paired where the per-problem outcomes are
written, else the independent-samples one, which over-states the uncertainty of a before/after on the same items,
so a gain beyond it is a real gain); for PPO's paired score gain +-1.96 s.e.; held-out losses are means over
token batches without per-example values, so they carry no interval. The baseline a row beats is its starting
model unless the row names another. A row that was not run (or whose files are missing) is listed as not run.
Printed as one Markdown table with the CPU named.
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

from tempax.experiments.demo import AFTER_SFT_STAGE, COMPARE_GRPO_STAGE, RFT_STAGE, SCARCE_STAGE  # noqa: E402
from tempax.eval.metrics import (  # noqa: E402
    Z_95, difference_interval, paired_difference_interval, wilson_interval,
)

WARM_START_STAGE = "after SFT"


@dataclass(frozen=True)
class Row:
    """One algorithm's run: `tempax COMMAND ARGS` ({run_dir} and {out} in ARGS are filled in), what it trains on,
    how its metric is read, and for "loss" rows the metric key and an optional baseline run's extra args."""

    name: str
    command: str
    args: tuple[str, ...]
    data: str
    reads: str
    key: str = ""
    baseline_args: tuple[str, ...] = field(default_factory=tuple)
    baseline: str = "the starting model"
    long: str = ""  # why the row is left out of a run without --only (it does not fit the ~15-minute budget)
    tie_before: bool = False  # a "pairs" row scored by implicit rewards: before training they are all 0 (a tie)
    versus: str = ""  # another "pairs" row whose trained accuracy this one is compared with


def _recipe(path: str, *overrides: str) -> tuple[str, ...]:
    return ("--config", path, "train.run_dir={run_dir}", "train.progress_bar=false", *overrides)


# Preference rows score 200 held-out hh-rlhf pairs (the recipes' quick default is 64).
_PAIRS = ("eval.before=true", "data.max_eval_rows=200")

ROWS = (
    Row("SFT", "sft", _recipe("recipes/sft_lora_smollm2.yaml"), "hh-rlhf-sft dialogues", "loss", key="loss"),
    Row("DPO", "dpo", _recipe("recipes/dpo_smollm2_lora.yaml", *_PAIRS), "hh-rlhf pairs", "pairs",
        tie_before=True, baseline="chance (50%): the implicit rewards of the untrained policy all tie"),
    Row("KTO", "kto", _recipe("recipes/kto_smollm2_lora.yaml", *_PAIRS), "hh-rlhf, unpaired", "pairs",
        tie_before=True, versus="DPO", baseline="chance (50%), and DPO on the same 160 pairs"),
    Row("reward model", "reward-model", _recipe("recipes/reward_model_smollm2_lora.yaml", *_PAIRS),
        "hh-rlhf pairs", "pairs"),
    Row("PPO", "ppo", _recipe("recipes/ppo_hh_smollm2_lora.yaml", "reward_model={out}/reward_model"),
        "hh-rlhf prompts + the reward model row's model", "rm_score"),
    Row("GRPO (GSM8K)", "grpo", _recipe("recipes/grpo_gsm8k_smollm2.yaml", "eval.num_problems=200"),
        "GSM8K problems + checker", "generation",
        long="200 GRPO steps of 2 x 8 completions of up to 192 tokens: hours on 2 cores; run it with --only grpo"),
    Row("GRPO and RFT, scarce demonstrations", "demo",
        ("--compare", "--budget", "cpu", "--eval-problems", "200", "--run-dir", "{run_dir}", "evaluate_base=false",
         "progress_bar=false", "validation_problems=100", "rl_after_sft=true", "reference=false"),
        "64 worked arithmetic solutions, then problems + checker", "compare",
        baseline="(a) SFT again on the same 64, kept at its best answer accuracy on 100 validation problems, "
                 "within the same CPU seconds"),
    Row("distillation", "distill", _recipe("recipes/distill_smollm2.yaml"), "hh-rlhf-sft dialogues", "loss",
        key="ce_loss", baseline_args=("loss.alpha=0",), baseline="CE-only training of the same student"),
)


@dataclass(frozen=True)
class Line:
    """One printed row of the table."""

    algorithm: str
    data: str
    budget: str
    metric: str
    gain: str
    baseline: str


@dataclass
class Outcome:
    """A row's run: its budget and the table lines read from its files (or why there are none)."""

    row: Row
    wall_s: float | None = None
    cpu_s: float | None = None
    lines: list[Line] = field(default_factory=list)
    error: str | None = None


def run_dir_of(row: Row, out_dir: str) -> str:
    return os.path.join(out_dir, row.name.split(",")[0].replace(" ", "_"))


def _percent(counts: tuple[int, int] | None) -> str:
    if counts is None:
        return "-"
    k, n = counts
    lo, hi = wilson_interval(k, n)
    return f"{100 * k / n:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] of {n}"


def _verdict(lo: float, hi: float) -> str:
    return "beyond" if lo > 0 else ("below" if hi < 0 else "inside")


def _points(d: float, lo: float, hi: float) -> str:
    return f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] ({_verdict(lo, hi)} its interval)"


def _budget(wall: float | None, cpu: float | None) -> str:
    return f"{wall:.0f} / {cpu:.0f}" if wall is not None and cpu is not None else "-"


def read_counts(row: Row, run_dir: str) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """(before, after) as (successes, n) of a "generation" or "pairs" row's metric, from the files its run wrote."""
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


def base_logp_ranking(run_dir: str) -> tuple[int, int] | None:
    """(pairs, n) where the untrained model gives the chosen reply the higher mean per-token log-prob: the ranking
    a user has before any preference training (`mean_logp_accuracy` before, in eval_summary.json)."""
    try:
        with open(os.path.join(run_dir, "eval_summary.json")) as f:
            summary = json.load(f)
        n = int(summary["eval_pairs"])
        return round(summary["before"]["mean_logp_accuracy"] * n), n
    except (OSError, KeyError, TypeError, ValueError):
        return None


def _proportion_line(row: Row, budget: str, metric: str, run_dir: str) -> Line:
    before, after = read_counts(row, run_dir)
    gain = "-"
    if row.tie_before:
        # Policy = reference before training: every implicit reward is 0 and the pair a tie, so the "before"
        # accuracy is float rounding; the gain is measured against chance with the trained accuracy's interval.
        shown = f"a tie ({_percent(before)} by rounding)" if before else "a tie"
        baseline = row.baseline
        if after:
            lo, hi = wilson_interval(*after)
            gain = _points(after[0] / after[1] - 0.5, lo - 0.5, hi - 0.5) + " against chance"
            other = os.path.join(os.path.dirname(run_dir), row.versus.replace(" ", "_")) if row.versus else ""
            try:
                versus = read_counts(row, other)[1] if other else None
            except (OSError, KeyError):
                versus = None
            if versus:
                d = difference_interval(after[0], after[1], versus[0], versus[1])
                baseline += f": {row.versus} {_percent(versus)}; difference {_points(*d)}"
            ranked = base_logp_ranking(run_dir)
            if ranked:
                d = difference_interval(after[0], after[1], ranked[0], ranked[1])
                baseline += (f"; the untrained model's own ranking (higher mean log-prob on the chosen reply) "
                             f"{_percent(ranked)}, difference {_points(*d)}")
        return Line(row.name, row.data, budget, f"{metric}: {shown} -> {_percent(after)}", gain, baseline)
    if before and after:
        gain = _points(*difference_interval(after[0], after[1], before[0], before[1]))
    return Line(row.name, row.data, budget, f"{metric}: {_percent(before)} -> {_percent(after)}", gain,
                row.baseline)


def held_out_losses(run_dir: str, key: str) -> tuple[float, float]:
    """The held-out `eval/<key>` at the first and at the last evaluation in the run's metrics.jsonl."""
    values = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if f"eval/{key}" in record:
                values.append(float(record[f"eval/{key}"]))
    if not values:
        raise OSError(f"no eval/{key} in {run_dir}/metrics.jsonl")
    return values[0], values[-1]


def _loss_line(row: Row, budget: str, run_dir: str) -> Line:
    before, after = held_out_losses(run_dir, row.key)
    metric = f"held-out {row.key.replace('_', ' ')} (nats): {before:.3f} -> {after:.3f}"
    if not row.baseline_args:
        return Line(row.name, row.data, budget, metric, f"{after - before:+.3f} (no per-example values: no "
                    "interval)", row.baseline)
    _, base_after = held_out_losses(run_dir + "_baseline", row.key)
    return Line(row.name, row.data, budget, metric, f"{after - base_after:+.3f} against the baseline (no "
                "per-example values: no interval)", f"{row.baseline}: {base_after:.3f}")


def _rm_score_line(row: Row, budget: str, run_dir: str) -> Line:
    with open(os.path.join(run_dir, "eval.json")) as f:
        ev = json.load(f)
    b, a, c = ev["before"], ev["after"], ev["comparison"]
    lo, hi = c["score_gain"] - Z_95 * c["score_gain_sem"], c["score_gain"] + Z_95 * c["score_gain_sem"]
    n = int(a["num_prompts"])
    return Line(row.name, row.data, budget,
                f"reward-model score of {n} held-out prompts: {b['score_mean']:.3f} +- {b['score_sem']:.3f} -> "
                f"{a['score_mean']:.3f} +- {a['score_sem']:.3f}; KL to the reference {a['kl_mean']:.2f} nats",
                f"{c['score_gain']:+.3f} [{lo:+.3f}, {hi:+.3f}] ({_verdict(lo, hi)} its interval; "
                f"{c['score_gain'] / c['score_gain_sem']:.1f} s.e.)" if c["score_gain_sem"] > 0 else
                f"{c['score_gain']:+.3f}", row.baseline)


def _compare_lines(row: Row, run_dir: str) -> list[Line]:
    """(b) GRPO and (c) RFT of a `tempax demo --compare` run: warm-start -> stage (paired interval), and the
    stage against (a) (paired interval); budgets are the stages' own wall / process CPU seconds."""
    outcomes: dict[str, list[bool]] = {}
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    with open(os.path.join(run_dir, "outcomes.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            outcomes[record["stage"]] = record["correct"]
            wall.update(record.get("trained_seconds") or {})
            cpu.update(record.get("trained_cpu_seconds") or {})
    lines = []
    for algorithm, stage, watch in (("GRPO", COMPARE_GRPO_STAGE, "grpo"), ("RFT", RFT_STAGE, "rft")):
        name = f"{algorithm}, scarce demonstrations"
        if stage not in outcomes or WARM_START_STAGE not in outcomes:
            lines.append(Line(name, row.data, "-", "not run", "-", "-"))
            continue
        after, warm = outcomes[stage], outcomes[WARM_START_STAGE]
        gain = paired_difference_interval(after, warm)
        baseline = "-"
        if SCARCE_STAGE in outcomes:
            d = paired_difference_interval(after, outcomes[SCARCE_STAGE])
            a = outcomes[SCARCE_STAGE]
            baseline = (f"{row.baseline}: {_percent((sum(a), len(a)))}; difference "
                        f"{_points(d.difference, d.low, d.high)}")
        lines.append(Line(name, row.data, _budget(wall.get(watch), cpu.get(watch)),
                          f"answer accuracy: {_percent((sum(warm), len(warm)))} (warm-start) -> "
                          f"{_percent((sum(after), len(after)))}",
                          _points(gain.difference, gain.low, gain.high) + ", paired", baseline))
    if AFTER_SFT_STAGE in outcomes and SCARCE_STAGE in outcomes:
        a, d = outcomes[SCARCE_STAGE], outcomes[AFTER_SFT_STAGE]
        gain = paired_difference_interval(d, a)
        versus = "-"
        if COMPARE_GRPO_STAGE in outcomes:
            b = outcomes[COMPARE_GRPO_STAGE]
            vb = paired_difference_interval(d, b)
            versus = (f"(b) GRPO from the warm-start, same CPU seconds: {_percent((sum(b), len(b)))}; difference "
                      f"{_points(vb.difference, vb.low, vb.high)}")
        lines.append(Line("GRPO after the best SFT", row.data, _budget(wall.get("grpo after sft"),
                                                                     cpu.get("grpo after sft")),
                          f"answer accuracy: {_percent((sum(a), len(a)))} ((a), SFT kept on validation) -> "
                          f"{_percent((sum(d), len(d)))}",
                          _points(gain.difference, gain.low, gain.high) + ", paired, against (a)", versus))
    return lines


def read_lines(row: Row, run_dir: str, budget: str) -> list[Line]:
    """The table lines of a row from the files its run wrote (OSError / KeyError where they are missing)."""
    if row.reads == "generation":
        return [_proportion_line(row, budget, "answer accuracy", run_dir)]
    if row.reads == "pairs":
        return [_proportion_line(row, budget, "preference accuracy", run_dir)]
    if row.reads == "loss":
        return [_loss_line(row, budget, run_dir)]
    if row.reads == "rm_score":
        return [_rm_score_line(row, budget, run_dir)]
    if row.reads == "compare":
        return _compare_lines(row, run_dir)
    raise ValueError(f"unknown row kind {row.reads!r}")


def _command(row: Row, run_dir: str, out_dir: str, extra: tuple[str, ...] = ()) -> list[str]:
    args = [a.format(run_dir=run_dir, out=out_dir) for a in row.args]
    return [sys.executable, "-m", "tempax.cli.main", row.command, *args, *extra]


def run_row(row: Row, out_dir: str) -> Outcome:
    """Runs the row (and its baseline run, if any) in child processes and reads its numbers."""
    run_dir = run_dir_of(row, out_dir)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    failed = None
    runs = [(run_dir, ())] + ([(run_dir + "_baseline", row.baseline_args)] if row.baseline_args else [])
    for folder, extra in runs:
        cmd = _command(row, folder, out_dir, extra)
        os.makedirs(out_dir, exist_ok=True)
        with open(folder + ".log", "w") as f:  # written as it runs: a long row can be followed
            proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, stdout=f,
                                  stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            failed = f"exit status {proc.returncode} (see {folder}.log)"
            break
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(run_dir + ".budget.json", "w") as f:
        json.dump({"wall_s": wall, "cpu_s": cpu}, f)
    return read_outcome(row, out_dir, error=failed)


def read_outcome(row: Row, out_dir: str, error: str | None = None) -> Outcome:
    """A row's outcome from what its run left in `out_dir` (the run's files and NAME.budget.json)."""
    run_dir = run_dir_of(row, out_dir)
    outcome = Outcome(row, error=error)
    try:
        with open(run_dir + ".budget.json") as f:
            spent = json.load(f)
        outcome.wall_s, outcome.cpu_s = spent["wall_s"], spent["cpu_s"]
    except OSError:
        pass
    if error is None:
        try:
            outcome.lines = read_lines(row, run_dir, _budget(outcome.wall_s, outcome.cpu_s))
        except (OSError, KeyError) as e:
            outcome.error = "not run" if outcome.wall_s is None else f"no result: {e}"
    return outcome


def table(outcomes: list[Outcome], cpu: str) -> str:
    """The Markdown learning table of the outcomes."""
    lines = [f"Held-out gains at each recipe's settings ({cpu}; 95% intervals):", "",
             "| algorithm | data | budget wall / CPU s | metric before -> after | gain, 95% interval | baseline |",
             "|---|---|---|---|---|---|"]
    for o in outcomes:
        if o.error or not o.lines:
            reason = o.error or "not run"
            if reason == "not run" and o.row.long:
                reason = f"not run by default ({o.row.long})"
            status = reason if reason.startswith("not run") else f"failed: {reason}"
            lines.append(f"| {o.row.name} | {o.row.data} | {_budget(o.wall_s, o.cpu_s)} | {status} | - | - |")
            continue
        for x in o.lines:
            lines.append(f"| {x.algorithm} | {x.data} | {x.budget} | {x.metric} | {x.gain} | {x.baseline} |")
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


def selected(only: str | None) -> list[Row]:
    """The rows `--only` names (by name or command), or every row that fits the budget (not `long`)."""
    if not only:
        return [r for r in ROWS if not r.long]
    names = {n.strip().lower() for n in only.split(",")}
    return [r for r in ROWS if r.name.lower() in names or r.command in names]


def write_page(page: str, text: str, command: str) -> None:
    """Writes the learning table's docs page: what it is, the command that repeats it, the table."""
    os.makedirs(os.path.dirname(page) or ".", exist_ok=True)
    with open(page, "w", encoding="utf-8") as f:
        f.write("# The learning table\n\nWritten by `bench/learning.py`: every algorithm's recipe on the real model "
                "(SmolLM2-135M-Instruct), each row in its own process, with its held-out metric before and after "
                "training, the 95% interval of the gain and the baseline it is measured against. Budgets are the "
                "row's wall and CPU seconds (user + system of its processes) on the CPU named below; how each "
                "metric is read: the module docstring of `bench/learning.py`.\n\n"
                f"`{command}`\n\n{text}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="comma-separated row names or commands (default: all)")
    parser.add_argument("--out", default="runs/learning", help="where the runs go")
    parser.add_argument("--table", default=None, metavar="OUT",
                        help="print the table of the runs already in OUT, run nothing")
    parser.add_argument("--page", default="", help="also write the table to this Markdown file (e.g. "
                        "runs/learning-table.md; the results page takes the rows from --record)")
    parser.add_argument("--after-sft", default=None, metavar="RUN[,RUN...]",
                        help="table (d) GRPO after the best SFT against (a) for these `tempax demo --compare "
                             "rl_after_sft=true` run dirs (one lever each), run nothing")
    parser.add_argument("--record", default=None, metavar="FILE",
                        help="also append the rows that ran as a table record of the results page (topic 'learning')")
    parser.add_argument("--notes", default=None, help="with --record: what the table shows, in words, on the page")
    args = parser.parse_args(argv)
    if args.after_sft:
        from tempax.runtime.host import cpu_line

        record = after_sft_record(args.after_sft.split(","), cpu_line())
        if args.notes:
            record["notes"] = args.notes
        print(f"{record['title']} ({record['cpu']})")
        for row in [record["columns"], *record["rows"]]:
            print("| " + " | ".join(str(cell) for cell in row) + " |")
        if args.record:
            with open(args.record, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        return 0
    chosen = selected(args.only)
    outcomes = []
    for row in ROWS:
        if args.table:
            outcomes.append(read_outcome(row, args.table))
        elif row in chosen:
            print(f"running {row.name}: tempax {row.command} {' '.join(row.args)}", file=sys.stderr, flush=True)
            outcomes.append(run_row(row, args.out))
        else:
            outcomes.append(read_outcome(row, args.out))
    text = table(outcomes, cpu_name())
    print(text)
    command = "python bench/learning.py" + (f" --only {args.only}" if args.only else "")
    if args.page:
        write_page(args.page, text, command)
    if args.record:
        with open(args.record, "a", encoding="utf-8") as f:
            record = table_record(outcomes, cpu_name(), command)
            if args.notes:
                record["notes"] = args.notes
            f.write(json.dumps(record) + "\n")
    return 0


def after_sft_record(run_dirs: list[str], cpu: str) -> dict:
    """RL on top of SFT, one row per `tempax demo --compare rl_after_sft=true` run (each a lever on (d)): (a)'s
    and (d)'s held-out answers, the paired (d) - (a), (d)'s steps and seconds against the budget, and the step
    (a) kept on validation."""
    rows = []
    for run_dir in run_dirs:
        with open(os.path.join(run_dir, "results.json")) as f:
            saved = json.load(f)
        outcomes = {}
        with open(os.path.join(run_dir, "outcomes.jsonl")) as f:
            for line in f:
                record = json.loads(line)
                outcomes[record["stage"]] = record["correct"]
        a, d = outcomes[SCARCE_STAGE], outcomes[AFTER_SFT_STAGE]
        gain = paired_difference_interval(d, a)
        budget = saved["comparison"]["budget"]
        after = budget["stages"][AFTER_SFT_STAGE]
        validation = budget.get("validation")
        rows.append([", ".join(saved["config"].get("after_sft_overrides") or []) or "as (b)",
                     _percent((sum(a), len(a))), _percent((sum(d), len(d))),
                     _points(gain.difference, gain.low, gain.high),
                     f"{after['steps']} steps, {after['cpu_seconds']:.0f} s CPU (budget {budget['budget_seconds']:.0f})",
                     f"step {validation['kept_step']} ({100 * validation['kept_score']:.1f}% of "
                     f"{validation['problems']})" if validation else "last step (no validation)"])
    return {"kind": "table", "topic": "learning",
            "title": "RL on top of SFT: (d) GRPO started from (a), SFT on the 64 demonstrations kept at its best "
                     "validation score, for (b) GRPO's CPU seconds; held-out arithmetic answers, greedy",
            "columns": ["(d)'s settings beyond the demo's GRPO", "(a) answers", "(d) answers", "(d) - (a), paired",
                        "(d) trained", "(a) kept at, validation answers"],
            "rows": rows, "command": "tempax demo --compare --budget cpu --eval-problems 200 evaluate_base=false "
            "validation_problems=100 rl_after_sft=true reference=false [rft=null after_sft_overrides=[...]]; "
            "python bench/learning.py --after-sft RUN,...", "cpu": cpu}


def table_record(outcomes: list[Outcome], cpu: str, command: str) -> dict:
    """The lines of the rows that ran as a table record of the results page (`bench/results.py`)."""
    rows = [[x.algorithm, x.data, x.budget, x.metric, x.gain, x.baseline]
            for o in outcomes if not o.error for x in o.lines]
    return {"kind": "table", "topic": "learning", "title": "The learning table, rows of one run",
            "columns": ["algorithm", "data", "budget wall / CPU s", "metric before -> after", "gain, 95% interval",
                        "baseline"], "rows": rows, "command": command, "cpu": cpu}


if __name__ == "__main__":
    sys.exit(main())
