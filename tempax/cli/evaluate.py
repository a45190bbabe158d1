"""`tempax eval`: answer accuracy, format accuracy and pass@k of a model on a verifiable task.

    tempax eval smollm2-135m-instruct --task gsm8k --num-problems 200
    tempax eval --model smollm2-135m-instruct --adapters runs/grpo/adapters --task gsm8k --samples 8 --ks 1,8
    tempax eval --model qwen2.5-1.5b-instruct --task arithmetic --no-greedy --samples 4

Greedy decoding gives the usual accuracy; `--samples N` adds N sampled completions per problem (at
`--temperature`) for unbiased pass@k. Results print as a table and, with `--out FILE.json`, are written with
every completion and its verdict. The evaluation is `tempax.eval.evaluate`; this module parses arguments, loads
the model and the rows, and prints.
"""

from __future__ import annotations

import argparse
import json

from tempax.cli.flags import fields_as_flags
from tempax.data.tasks.spec import split_rows
from tempax.errors import ConfigError

# Modules that load JAX are imported in the functions using them: `tempax COMMAND --help` stays light.


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source_model", nargs="?", metavar="SOURCE",
                        help="model source (registered name, folder, .gguf, Hub id, a training run's directory), "
                        "as in `tempax generate SOURCE`")
    parser.add_argument("--model", help="the model source, for scripts that name it (same as SOURCE)")
    parser.add_argument("--adapters", help="a LoRA adapter folder (PEFT layout) to load on top of the model")
    parser.add_argument("--task", choices=("gsm8k", "arithmetic", "code"), default="gsm8k",
                        help="the task (default gsm8k); code: generated function-writing problems whose hidden "
                        "tests run in the sandbox (docs/code-execution.md)")
    parser.add_argument("--source", help="gsm8k: a folder with train.jsonl/test.jsonl, a jsonl file or a Hub id "
                        "(default the Hub's openai/gsm8k)")
    parser.add_argument("--split", default="test", help="split to evaluate (default test)")
    parser.add_argument("--num-problems", "--limit", type=int, default=200, dest="num_problems",
                        help="problems to evaluate, the first N of the split (default 200)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="generation budget (default 256)")
    parser.add_argument("--no-greedy", action="store_true", help="skip the greedy evaluation")
    parser.add_argument("--samples", type=int, default=0,
                        help="sampled completions per problem for pass@k (a recipe's eval.group_size)")
    parser.add_argument("--ks", default=None, help="comma-separated k of pass@k (default 1 and --samples)")
    parser.add_argument("--temperature", type=float, default=1.0, help="temperature of sampled completions")
    parser.add_argument("--batch-size", type=int, default=64, help="prompts per generation call (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--out", help="write the results with every completion to this JSON file")


def run(args: argparse.Namespace) -> int:
    from tempax.eval.evaluate import EvalOptions, evaluate, format_table, interval_lines
    from tempax.algorithms.run_dirs import load_source

    if args.source_model and args.model and args.source_model != args.model:
        raise ConfigError(f"two models given: SOURCE {args.source_model} and --model {args.model}; pass one")
    args.model = args.model or args.source_model
    if not args.model:
        raise ConfigError("no model given: tempax eval SOURCE --task gsm8k (e.g. SOURCE = smollm2-135m-instruct)")
    if args.num_problems < 1:
        raise ConfigError(f"--num-problems must be >= 1, got {args.num_problems}")
    if args.ks:
        ks = tuple(int(k) for k in args.ks.split(",") if k.strip())
    else:
        ks = tuple(sorted({1, args.samples})) if args.samples else (1,)
    with fields_as_flags(max_new_tokens="--max-new-tokens", group_size="--samples", temperature="--temperature",
                         batch_size="--batch-size", seed="--seed"):
        options = EvalOptions(
            max_new_tokens=args.max_new_tokens, greedy=not args.no_greedy, group_size=args.samples,
            temperature=args.temperature, ks=ks, batch_size=args.batch_size, seed=args.seed,
        )
    model, tokenizer = load_source(args.model)
    if tokenizer is None:
        raise ConfigError(f"{args.model} has no tokenizer; evaluate a model that ships one")
    if args.adapters:
        from tempax.models.lora import load_adapters, merge_lora

        model = merge_lora(load_adapters(model, args.adapters))
    rows = split_rows(args.task, args.split, args.num_problems, args.source, args.seed)
    result = evaluate(model, tokenizer, rows, options, label=f"eval {args.task}")
    print(format_table(result.by_mode(args.temperature)))
    for line in interval_lines(result):
        print(line)
    print(f"{len(rows)} {args.task} problems ({args.split}), {result.seconds:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "adapters": args.adapters, "task": args.task, **result.to_dict(),
                       "records": result.records()}, f, indent=2)
        print(f"wrote {args.out}")
    return 0
