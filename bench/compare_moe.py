"""A mixture-of-experts model, tempax against transformers + PyTorch on this CPU: a training step and greedy decoding.

    python bench/compare_moe.py                               # size small, 2 repeats a side, interleaved
    python bench/compare_moe.py --sizes tiny --repeats 1 --page ''   # the smallest shape (what the test runs)
    python bench/compare_moe.py --record bench/records/speed.jsonl   # also keep the ratios for docs/results.md
    python bench/compare_moe.py --one tempax train small      # one measurement in this process (one JSON line)

The model is a Qwen3-MoE decoder (q/k norms, softmax router, top-2 renormalised, every layer sparse, untied head)
of the shape in `SIZES`, random-initialised by each library's own initialisers (seed 0), float32 weights,
activations and optimizer state. Both sides build it from one `ModelConfig`: tempax's `Decoder`, transformers'
`Qwen3MoeForCausalLM` from `ModelConfig.to_hf_config()`. The router's load-balancing loss is reported, not trained,
on both sides (transformers' `output_router_logits` false, tempax's `moe.train_aux_loss` false).

- train: one optimizer step on a fresh batch of random token ids (BOS first): forward, causal LM loss, backward and
  AdamW (lr 1e-5, 0.9/0.999, eps 1e-8, weight decay 0.01, no clipping). tempax runs `Trainer.fit` with SFT's loss
  (the step a `tempax sft` run compiles) and times each step with the loop's own step timing; PyTorch times
  forward to `optimizer.zero_grad`. Figure: trained tokens/s = batch * seq / median step time after the warm-up.
- decode: greedy, exactly `new` tokens per row from prompts of `prompt` random ids, KV cache on; one timed call is a
  whole `tempax.generate.generate` / `model.generate` call (prefill and decode loop). The first call is the warm-up
  (tempax compiles there). Figure: generated tokens/s = batch * new / median call time.

The sides alternate, tempax, transformers, tempax, ..., `--repeats` times per (workload, size), each measurement its
own process and one at a time, so both see the same background load (`bench/compare.py`'s rule). The ratio is
tempax / PyTorch (> 1: tempax faster). The table names the CPU and the load average before each measurement. A
measuring run appends its table to `docs/measurements/performance-history.md` (`--page`; `--page ''` writes
nothing); `--record FILE` appends one `figure` record per workload for `bench/results.py`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.compare import (_names, append_run, first_error_line, repeatable_command, side_summary,  # noqa: E402
                           speed_ratio)
from bench.peers import run_measurement, timed_torch_steps  # noqa: E402

# The shapes: a model (hidden, layers, heads / kv heads of head_dim, experts top-k of width, vocab), the training
# batch (batch x seq, warm-up + measured steps) and the decoding batch (batch prompts of `prompt` ids, `new` tokens,
# warm-up + measured calls).
SIZES = {
    "tiny": dict(vocab=256, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, experts=4, top_k=2,
                 expert_width=32, train_batch=2, seq=32, train_steps=(1, 2), decode_batch=2, prompt=8, new=4,
                 decode_calls=(1, 1)),
    "small": dict(vocab=8192, hidden=384, layers=6, heads=6, kv_heads=2, head_dim=64, experts=16, top_k=2,
                  expert_width=512, train_batch=2, seq=256, train_steps=(2, 5), decode_batch=4, prompt=64, new=32,
                  decode_calls=(1, 3)),
}
WORKLOADS = {"train": ("tokens_per_s", "trained tokens/s"), "decode": ("generated_tokens_per_s", "generated tokens/s")}
SIDES = ("tempax", "transformers")
OPTIMIZER = dict(learning_rate=1e-5, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)


def model_config(size: str):
    """The tempax `ModelConfig` of a size (transformers gets its `to_hf_config()`)."""
    from tempax.models.config import ModelConfig, MoeConfig, RopeConfig

    s = SIZES[size]
    return ModelConfig(
        family="qwen3_moe", vocab_size=s["vocab"], hidden_size=s["hidden"], num_layers=s["layers"],
        num_heads=s["heads"], num_kv_heads=s["kv_heads"], head_dim=s["head_dim"], intermediate_size=4 * s["hidden"],
        rope=RopeConfig(theta=1e6), qk_norm=True, rms_norm_eps=1e-6, tie_word_embeddings=False,
        max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        moe=MoeConfig(num_experts=s["experts"], experts_per_token=s["top_k"], expert_intermediate_size=s["expert_width"],
                      normalize_top_k=True))


def random_ids(size: str, shape: tuple[int, ...], salt: int):
    """Token ids in [4, vocab) from numpy default_rng(1234 + salt), BOS (1) first on the last axis."""
    import numpy as np

    ids = np.random.default_rng(1234 + salt).integers(4, SIZES[size]["vocab"], size=shape).astype(np.int32)
    ids[..., 0] = 1
    return ids


def _peak_rss_gib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)


# --------------------------------------------------------------------------------------------------------------
# tempax's side

def tempax_train(size: str) -> dict:
    import jax
    import numpy as np

    from tempax.algorithms.sft.main import SFTLossConfig, make_sft_loss
    from tempax.models.init import init_decoder
    from tempax.parallel import make_mesh
    from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig
    from tempax.train.hooks import every
    from tempax.train.loop import Trainer
    from tempax.train.trainable import Trainable

    s, cfg = SIZES[size], model_config(size)
    warmup, measured = s["train_steps"]
    batch, seq = s["train_batch"], s["seq"]
    tokens = random_ids(size, (warmup + measured, batch, seq), salt=0)
    targets = np.concatenate([tokens[:, :, 1:], np.zeros((warmup + measured, batch, 1), np.int32)], axis=2)
    mask = np.ones((batch, seq), np.int32)
    mask[:, -1] = 0  # the last position has no next token (PyTorch's shifted labels drop it the same way)
    layout = {"loss_mask": mask, "positions": np.broadcast_to(np.arange(seq, dtype=np.int32), (batch, seq)).copy(),
              "segment_ids": np.ones((batch, seq), np.int32)}
    batches = [{"tokens": tokens[i], "targets": targets[i], **layout} for i in range(warmup + measured)]
    mesh = make_mesh(devices=jax.devices()[:1])
    train_cfg = TrainConfig(
        steps=warmup + measured, batch_size=batch, seq_len=seq, progress_bar=False, tensorboard=False,
        run_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), "tempax-bench-moe"), mesh=MeshConfig(num_devices=1),
        optimizer=OptimizerConfig(name="adamw", schedule="constant", decay_all=True, grad_clip_norm=None,
                                  **OPTIMIZER),
        checkpoint=CheckpointConfig(save_at_end=False))
    loss = SFTLossConfig()
    trainer = Trainer(Trainable(init_decoder(cfg, 0, mesh), logit_positions=loss.chunk_len),
                      make_sft_loss(loss.normalize, fused=loss.fused, chunk_len=loss.chunk_len), train_cfg, mesh=mesh)
    times: list[float] = []
    losses: list[float] = []

    def record(info) -> None:  # the loop's own step timing: dispatch until the step's results are ready
        times.append(info.train_s)
        losses.append(info.metrics()["loss"])

    trainer.fit(batches, hooks=[every(1, record)])
    trainer.close()
    step = statistics.median(times[warmup:])
    return {"tokens_per_s": round(batch * seq / step, 1), "step_time_s": round(step, 4),
            "step_times_s": [round(t, 4) for t in times[warmup:]], "first_loss": round(losses[0], 4),
            "library": "tempax", "jax": jax.__version__}


def tempax_decode(size: str) -> dict:
    import jax

    from tempax.generate import SamplingConfig, generate
    from tempax.models.init import init_decoder

    s = SIZES[size]
    model = init_decoder(model_config(size), 0)
    prompts = random_ids(size, (s["decode_batch"], s["prompt"]), salt=1).tolist()
    config = SamplingConfig(max_new_tokens=s["new"], temperature=0.0, ignore_eos=True)
    times = []
    for _ in range(sum(s["decode_calls"])):
        start = time.perf_counter()
        result = generate(model, None, prompts, config)
        times.append(time.perf_counter() - start)
        assert all(len(row) == s["new"] for row in result.token_ids)
    call = statistics.median(times[s["decode_calls"][0]:])
    return {"generated_tokens_per_s": round(s["decode_batch"] * s["new"] / call, 1),
            "call_s": [round(t, 3) for t in times[s["decode_calls"][0]:]], "library": "tempax", "jax": jax.__version__}


# --------------------------------------------------------------------------------------------------------------
# transformers' side

def torch_model(size: str):
    import torch
    import transformers

    torch.manual_seed(0)
    hf = transformers.AutoConfig.for_model(**model_config(size).to_hf_config())
    return transformers.AutoModelForCausalLM.from_config(hf, dtype=torch.float32)


def transformers_train(size: str) -> dict:
    import torch

    s = SIZES[size]
    warmup, measured = s["train_steps"]
    model = torch_model(size).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=OPTIMIZER["learning_rate"],
                                  betas=(OPTIMIZER["b1"], OPTIMIZER["b2"]), eps=OPTIMIZER["eps"],
                                  weight_decay=OPTIMIZER["weight_decay"])
    tokens = random_ids(size, (warmup + measured, s["train_batch"], s["seq"]), salt=0)
    times, losses = timed_torch_steps(model, optimizer, [torch.tensor(t, dtype=torch.long) for t in tokens])
    step = statistics.median(times[warmup:])
    return {"tokens_per_s": round(s["train_batch"] * s["seq"] / step, 1), "step_time_s": round(step, 4),
            "step_times_s": [round(t, 4) for t in times[warmup:]], "first_loss": round(losses[0], 4),
            **_torch_fields(torch)}


def transformers_decode(size: str) -> dict:
    import torch

    s = SIZES[size]
    model = torch_model(size).eval()
    prompts = torch.tensor(random_ids(size, (s["decode_batch"], s["prompt"]), salt=1), dtype=torch.long)
    times = []
    with torch.inference_mode():
        for _ in range(sum(s["decode_calls"])):
            start = time.perf_counter()
            out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                                 max_new_tokens=s["new"], min_new_tokens=s["new"], use_cache=True, pad_token_id=0)
            times.append(time.perf_counter() - start)
            assert out.shape == (s["decode_batch"], s["prompt"] + s["new"])
    call = statistics.median(times[s["decode_calls"][0]:])
    return {"generated_tokens_per_s": round(s["decode_batch"] * s["new"] / call, 1),
            "call_s": [round(t, 3) for t in times[s["decode_calls"][0]:]], **_torch_fields(torch)}


def _torch_fields(torch) -> dict:
    import transformers

    return {"library": f"transformers {transformers.__version__} + torch {torch.__version__}",
            "threads": torch.get_num_threads()}


def measure_one(side: str, workload: str, size: str) -> dict:
    """One measurement in this process: the figure, the step or call times, peak RSS, the settings and the CPU."""
    from tempax.runtime.process import settings_in_effect

    run = {("tempax", "train"): tempax_train, ("tempax", "decode"): tempax_decode,
           ("transformers", "train"): transformers_train, ("transformers", "decode"): transformers_decode}
    record = run[(side, workload)](size)
    return {"side": side, "workload": workload, "size": size, **record, "peak_rss_gib": _peak_rss_gib(),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()], **settings_in_effect()}


# --------------------------------------------------------------------------------------------------------------
# The driver: interleaved processes, the table, the records

def measure_all(workloads: Sequence[str], sizes: Sequence[str], *, repeats: int, out: str | None = None,
                timeout_s: float | None = None) -> list[dict]:
    """Every (workload, size), tempax then transformers, `repeats` times, each measurement its own process."""
    from tempax.runtime.host import cpu_line

    records = []
    plan = [(w, s, r, side) for w in workloads for s in sizes for r in range(repeats) for side in SIDES]
    for n, (workload, size, repeat, side) in enumerate(plan, 1):
        label = {"side": side, "workload": workload, "size": size, "repeat": repeat, "host_cpu": cpu_line(),
                 "utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
                 "load_average_before": [round(x, 2) for x in os.getloadavg()]}
        command = [sys.executable, os.path.abspath(__file__), "--one", side, workload, size]
        record = run_measurement(command, timeout_s=timeout_s, **label, command=" ".join(command[1:]))
        records.append(record)
        if out:
            with open(out, "a") as f:
                f.write(json.dumps(record) + "\n")
        key = WORKLOADS[workload][0]
        said = record.get(key, "error: " + first_error_line(record.get("error", "")))
        print(f"[{n}/{len(plan)}] {side} {workload} {size}: {said} ({record.get('wall_s')} s)", file=sys.stderr,
              flush=True)
    return records


def cells(records: Sequence[dict]) -> list[dict]:
    """One summary per (workload, size) in run order: each side's `side_summary` and the ratio of the medians
    (tempax / PyTorch, None when a side has no figure)."""
    out = []
    for workload, size in dict.fromkeys((r["workload"], r["size"]) for r in records):
        key = WORKLOADS[workload][0]
        sides = {side: side_summary([r for r in records if (r["workload"], r["size"], r["side"]) ==
                                     (workload, size, side)], key) for side in SIDES}
        t, p = sides["tempax"]["median"], sides["transformers"]["median"]
        out.append({"workload": workload, "size": size, **sides,
                    "ratio": speed_ratio(t, p, True) if t and p else None})
    return out


def _figures(side: dict) -> str:
    if side["median"] is None:
        return "error: " + "; ".join(side["errors"]) if side["errors"] else "-"
    return f"{side['median']:.1f} ({', '.join(f'{f:.1f}' for f in side['figures'])})"


def build_table(records: Sequence[dict]) -> str:
    """The markdown table of a run, a pure function of its records: the CPU, the libraries and the load, then a row
    per (workload, size) with each side's median (its repeats) and the ratio."""
    cpus = sorted({r["host_cpu"] for r in records if "host_cpu" in r})
    loads = [r["load_average_before"][0] for r in records if "load_average_before" in r]
    libraries = sorted({r["library"] for r in records if "library" in r and r.get("side") == "transformers"})
    jax = sorted({r["jax"] for r in records if "jax" in r})
    lines = [f"CPU: {'; '.join(cpus) or 'unknown'}. Load average before each measurement: "
             f"{min(loads, default=0):.2f} to {max(loads, default=0):.2f}.",
             f"tempax on JAX {', '.join(jax) or '?'}; peer: {', '.join(libraries) or '?'}.", "",
             "| workload | size | tempax: median (repeats) | PyTorch: median (repeats) | tempax / PyTorch | "
             "peak RSS GiB tempax / PyTorch |", "|---|---|---|---|---|---|"]
    for c in cells(records):
        rss = " / ".join(f"{c[s]['peak_rss_gib']:.2f}" if c[s]["peak_rss_gib"] else "?" for s in SIDES)
        ratio = f"{c['ratio']:.2f}x" if c["ratio"] else ""
        lines.append(f"| {WORKLOADS[c['workload']][1]} | {c['size']} | {_figures(c['tempax'])} | "
                     f"{_figures(c['transformers'])} | {ratio} | {rss} |")
    return "\n".join(lines)


