"""Decode speed and size of a distilled student next to its teacher.

    python bench/distill_decode.py --teacher smollm2-135m-instruct --student runs/distill_smollm2/student

Both models answer the same 8 chat prompts (the first 8 user turns of ../shared/data/hh-rlhf-sft), greedy, exactly
`--new-tokens` new tokens per row (`ignore_eos`), float32, through `tempax.generate.generate`. The first call
(compilation) is a warm-up; generated tokens/s = rows * new tokens / median of `--repeats` timed calls. Also
reported: layers, parameter count and bytes of each model. Prints one JSON object per model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "shared", "data", "hh-rlhf-sft", "train.jsonl")


def prompts(tokenizer, n: int, path: str) -> list[list[int]]:
    out = []
    with open(path) as f:
        for line in f:
            first = json.loads(line)["messages"][0]
            out.append(tokenizer.apply_chat_template([first], add_generation_prompt=True, tokenize=True))
            if len(out) == n:
                break
    return out


def measure(source: str, ids: list[list[int]], new_tokens: int, repeats: int) -> dict:
    from tempax.algorithms.distill.models import model_bytes, parameter_count
    from tempax.generate import SamplingConfig, generate
    from tempax.models import registry

    model, tokenizer = registry.load(source)
    cfg = SamplingConfig(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True, logprobs=False)
    generate(model, tokenizer, ids, cfg)  # warm-up: compilation
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        generate(model, tokenizer, ids, cfg)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {"model": source, "layers": model.config.num_layers, "params": parameter_count(model),
            "bytes": model_bytes(model), "rows": len(ids), "new_tokens": new_tokens, "median_call_s": median,
            "tokens_per_s": len(ids) * new_tokens / median, "calls_s": times,
            "load_avg": os.getloadavg()[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--teacher", default="smollm2-135m-instruct")
    p.add_argument("--student", required=True)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data", default=DATA)
    args = p.parse_args()
    from tempax.models import registry

    ids = prompts(registry.load_tokenizer(args.teacher), args.rows, args.data)
    for source in (args.teacher, args.student):
        print(json.dumps(measure(source, ids, args.new_tokens, args.repeats)), flush=True)


if __name__ == "__main__":
    main()
