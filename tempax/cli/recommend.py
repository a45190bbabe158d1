"""`tempax recommend DATA [--model M] [--out RECIPE]`: which post-training method to run on this data, and a recipe.

The decisions are `tempax.algorithms.recommend.recommend`; this module measures the inputs (what the data holds,
the model's shapes without loading its weights, this machine's memory), prints the answer and writes the recipe.
"""

from __future__ import annotations

import argparse
import json
from tempax.data.stats import profile_dataset
from tempax.models.registry import load_tokenizer, model_config

# Modules that load JAX are imported in the functions using them: `tempax COMMAND --help` stays light.


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data", metavar="DATA", help="dataset file or folder (jsonl/json/parquet, saved dataset)")
    parser.add_argument("--model", "-m", default="smollm2-135m-instruct",
                        help="model to train (registered name, .gguf, HF folder, Hub id)")
    parser.add_argument("--tokenizer", help="tokenizer source when MODEL has none (a preset:<name> shape)")
    parser.add_argument("--split", help="split of a folder (default: train when the folder has one)")
    parser.add_argument("--out", "-o", help="recipe to write (default: recommended_<command>.yaml here)")
    parser.add_argument("--memory-gib", type=float,
                        help="memory per device to plan for (default: this machine's device / available RAM)")
    parser.add_argument("--sample-rows", type=int, default=300, help="rows tokenised to measure lengths")
    parser.add_argument("--run-dir", help="train.run_dir of the recipe (default: runs/recommended_<command>)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run(args: argparse.Namespace) -> int:
    import jax

    from tempax.algorithms.recommend import recommend, write_recipe
    from tempax.train.memory import GiB, device_capacity

    model = model_config(args.model)
    tokenizer = load_tokenizer(args.tokenizer or args.model)
    profile = profile_dataset(args.data, tokenizer, split=args.split, sample_rows=args.sample_rows)
    capacity = int(args.memory_gib * GiB) if args.memory_gib else device_capacity()
    rec = recommend(profile, model, model_source=args.model, tokenizer_source=args.tokenizer, capacity=capacity,
                    accelerator=jax.default_backend() != "cpu", run_dir=args.run_dir)
    path = write_recipe(rec, args.out or f"recommended_{rec.command}.yaml")
    if args.json:
        print(json.dumps({**rec.to_dict(), "recipe": path, "data": profile.summary()}, indent=2))
        return 0
    cap = f"{capacity / GiB:.2f} GiB" if capacity else "unknown"
    print(f"data:   {profile.path}{f' [{profile.split}]' if profile.split else ''}: {profile.kind}, "
          f"{profile.rows:,} rows, ~{profile.total_tokens:,} tokens (p95 {profile.p95_tokens} per sequence, "
          f"from {profile.sample_rows} sampled rows)")
    print(f"model:  {args.model}: {model.num_params() / 1e6:.1f}M parameters; memory per device: {cap}")
    print(f"\nrecommended: {rec.method}  ->  tempax {rec.command} --config {path}")
    for r in rec.reasons:
        print(f"  why: {r}")
    print("  settings: " + ", ".join(f"{k} {v}" for k, v in rec.hyperparameters.items()))
    print(f"  predicted peak memory: ~{rec.peak_bytes / GiB:.2f} GiB per device ({rec.plan.format()})")
    for a in rec.alternatives:
        print(f"  alternative: {a}")
    for w in rec.warnings:
        print(f"  warning: {w}")
    print(f"recipe written: {path}  (check it: tempax validate {path})")
    return 0
