"""Code RL on the real model: SmolLM2-135M-Instruct on the generated code task, base -> GRPO and base -> RFT with
the sandboxed `code_tests` reward, every model scored on the same held-out problems.

    python bench/code_task.py                          # base eval, GRPO, its eval, RFT, its eval (hours on 2 cores)
    python bench/code_task.py --table runs/code_task   # the table of the runs already in the folder, run nothing
    python bench/code_task.py --table runs/code_task --record bench/records/code.jsonl   # ... and onto the page

Steps, each a child process (`tempax ...` as a user runs it), in OUT:
  base.json       `tempax eval smollm2-135m-instruct --task code --num-problems N --samples 4 --out ...`
  grpo/           `tempax grpo --config recipes/grpo_code_smollm2.yaml` as shipped (the Python tool in episodes)
  grpo_eval.json  the same evaluation of the GRPO run dir (its adapters merged)
  rft/            `tempax rft --config recipes/rft_code_smollm2.yaml` as shipped
  rft_eval.json   the same evaluation of the RFT run dir
  STEP.budget.json  wall and CPU seconds (user + system of the child and its children: the sandboxes included)

The recipes' settings are the shipped ones; none was tuned on the held-out problems. The table: greedy pass@1 and
sampled pass@4 (a problem passes when all its hidden tests pass) before -> after, each with its Wilson interval,
and the paired difference against the base model with Newcombe's interval for paired proportions
(`tempax.eval.metrics`), both models scored on the same problems; sampled pass@1 with its interval over samples.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tempax.eval.metrics import paired_difference_interval, wilson_interval  # noqa: E402
from tempax.runtime.host import cpu_line  # noqa: E402

MODEL = "smollm2-135m-instruct"
TRAINED = (("GRPO", "grpo", "recipes/grpo_code_smollm2.yaml"), ("RFT", "rft", "recipes/rft_code_smollm2.yaml"))


def eval_command(source: str, out: str, problems: int, samples: int, max_new_tokens: int) -> list[str]:
    return [sys.executable, "-m", "tempax.cli.main", "eval", source, "--task", "code", "--num-problems",
            str(problems), "--samples", str(samples), "--max-new-tokens", str(max_new_tokens), "--out", out]


def timed(cmd: list[str], log_path: str, budget_path: str) -> int:
    """Runs one child, its output to `log_path`; writes its wall and CPU seconds to `budget_path`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        code = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(budget_path, "w") as f:
        json.dump({"wall_s": time.perf_counter() - start, "cpu_s": cpu, "exit": code}, f)
    return code


def run_all(out: str, problems: int, samples: int, max_new_tokens: int) -> None:
    os.makedirs(out, exist_ok=True)
    path = lambda name: os.path.join(out, name)
    timed(eval_command(MODEL, path("base.json"), problems, samples, max_new_tokens), path("base.log"),
          path("base.budget.json"))
    for _, command, recipe in TRAINED:
        run_dir = path(command)
        code = timed([sys.executable, "-m", "tempax.cli.main", command, "--config", recipe,
                      f"train.run_dir={run_dir}"], path(f"{command}.log"), path(f"{command}.budget.json"))
        if code == 0:
            timed(eval_command(run_dir, path(f"{command}_eval.json"), problems, samples, max_new_tokens),
                  path(f"{command}_eval.log"), path(f"{command}_eval.budget.json"))


def outcomes(path: str) -> dict[str, list[bool]] | None:
    """Per problem: greedy pass@1 and sampled pass@k (any of its samples passed), from `tempax eval --out`."""
    try:
        with open(path) as f:
            records = json.load(f)["records"]
    except OSError:
        return None
    found = {"greedy": [bool(r["correct"][0]) for r in records["greedy"]]}
    if records.get("sampled"):
        found["sampled_any"] = [any(r["correct"]) for r in records["sampled"]]
        found["sampled_each"] = [bool(c) for r in records["sampled"] for c in r["correct"]]
    return found


def rate(flags: list[bool]) -> str:
    k, n = sum(flags), len(flags)
    lo, hi = wilson_interval(k, n)
    return f"{100 * k / n:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def gain(after: list[bool], before: list[bool]) -> str:
    d = paired_difference_interval(after, before)
    verdict = "beyond" if d.low > 0 or d.high < 0 else "inside"
    return f"{100 * d.difference:+.1f} [{100 * d.low:+.1f}, {100 * d.high:+.1f}] ({verdict} its interval)"


def budget(out: str, name: str) -> str:
    try:
        with open(os.path.join(out, f"{name}.budget.json")) as f:
            spent = json.load(f)
    except OSError:
        return "-"
    return f"{spent['wall_s']:.0f} / {spent['cpu_s']:.0f}"


def table_rows(out: str) -> list[list[str]]:
    base = outcomes(os.path.join(out, "base.json"))
    if base is None:
        return []
    k = len(base["sampled_each"]) // len(base["sampled_any"]) if "sampled_any" in base else 0
    rows = [["base model", "-", rate(base["greedy"]), "-", rate(base["sampled_any"]) if k else "-", "-",
             rate(base["sampled_each"]) if k else "-"]]
    for name, command, _ in TRAINED:
        after = outcomes(os.path.join(out, f"{command}_eval.json"))
        if after is None:
            rows.append([name, "not run", "-", "-", "-", "-", "-"])
            continue
        rows.append([name, budget(out, command), rate(after["greedy"]), gain(after["greedy"], base["greedy"]),
                     rate(after["sampled_any"]) if k else "-",
                     gain(after["sampled_any"], base["sampled_any"]) if k else "-",
                     rate(after["sampled_each"]) if k else "-"])
    return rows


COLUMNS = ["model", "training wall / CPU s", "greedy pass@1, 95% CI", "greedy gain over base, paired",
           "sampled pass@4, 95% CI", "pass@4 gain over base, paired", "sampled pass@1, 95% CI (per sample)"]


def table(out: str) -> str:
    rows = table_rows(out)
    problems = len(outcomes(os.path.join(out, "base.json"))["greedy"]) if rows else 0
    lines = [f"SmolLM2-135M-Instruct on {problems} held-out code problems ({cpu_line()}):", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/code_task")
    parser.add_argument("--table", metavar="OUT", help="print the table of the runs in OUT, run nothing")
    parser.add_argument("--problems", type=int, default=200, help="held-out problems scored (default 200)")
    parser.add_argument("--samples", type=int, default=4, help="sampled completions per problem (pass@k)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="as the recipes train with")
    parser.add_argument("--record", metavar="FILE", help="append the table as a bench/results.py record")
    parser.add_argument("--notes", default="", help="what else the record should say (e.g. the machine's load)")
    args = parser.parse_args(argv)
    out = args.table or args.out
    if not args.table:
        run_all(out, args.problems, args.samples, args.max_new_tokens)
    print(table(out))
    if args.record:
        record = {"kind": "table", "topic": "code", "title": "Code RL: base -> GRPO and RFT with the sandboxed "
                  "code_tests reward, held-out problems", "columns": COLUMNS, "rows": table_rows(out),
                  "command": "python bench/code_task.py", "cpu": cpu_line(),
                  "notes": "recipes as shipped (recipes/grpo_code_smollm2.yaml, recipes/rft_code_smollm2.yaml); "
                           "every model scored by tempax eval --task code on the same problems; the held-out "
                           "problems are new parameters and tests of the same function families the training "
                           "problems come from (tempax/data/tasks/code.py), so the gain is on those families, not "
                           "on new kinds of function" + (f"; {args.notes}" if args.notes else "")}
        with open(args.record, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
