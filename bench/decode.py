"""Decode throughput benchmark: the `decode` workload of ../shared/bench/workloads.json.

    python bench/decode.py                     # both sizes, each in its own process, twice
    python bench/decode.py --size small --repeats 1
    python bench/decode.py --one tiny          # one measurement in this process (what the driver spawns)
    python bench/decode.py --long-tail small   # a long-tail rollout: static batches vs continuous batching

Exactly the shared work: bench-tiny / bench-small shapes (random init, seed 0, float32 weights, activations and
KV cache), 8 prompts of exactly 64 tokens (BOS + 63 ids from numpy default_rng(1234 + 1) in [4, vocab)), greedy,
exactly 128 new tokens per row (EOS never stops a row: `ignore_eos`). One timed call is a whole
`tempax.generate.generate(...)` call: tokenised prompts in, decoded texts, ids, masks and per-token log-probs
out (prefill + decode loop + host copies + detokenisation with the workload's word-level tokenizer). The first
call (compilation) is the warm-up; generated tokens/s = 8 * 128 / median(measured call time).

The model is built by `tempax.models.init.init_decoder`, as the `tempax` command builds a preset: the random draws of
`Decoder(cfg, rngs=nnx.Rngs(seed))` (equal within 1 ulp), made by three small compiled programs instead of one eager random
draw per weight (which left ~20-40 MiB more resident on bench-small).

Also reported: peak RSS of the process (ru_maxrss: model init, compilation and all runs; measured the same way
as `bench/peers.py`'s), the 1-minute load average before and after (the machine is shared; a load above the core
count means the figure is pessimistic), and the split between prefill and decode. Prints one JSON object per
measurement. The tokenizer folder is loaded by `tempax.models.tokenizer.load_tokenizer`, as the
`PreTrainedTokenizerFast` its tokenizer_config.json names, without `AutoTokenizer`'s class lookup, which imports
PyTorch (about 0.19 GiB of RSS) that tempax does not use.

Roofline: with batch 8, every decode step reads all the weights once (float32: 4 bytes a parameter) and does
only 2 FLOPs per weight per row, so on a CPU the step is bound by memory bandwidth, not matmul speed. The
benchmark measures the read bandwidth (a jitted sum over a 1 GiB float32 array, best of 3) in a separate
process after the timed calls, so that array is not counted in the peak RSS, and reports `bandwidth_roofline_tokens_per_s` = batch / (weight bytes / bandwidth): what a decoder that did
nothing but stream its weights once a step would reach (KV-cache reads, prefill and sampling ignored).

Long tail (`--long-tail SIZE`): 40 completions of the workload's 64-token prompts, greedy without EOS, where 10%
(every tenth) run 8x longer than the rest (max_new_tokens vs max_new_tokens / 8), decoded 8 at a time. Static:
a `DecodeRun` of 8 completions at a time (each row its own max_new_tokens), so every batch lasts as long as its
longest row. Continuous: `tempax.generate.continuous.SlotEngine` with 8 slots, a completion joining as soon as
one ends (chunks of 8 tokens). Both run once untimed (compiling), then timed; generated tokens/s each.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED = os.environ.get("TEMPAX_BENCH_SHARED") or os.path.join(ROOT, "..", "shared", "bench")  # as grpo_step.py
WORKLOADS = os.path.join(SHARED, "workloads.json")


def load_spec() -> dict:
    with open(WORKLOADS) as f:
        return json.load(f)


def read_bandwidth(nbytes: int = 1 << 30, repeats: int = 3) -> float:
    """Measured memory read bandwidth in bytes/s: best of `repeats` jitted sums over an `nbytes` float32 array."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((nbytes // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        total(x).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return nbytes / best


def read_bandwidth_elsewhere() -> float:
    """`read_bandwidth()` measured in a child process (its 1 GiB array must not count in this one's peak RSS)."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--bandwidth"], check=True,
                         capture_output=True, text=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["read_bandwidth_bytes_per_s"])


def workload_prompts(spec: dict, vocab_size: int) -> list[list[int]]:
    """The decode workload's prompts: BOS + prompt_len - 1 ids from default_rng(seed + 1) in [4, vocab)."""
    import numpy as np

    w = spec["workloads"]["decode"]
    rng = np.random.default_rng(spec["data"]["seed"] + 1)
    ids = rng.integers(4, vocab_size, (w["batch_size"], w["prompt_len"] - 1))
    return [[1] + row.tolist() for row in ids]


