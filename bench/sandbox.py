"""The sandbox's throughput: programs per second through `Sandbox.run_many`, and the overhead of one program.

    python bench/sandbox.py                      # 32 programs, workers = the CPU count
    python bench/sandbox.py --programs 64 --workers 2
    python bench/sandbox.py --record bench/records/code.jsonl   # ... and its figures onto the results page

Three measurements, each printed as one JSON line naming the CPU (`tempax.runtime.host.cpu_line`):

  overhead    one empty program (`pass`) at a time, `--repeats` times: the wall time of a start to finish in the
              sandbox, against a bare `python -I -c pass` subprocess (the interpreter's own start-up), so the
              difference is what the isolation costs;
  throughput  `--programs` empty programs through `run_many` with `--workers` at a time: programs per second;
  code task   `--programs` harnessed answers of the code task (the reference solution plus 8 hidden tests each)
              through `run_many`: what the code_tests reward pays per completion.

On a shared machine the wall times measure the neighbours too; each line carries the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tempax.runtime.host import cpu_line  # noqa: E402
from tempax.data.tasks.code import generate_code_problems  # noqa: E402
from tempax.rewards.code import extract_program, harnessed_program  # noqa: E402
from tempax.rewards.sandbox import Sandbox, SandboxConfig, default_interpreter  # noqa: E402


def emit(record: dict, lines: list[dict]) -> None:
    record.update(cpu=cpu_line(), load_average=round(os.getloadavg()[0], 2))
    print(json.dumps(record), flush=True)
    lines.append(record)


def figure_records(lines: list[dict], command: str) -> list[dict]:
    """The three measurements as figure records of the results page's "code" topic."""
    by_bench = {line["bench"]: line for line in lines}
    overhead, empty, task = (by_bench["sandbox_overhead"], by_bench["sandbox_throughput"],
                             by_bench["sandbox_code_task"])
    load = max(line["load_average"] for line in lines)
    return [
        {"kind": "figure", "topic": "code", "what": "the sandbox's overhead per program (median of "
         f"{overhead['repeats']} empty programs, one at a time, against a bare `python -I -c pass`)",
         "figure": f"{overhead['overhead_s_median'] * 1000:.1f} ms ({overhead['sandbox_s_median'] * 1000:.1f} ms "
                   f"sandboxed vs {overhead['bare_python_s_median'] * 1000:.1f} ms bare; load average {load})",
         "command": command, "cpu": overhead["cpu"]},
        {"kind": "figure", "topic": "code", "what": f"sandbox throughput, {empty['workers']} programs at once",
         "figure": f"{empty['programs_per_s']} empty programs/s; {task['programs_per_s']} code-task answers/s "
                   f"({task['tests_per_program']} hidden tests each, {task['programs']} programs)",
         "command": command, "cpu": empty["cpu"]},
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--programs", type=int, default=32)
    parser.add_argument("--workers", type=int, default=None, help="programs at once (default: the CPU count)")
    parser.add_argument("--repeats", type=int, default=8, help="one-at-a-time runs for the overhead")
    parser.add_argument("--record", default=None, help="append the figures to this records file (topic 'code')")
    args = parser.parse_args(argv)
    lines: list[dict] = []
    sandbox = Sandbox(SandboxConfig(workers=args.workers))
    sandbox.run("pass")  # the first start reads the launcher and interpreter from disk
    python = default_interpreter()
    bare, boxed = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        subprocess.run([python, "-I", "-c", "pass"], check=True)
        bare.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        assert sandbox.run("pass").ok
        boxed.append(time.perf_counter() - t0)
    emit({"bench": "sandbox_overhead", "repeats": args.repeats, "sandbox_s_median": round(statistics.median(boxed), 4),
          "bare_python_s_median": round(statistics.median(bare), 4),
          "overhead_s_median": round(statistics.median(boxed) - statistics.median(bare), 4)}, lines)
    t0 = time.perf_counter()
    results = sandbox.run_many(["pass"] * args.programs)
    elapsed = time.perf_counter() - t0
    assert all(r.ok for r in results)
    emit({"bench": "sandbox_throughput", "programs": args.programs, "workers": sandbox.workers,
          "seconds": round(elapsed, 3), "programs_per_s": round(args.programs / elapsed, 2)}, lines)
    rows = generate_code_problems(args.programs, split="test")
    programs = [harnessed_program(extract_program(r["target"]), r["entry_point"], [t["args"] for t in r["tests"]])
                for r in rows]
    t0 = time.perf_counter()
    results = sandbox.run_many(programs)
    elapsed = time.perf_counter() - t0
    assert all(r.ok for r in results)
    emit({"bench": "sandbox_code_task", "programs": args.programs, "tests_per_program": len(rows[0]["tests"]),
          "workers": sandbox.workers, "seconds": round(elapsed, 3), "programs_per_s": round(args.programs / elapsed, 2)}, lines)
    if args.record:
        command = "python bench/sandbox.py" + (f" --programs {args.programs}" if args.programs != 32 else "") + (
            f" --workers {args.workers}" if args.workers else "")
        with open(args.record, "a", encoding="utf-8") as f:
            for record in figure_records(lines, command):
                f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
