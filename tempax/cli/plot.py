"""`tempax plot RUN_DIR [--out DIR] [--metrics a,b]`: draw a run's metric curves to `<out>/metrics.png` and print
its path (the drawing: `tempax.experiments.plots.plot_run`)."""

from __future__ import annotations

import argparse

from tempax.experiments.plots import DEFAULT_METRICS, plot_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a training run's directory (holds metrics.jsonl)")
    parser.add_argument("--out", help="output folder (default RUN_DIR/plots)")
    parser.add_argument("--metrics", help=f"comma-separated metric names (default {','.join(DEFAULT_METRICS)})")


def run(args: argparse.Namespace) -> int:
    metrics = tuple(m.strip() for m in args.metrics.split(",") if m.strip()) if args.metrics else None
    print(plot_run(args.run_dir, args.out, metrics))
    return 0