def measure(size: str, *, logprobs: bool = True) -> dict:
    sys.path.insert(0, ROOT)
    import jax

    from tempax.runtime.process import settings_in_effect
    from tempax.generate import SamplingConfig, generate
    from tempax.models.init import init_decoder
    from tempax.models.presets import PRESETS
    from tempax.models.tokenizer import load_tokenizer

    load_before = os.getloadavg()[0]
    spec = load_spec()
    w = spec["workloads"]["decode"]
    runs = w["runs"][size]
    shape = spec["models"][size]
    cfg = PRESETS[f"bench-{size}"]
    assert cfg.num_params() == shape["expected_num_params"], "preset does not match workloads.json"
    assert cfg.param_dtype == cfg.dtype == "float32"
    batch, new = w["batch_size"], w["max_new_tokens"]

    prompts = workload_prompts(spec, cfg.vocab_size)
    tokenizer = load_tokenizer(os.path.join(SHARED, "tokenizers", f"wordlevel_{cfg.vocab_size}"))
    model = init_decoder(cfg, spec["init"]["seed"])  # as `tempax` builds presets
    config = SamplingConfig(max_new_tokens=new, temperature=0.0, ignore_eos=True, logprobs=logprobs)

    times, prefill, decode, compiles = [], [], [], []
    for i in range(runs["warmup"] + runs["measured"]):
        start = time.perf_counter()
        result = generate(model, tokenizer, prompts, config)
        elapsed = time.perf_counter() - start
        assert result.token_ids.shape == (batch, new) and int(result.mask.sum()) == batch * new
        if i >= runs["warmup"]:
            times.append(elapsed)
            prefill.append(result.stats.prefill_s)
            decode.append(result.stats.decode_s)
            compiles.append(result.stats.compiles)
    median = statistics.median(times)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    bandwidth = read_bandwidth_elsewhere()
    weight_bytes = 4 * cfg.num_params()
    return {
        "workload": "decode",
        "size": size,
        "logprobs": logprobs,
        "generated_tokens_per_s": round(batch * new / median, 1),
        "median_call_s": round(median, 4),
        "call_s": [round(t, 4) for t in times],
        "median_prefill_s": round(statistics.median(prefill), 4),
        "median_decode_s": round(statistics.median(decode), 4),
        "compiles_in_measured_calls": sum(compiles),
        "read_bandwidth_gb_per_s": round(bandwidth / 1e9, 2),
        "bandwidth_roofline_tokens_per_s": round(batch * bandwidth / weight_bytes, 1),
        "fraction_of_bandwidth_roofline": round(batch * new / median / (batch * bandwidth / weight_bytes), 3),
        "peak_rss_mb": round(peak_rss / 1024, 1),
        "load_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "jax": jax.__version__,
        **settings_in_effect(),
    }


