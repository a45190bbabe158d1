"""Asynchronous GRPO: steps/s of the synchronous loop against one rollout worker beside the trainer.

    python bench/async_rl.py                    # every mode in its own process; writes docs/measurements/async-rl.md
    python bench/async_rl.py --one async-s1     # one measurement in this process (what the driver spawns)

The work is bench/grpo_step.py's `grpo_step` workload (../shared/bench/workloads.json: bench-small shapes, LoRA
rank 16, 2 prompts x 4 completions x 64 new tokens, reference log-probs, one AdamW update), run for more steps.
Modes:

    sync-2core   grpo.workers 0, the trainer process on both cores (the default)
    sync-1core   grpo.workers 0, the trainer process pinned to core 0
    async-s1     grpo.workers 1, max_staleness 1: trainer pinned to core 0, the worker to core 1
    async-s2     grpo.workers 1, max_staleness 2: the same pinning

Reported per mode: the median wall time of a step over the measured steps (steps/s is its inverse), the median
generation and training times, and for the worker modes the overlap: the time within the measured steps during
which the worker generated while the trainer was busy with something other than waiting for it, over the wall
time of those steps. A speed figure is a ratio between modes measured in one invocation on the same machine;
the page names the CPU and the load.
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
PAGE = os.path.join(ROOT, "docs", "measurements", "async-rl.md")

# mode -> (workers, max_staleness, core of the trainer process or None for all)
MODES = {"sync-2core": (0, 0, None), "sync-1core": (0, 0, 0), "async-s1": (1, 1, 0), "async-s2": (1, 2, 0)}
STEPS = {"warmup": 2, "measured": 5}


def measure(mode: str, size: str, steps: dict | None = None) -> dict:
    workers, max_staleness, core = MODES[mode]
    if core is not None:
        os.sched_setaffinity(0, {core})  # before JAX starts its threads
    sys.path.insert(0, HERE)
    sys.path.insert(0, ROOT)
    from grpo_step import build

    from tempax.algorithms.grpo.source import grpo_hooks
    from tempax.rl.workers import RayConfig
    from tempax.train.guards import CollapseGuardConfig
    from tempax.train.hooks import every

    load_before = os.getloadavg()[0]
    changes = {"workers": workers, "max_staleness": max_staleness}
    ray = RayConfig(num_cpus=2, worker_cpus=(1,)) if workers else None
    trainer, source, settings, steps = build(size, steps=steps or STEPS, settings_changes=changes, ray=ray)
    marks: dict[int, float] = {}
    mark = every(1, lambda info: marks.__setitem__(info.step, time.time()))
    try:
        result = trainer.fit(source, hooks=[*grpo_hooks(source, CollapseGuardConfig(enabled=False)), mark])
        overlap = source.queue.overlap(since=marks[steps["warmup"]]) if source.queue is not None else {}
    finally:
        trainer.close()
        source.close()
    measured = [m for _, m in result.history[steps["warmup"]:]]
    med = lambda key: statistics.median(m[key] for m in measured)  # noqa: E731
    out = {
        "mode": mode, "size": size, "workers": workers, "max_staleness": max_staleness, "steps": steps,
        "s_per_step": round(med("perf/step_s"), 3), "steps_per_s": round(1.0 / med("perf/step_s"), 4),
        "step_s": [round(m["perf/step_s"], 3) for m in measured],
        "median_generation_s": round(med("perf/generation_s"), 3), "median_train_s": round(med("perf/train_s"), 3),
        "median_reference_s": round(med("perf/reference_s"), 3),
        "reward_mean": [round(m["reward/total_mean"], 4) for _, m in result.history],
        "load_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    if overlap:
        wall = marks[steps["warmup"] + steps["measured"]] - marks[steps["warmup"]]
        out.update({"overlap_frac": round(overlap["overlapped_s"] / wall, 3),
                    "generation_overlapped_s": round(overlap["overlapped_s"], 2), "measured_wall_s": round(wall, 2),
                    "median_wait_s": round(med("async/wait_s"), 3),
                    "staleness": [m["async/staleness"] for _, m in result.history],
                    "median_sync_bytes": med("async/sync_bytes"), "median_sync_s": round(med("async/sync_s"), 4)})
    return out


def write_page(rows: list[dict], size: str, uptime: str) -> None:
    sys.path.insert(0, ROOT)
    from tempax.runtime.host import cpu_line

    by = {r["mode"]: r for r in rows if "error" not in r}
    base = by.get("sync-2core")
    lines = [
        "# Asynchronous GRPO: one rollout worker beside the trainer",
        "",
        "Written by `python bench/async_rl.py` (bench/async_rl.py says what each mode runs). The "
        "`grpo_step` workload of the shared benchmarks at bench-" + size + "; each mode in its own process, one "
        "after the other; the warm-up (compilation, worker start) and measured step counts of each mode are in its "
        "row below (`steps`).",
        "",
        f"CPU: {cpu_line()}. Before the run, {uptime} (1, 5, 15 min)",
        "",
        "| mode | s/step (median) | steps/s | x sync-2core | generation s | train s | overlap | staleness |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        r = by.get(mode)
        if r is None:
            lines.append(f"| {mode} | failed | | | | | | |")
            continue
        ratio = f"{base['s_per_step'] / r['s_per_step']:.2f}" if base else "-"
        overlap = f"{r['overlap_frac']:.0%}" if "overlap_frac" in r else "-"
        stale = ",".join(str(int(s)) for s in r.get("staleness", [])) or "-"
        lines.append(f"| {mode} | {r['s_per_step']:.2f} | {r['steps_per_s']:.3f} | {ratio} | "
                     f"{r['median_generation_s']:.2f} | {r['median_train_s']:.2f} | {overlap} | {stale} |")
    lines += [
        "",
        "Overlap: seconds within the measured steps during which the worker generated while the trainer was not "
        "waiting for a rollout, over the wall time of those steps. Staleness: policy versions between the weights "
        "that sampled each step's rollout and the weights it trained (the first rollouts are sampled by version 0).",
        "",
        "Mean reward of each step's rollout (the length reward of the workload; random weights and random prompts, "
        "so it shows whether training moves, not task learning):",
        "",
    ]
    for mode in MODES:
        if mode in by:
            lines.append(f"- {mode}: {by[mode]['reward_mean']}")
    lines += ["", "Raw measurements (one JSON object per mode):", "", "```"]
    lines += [json.dumps(r) for r in rows]
    lines += ["```", ""]
    with open(PAGE, "w") as f:
        f.write("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("tiny", "small"), default="small")
    parser.add_argument("--one", choices=tuple(MODES), help="measure one mode in this process, print one JSON line")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes to run (default: all)")
    parser.add_argument("--warmup", type=int, default=STEPS["warmup"], help="warm-up steps per mode")
    parser.add_argument("--measured", type=int, default=STEPS["measured"], help="measured steps per mode")
    parser.add_argument("--previous", help="a file of JSON rows measured earlier (this command's output) to put on "
                                           "the page beside the new ones")
    args = parser.parse_args(argv)
    steps = {"warmup": args.warmup, "measured": args.measured}
    if args.one:
        print(json.dumps(measure(args.one, args.size, steps)), flush=True)
        return 0
    # The load average, as `uptime` prints it (without the clock time, which a docs page must not carry).
    uptime = "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = []
    if args.previous:
        with open(args.previous) as f:
            rows = [json.loads(line) for line in f if line.startswith("{")]
    for mode in args.modes.split(","):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", mode, "--size", args.size,
                              "--warmup", str(args.warmup), "--measured", str(args.measured)],
                             capture_output=True, text=True, cwd=ROOT)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        row = json.loads(lines[-1]) if out.returncode == 0 and lines else {"mode": mode, "error": out.stderr[-1500:]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    write_page(rows, args.size, uptime)
    print(f"wrote {os.path.relpath(PAGE, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