def figure_records(records: Sequence[dict], command: str) -> list[dict]:
    """One `bench/results.py` figure record (topic "speed") per measured (workload, size): both medians, the ratio
    and the load the run saw (a shared machine slows both sides, not necessarily alike)."""
    cpus = sorted({r["host_cpu"] for r in records if "host_cpu" in r})
    libraries = sorted({r["library"] for r in records if "library" in r and r.get("side") == "transformers"})
    what = {"train": "mixture-of-experts training step (Qwen3-MoE shape, {e} experts top-{k}), float32, {size}",
            "decode": "mixture-of-experts greedy decoding (Qwen3-MoE shape, {e} experts top-{k}), float32, {size}"}
    loads = [r["load_average_before"][0] for r in records if "load_average_before" in r] or [0.0]
    out = []
    for c in cells(records):
        if c["ratio"] is None:
            continue
        s = SIZES[c["size"]]
        unit = WORKLOADS[c["workload"]][1]
        out.append({"kind": "figure", "topic": "speed",
                    "what": what[c["workload"]].format(e=s["experts"], k=s["top_k"], size=c["size"]),
                    "figure": f"{c['tempax']['median']:.1f} {unit} against PyTorch's "
                              f"{c['transformers']['median']:.1f} ({c['ratio']:.2f}x); load average "
                              f"{min(loads):.2f} to {max(loads):.2f} before the measurements",
                    "command": command, "cpu": "; ".join(cpus), "versions": ", ".join(libraries)})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated, from train, decode")
    parser.add_argument("--sizes", default="small", help="comma-separated, from " + ", ".join(SIZES))
    parser.add_argument("--repeats", type=int, default=2, help="measurements per side, interleaved")
    parser.add_argument("--one", nargs=3, metavar=("SIDE", "WORKLOAD", "SIZE"), help="measure once in this process")
    parser.add_argument("--out", help="append every raw JSON record here (JSON lines)")
    parser.add_argument("--record", metavar="FILE.jsonl",
                        help="append a figure record per workload for bench/results.py (bench/records/speed.jsonl)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before one measurement is failed")
    parser.add_argument("--page", default=os.path.join(ROOT, "docs", "measurements", "performance-history.md"),
                        help="the docs page a measuring run appends its table to ('' = none)")
    args = parser.parse_args(argv)
    if args.one:
        side, workload, size = args.one
        if side not in SIDES or workload not in WORKLOADS or size not in SIZES:
            raise SystemExit(f"--one SIDE WORKLOAD SIZE: SIDE from {', '.join(SIDES)}, WORKLOAD from "
                             f"{', '.join(WORKLOADS)}, SIZE from {', '.join(SIZES)}")
        print(json.dumps(measure_one(side, workload, size)), flush=True)
        return 0
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    records = measure_all(_names(args.workloads, tuple(WORKLOADS), "workloads"), _names(args.sizes, tuple(SIZES),
                          "sizes"), repeats=args.repeats, out=args.out, timeout_s=args.timeout)
    table = build_table(records)
    print(table, flush=True)
    command = repeatable_command("bench/compare_moe.py", argv if argv is not None else sys.argv[1:],
                                 local=("--out", "--page", "--record"))
    if args.page:
        from tempax.runtime.host import cpu_class, cpu_info

        append_run(args.page, table, f"### {cpu_class(cpu_info())}: mixture of experts (bench/compare_moe.py) at "
                                     f"{args.sizes}", command)
    if args.record:
        with open(args.record, "a", encoding="utf-8") as f:
            for record in figure_records(records, command):
                f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    from tempax.runtime.process import setup_process

    if "--one" in sys.argv and "tempax" in sys.argv:
        setup_process(job="train" if "train" in sys.argv else None)  # as `tempax sft` / `tempax generate` do
    else:
        setup_process()  # the transformers side and the driver: glibc's default malloc, as bench/peers.py runs
    sys.exit(main())