def measure_long_tail(size: str, completions: int = 40, slots: int = 8, chunk: int = 8) -> dict:
    sys.path.insert(0, ROOT)
    from tempax.generate import DecodeRun, SamplingConfig
    from tempax.generate.continuous import SlotEngine
    from tempax.models.init import init_decoder
    from tempax.models.presets import PRESETS

    load_before = os.getloadavg()[0]
    spec = load_spec()
    w = spec["workloads"]["decode"]
    cfg = PRESETS[f"bench-{size}"]
    prompts = workload_prompts(spec, cfg.vocab_size)
    model = init_decoder(cfg, spec["init"]["seed"])
    long, short = w["max_new_tokens"], w["max_new_tokens"] // 8
    rows = [(prompts[i % len(prompts)], long if i % 10 == 0 else short) for i in range(completions)]
    config = lambda n: SamplingConfig(max_new_tokens=n, temperature=0.0, ignore_eos=True)
    total = sum(n for _, n in rows)

    def static() -> float:
        start = time.perf_counter()
        for b in range(0, completions, slots):
            group = rows[b:b + slots]
            run = DecodeRun(model, [p for p, _ in group], config(long), stop_ids=(), pad_id=0,
                            prompt_configs=[config(n) for _, n in group])
            run.advance()
            assert int(run.output().lengths.sum()) == sum(n for _, n in group)
        return time.perf_counter() - start

    engine = SlotEngine(model, slots=slots, context=len(prompts[0]) + long, stop_ids=(), pad_id=0)

    def continuous() -> float:
        start, todo, generated = time.perf_counter(), list(range(completions)), 0
        while todo or engine.live():
            while todo and engine.free_slots():
                i = todo.pop(0)
                engine.join(rows[i][0], [config(rows[i][1])], [i])
            engine.advance(chunk)
            _, lengths, done = engine.snapshot()
            ended = [s for s, r in enumerate(engine.rows) if r is not None and done[s]]
            generated += int(sum(lengths[s] for s in ended))
            engine.release(ended)
        assert generated == total
        return time.perf_counter() - start

    static(), continuous()  # compiles
    static_s, continuous_s = static(), continuous()
    return {"workload": "decode_long_tail", "size": size, "completions": completions, "slots": slots,
            "max_new_tokens_short_long": [short, long], "generated_tokens": total,
            "static_tokens_per_s": round(total / static_s, 1),
            "continuous_tokens_per_s": round(total / continuous_s, 1),
            "continuous_vs_static": round(static_s / continuous_s, 2),
            "load_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def long_tail_record(line: dict) -> dict:
    """A long-tail measurement as a figure record of the results page's "serving" topic."""
    from tempax.runtime.host import cpu_line

    short, long = line["max_new_tokens_short_long"]
    return {"kind": "figure", "topic": "serving",
            "what": f"a long-tail rollout on bench-{line['size']}: {line['completions']} completions, every tenth "
                    f"{long} tokens and the rest {short}, {line['slots']} at a time; continuous batching against "
                    "static batches",
            "figure": f"{line['continuous_vs_static']}x the generated tokens/s ({line['continuous_tokens_per_s']} "
                      f"against {line['static_tokens_per_s']}; 1-min load {line['load_1min_before_after'][0]} before, "
                      f"{line['load_1min_before_after'][1]} after)",
            "command": f"python bench/decode.py --long-tail {line['size']}", "cpu": cpu_line()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("tiny", "small", "all"), default="all")
    parser.add_argument("--repeats", type=int, default=2, help="separate processes per size")
    parser.add_argument("--one", metavar="SIZE", help="measure SIZE in this process and print one JSON line")
    parser.add_argument("--no-logprobs", action="store_true", help="skip per-token log-probs (not the default)")
    parser.add_argument("--bandwidth", action="store_true", help="print the measured read bandwidth and exit")
    parser.add_argument("--long-tail", metavar="SIZE", help="the long-tail rollout, static vs continuous (JSON line)")
    parser.add_argument("--record", default=None,
                        help="with --long-tail: append the figure to this records file (topic 'serving')")
    args = parser.parse_args(argv)
    if args.long_tail:
        line = measure_long_tail(args.long_tail)
        print(json.dumps(line), flush=True)
        if args.record:
            with open(args.record, "a", encoding="utf-8") as f:
                f.write(json.dumps(long_tail_record(line)) + "\n")
        return 0
    if args.bandwidth:
        print(json.dumps({"read_bandwidth_bytes_per_s": read_bandwidth()}), flush=True)
        return 0
    if args.one:
        print(json.dumps(measure(args.one, logprobs=not args.no_logprobs)), flush=True)
        return 0
    sizes = ("tiny", "small") if args.size == "all" else (args.size,)
    for size in sizes:
        for _ in range(args.repeats):
            cmd = [sys.executable, os.path.abspath(__file__), "--one", size]
            if args.no_logprobs:
                cmd.append("--no-logprobs")
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            print(out.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    from tempax.runtime.process import setup_process

    setup_process()  # as the `tempax` command does; TEMPAX_REEXEC=0 measures without
    sys.exit(main())
