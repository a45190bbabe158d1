"""Same-machine reference figures: the shared workloads run by transformers + PyTorch (CPU, float32).

    python bench/peers.py                          # decode and sft_full, both sizes, one process each
    python bench/peers.py --workload decode --size tiny
    python bench/peers.py --one sft_full small     # one measurement in this process

Why this exists: the peer figures quoted in the issues were measured on another machine of "this kind", and
on the 2-core development machine everything memory-bound runs slower (one core reads ~3 GB/s). Measuring the
fastest peer here, with the same workload definitions as `bench/decode.py` and `bench/sft.py` (shapes from
../shared/bench/workloads.json, random init, float32, same batch and lengths, same warm-up/measured counts and
median), tells how tempax compares on *this* hardware. PyTorch's own thread defaults are kept.

Decode: `model.generate` greedy with exactly max_new_tokens new tokens per row (min_new_tokens, no EOS), KV
cache on, one timed call per run. sft_full: forward + causal LM loss + backward + AdamW (lr 1e-5, 0.9/0.999,
eps 1e-8, weight decay 0.01) on a fresh random batch per step. Prints one JSON object per measurement.
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
WORKLOADS = os.path.join(HERE, "..", "..", "shared", "bench", "workloads.json")


def load_spec() -> dict:
    with open(WORKLOADS) as f:
        return json.load(f)


def build_model(shape: dict):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"], num_hidden_layers=shape["num_layers"],
        num_attention_heads=shape["num_heads"], num_key_value_heads=shape["num_kv_heads"],
        head_dim=shape["head_dim"], intermediate_size=shape["intermediate_size"], rope_theta=shape["rope_theta"],
        rms_norm_eps=shape["rms_norm_eps"], tie_word_embeddings=True,
        max_position_embeddings=shape["max_position_embeddings"], attention_bias=False, mlp_bias=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    model = LlamaForCausalLM(config).float()
    n = sum(p.numel() for p in model.parameters())
    assert n == shape["expected_num_params"], f"{n} parameters, workloads.json says {shape['expected_num_params']}"
    return model


def measure_decode(size: str) -> dict:
    import numpy as np
    import torch

    from tempax.cli.process import settings_in_effect

    spec = load_spec()
    w = spec["workloads"]["decode"]
    runs = w["runs"][size]
    model = build_model(spec["models"][size]).eval()
    batch, prompt_len, new = w["batch_size"], w["prompt_len"], w["max_new_tokens"]
    rng = np.random.default_rng(spec["data"]["seed"] + 1)
    ids = rng.integers(4, spec["models"][size]["vocab_size"], (batch, prompt_len - 1))
    prompts = torch.tensor(np.concatenate([np.ones((batch, 1), np.int64), ids], axis=1))
    times = []
    with torch.inference_mode():
        for i in range(runs["warmup"] + runs["measured"]):
            t = time.perf_counter()
            out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                                 max_new_tokens=new, min_new_tokens=new, use_cache=True, pad_token_id=0)
            elapsed = time.perf_counter() - t
            assert out.shape == (batch, prompt_len + new)
            if i >= runs["warmup"]:
                times.append(elapsed)
    median = statistics.median(times)
    return {"library": f"transformers {__import__('transformers').__version__} + torch {torch.__version__}",
            "workload": "decode", "size": size, "generated_tokens_per_s": round(batch * new / median, 1),
            "call_s": [round(t, 3) for t in times],
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
            "threads": torch.get_num_threads(), "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            **settings_in_effect()}


def measure_sft_full(size: str) -> dict:
    import numpy as np
    import torch

    from tempax.cli.process import settings_in_effect

    spec = load_spec()
    w = spec["workloads"]["sft_full"]
    steps = w["steps"][size]
    shape = spec["models"][size]
    model = build_model(shape).train()
    opt = spec["optimizer"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=opt["learning_rate"], betas=(opt["b1"], opt["b2"]),
                                  eps=opt["eps"], weight_decay=opt["weight_decay"])
    batch, seq = w["batch_size"], w["seq_len"]
    total = steps["warmup"] + steps["measured"]
    rng = np.random.default_rng(spec["data"]["seed"] + 0)
    tokens = rng.integers(4, shape["vocab_size"], size=(total, batch, seq))
    tokens[:, :, 0] = 1
    batches = [torch.tensor(tokens[i]) for i in range(total)]
    times = []
    for i, ids in enumerate(batches):
        t = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    step = statistics.median(times[steps["warmup"]:])
    tps = batch * seq / step
    return {"library": f"transformers {__import__('transformers').__version__} + torch {torch.__version__}",
            "workload": "sft_full", "size": size, "tokens_per_s": round(tps, 1), "step_time_s": round(step, 4),
            "model_flops_per_s": round(6 * shape["expected_num_params"] * tps / 1e9, 2) * 1e9,
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
            "threads": torch.get_num_threads(), "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            **settings_in_effect()}


MEASURE = {"decode": measure_decode, "sft_full": measure_sft_full}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=(*MEASURE, "all"), default="all")
    parser.add_argument("--size", choices=("tiny", "small", "all"), default="all")
    parser.add_argument("--repeats", type=int, default=1, help="separate processes per (workload, size)")
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "SIZE"), help="measure once in this process")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(MEASURE[args.one[0]](args.one[1])), flush=True)
        return 0
    workloads = tuple(MEASURE) if args.workload == "all" else (args.workload,)
    sizes = ("tiny", "small") if args.size == "all" else (args.size,)
    for workload in workloads:
        for size in sizes:
            for _ in range(args.repeats):
                out = subprocess.run([sys.executable, __file__, "--one", workload, size], capture_output=True,
                                     text=True)
                lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
                print(lines[-1] if lines else json.dumps({"workload": workload, "size": size,
                                                          "error": out.stderr[-2000:]}), flush=True)
    return 0


if __name__ == "__main__":
    from tempax.cli.process import setup_process

    setup_process()  # as the `tempax` command does; TEMPAX_REEXEC=0 measures without
    sys.exit(main())
