"""The mixture-of-experts step on an accelerator: the op table's column for the machine (on a TPU, megablox's
grouped matmul for the expert products) against the plain column (`jax.lax.ragged_dot`), the same model and
batches.

    python bench/tpu_moe.py                          # sizes small and chip, both columns, train and decode
    python bench/tpu_moe.py --sizes small --record OUT/tpu.jsonl

The workloads are `bench/compare_moe.py`'s (a Qwen3-MoE decoder, random weights of seed 0, float32, a training
step of `Trainer.fit` with SFT's loss, then greedy decoding) with one more shape, `chip`, wide enough for the
grouped kernel's tiles to matter (64 experts, top-8). Each (size, column) runs in its own process: `jax.clear_caches`
alone would leave the first run's warmed-up runtime to the second. A column whose first loss differs from the plain
one by more than float rounding is reported, not hidden. On a CPU both columns are ragged_dot (the TPU column's
kernel would run in Pallas interpret mode, a test's tool, not a speed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench import compare_moe  # noqa: E402

compare_moe.SIZES.setdefault("chip", dict(
    vocab=32768, hidden=1024, layers=4, heads=16, kv_heads=4, head_dim=64, experts=64, top_k=8, expert_width=512,
    train_batch=8, seq=512, train_steps=(2, 5), decode_batch=32, prompt=64, new=64, decode_calls=(1, 2)))


def measure(size: str, column: str) -> dict:
    """Train then decode `size` with the op table's `column` ("plain", or "auto": the machine's own)."""
    import jax

    from tempax import ops

    def run() -> dict:
        return {"train": compare_moe.tempax_train(size), "decode": compare_moe.tempax_decode(size)}

    if column == "plain":
        with ops.use_backend("plain"):
            out = run()
    else:
        out = run()
    return {"size": size, "column": column, "backend": jax.default_backend(),
            "device": jax.devices()[0].device_kind, **out}


def table_record(results: list[dict]) -> dict:
    """A `table` record (topic tpu) of `measure` results: a row per (size, column), with the ratio of each column
    to the plain one of its size (trained tokens/s, generated tokens/s)."""
    by = {(r["size"], r["column"]): r for r in results}
    rows = []
    for (size, column), r in by.items():
        plain = by.get((size, "plain"))
        ratio = (f"{r['train']['tokens_per_s'] / plain['train']['tokens_per_s']:.2f}x / "
                 f"{r['decode']['generated_tokens_per_s'] / plain['decode']['generated_tokens_per_s']:.2f}x"
                 if plain else "-")
        s = compare_moe.SIZES[size]
        rows.append([f"{size} ({s['experts']} experts top-{s['top_k']}, hidden {s['hidden']}, {s['layers']} layers)",
                     column if column == "plain" else f"{r['backend']} (the table's own)",
                     r["train"]["tokens_per_s"], r["train"]["first_loss"], r["decode"]["generated_tokens_per_s"], ratio])
    return {"kind": "table", "topic": "tpu", "cpu": results[0]["device"], "jax": results[0]["train"]["jax"],
            "title": "Mixture of experts on the chip: the op table's expert products (megablox grouped matmul) against "
                     "plain ragged_dot, float32, a training step and greedy decoding",
            "columns": ["shape", "column", "trained tok/s", "first loss", "generated tok/s",
                        "against plain (train / decode)"],
            "rows": rows, "command": "bash scripts/tpu/run.sh python bench/tpu_moe.py"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="small,chip")
    parser.add_argument("--record", metavar="FILE", help="append a table record (topic tpu)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds each (size, column) process may take")
    parser.add_argument("--one", nargs=2, metavar=("SIZE", "COLUMN"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(*args.one)), flush=True)
        return 0
    results = []
    for size in args.sizes.split(","):
        for column in ("plain", "auto"):
            try:
                proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", size, column],
                                      capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(f"{size} {column}: over {args.timeout:.0f} s", flush=True)
                continue
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode or not lines:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                print(f"{size} {column}: exit {proc.returncode}: {' | '.join(tail)}", flush=True)
                continue
            result = json.loads(lines[-1])
            results.append(result)
            t, d = result["train"], result["decode"]
            print(f"{size} {column} ({result['backend']}): train {t['tokens_per_s']} tok/s (step {t['step_time_s']} s, "
                  f"first loss {t['first_loss']}), decode {d['generated_tokens_per_s']} tok/s", flush=True)
    if args.record and results:
        with open(args.record, "a", encoding="utf-8") as f:
            f.write(json.dumps(table_record(results)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
