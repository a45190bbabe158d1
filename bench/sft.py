"""SFT throughput benchmark: the `sft_full` and `sft_lora` workloads of ../shared/bench/workloads.json.

    python bench/sft.py                      # every workload x size, each in its own process, twice
    python bench/sft.py --workload sft_full --size small --repeats 1
    python bench/sft.py --one sft_lora tiny  # one measurement in this process (what the driver spawns)
    python bench/sft.py --memory sft_full small [--remat full]  # XLA's temporaries of the compiled step

Exactly the shared work: bench-tiny / bench-small shapes (random init, seed 0, float32 everywhere), batch 8 x 256
random token ids (numpy default_rng(1234 + 0), ids in [4, vocab), BOS at position 0, loss on all 255 next-token
positions per row), AdamW lr 1e-5 (0.9, 0.999, 1e-8, weight decay 0.01, constant, no clipping), LoRA rank 16 /
alpha 32 on q,k,v,o,gate,up,down with the base frozen. One fresh batch per step, all made before timing; warm-up
steps (incl. compilation) are excluded; tokens/s = 8 * 256 / median(step time).

Also measured in the same process: float32 matmul throughput (a 4096^3 jnp.dot, best of 3) as the machine's
roofline, and peak RSS (ru_maxrss). Model FLOP/s = 6 N tokens/s for full fine-tuning, 4 N for LoRA (N = 134.5M
for small, tied embedding counted once). Prints one JSON object per measurement.
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
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
LOAD_AT_START = [round(x, 2) for x in os.getloadavg()]
ROOT = os.path.dirname(HERE)
WORKLOADS = os.path.join(os.environ.get("TEMPAX_BENCH_SHARED") or os.path.join(ROOT, "..", "shared", "bench"),
                         "workloads.json")


def load_spec() -> dict:
    with open(WORKLOADS) as f:
        return json.load(f)


def matmul_flops(n: int = 4096, repeats: int = 3) -> float:
    """Measured float32 matmul FLOP/s: best of `repeats` timed n x n @ n x n products."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    dot = jax.jit(jnp.dot)
    dot(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        dot(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def measure(workload: str, size: str, remat: str | None = None, memory_only: bool = False,
            precision: str = "fp32") -> dict:
    sys.path.insert(0, ROOT)
    import jax
    import numpy as np
    from flax import nnx

    from tempax.runtime.process import settings_in_effect
    from tempax.algorithms.sft.main import SFTLossConfig, make_sft_loss
    from tempax.models.presets import PRESETS
    from tempax.parallel import make_mesh
    from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig
    from tempax.train.hooks import every
    from tempax.train.loop import Trainer
    from tempax.train.trainable import Trainable
    from tempax.models.init import init_decoder

    spec = load_spec()
    w = spec["workloads"][workload]
    steps = w["steps"][size]
    shape = spec["models"][size]
    model_cfg = PRESETS[f"bench-{size}"]
    assert model_cfg.num_params() == shape["expected_num_params"], "preset does not match workloads.json"
    opt = spec["optimizer"]
    batch, seq = w["batch_size"], w["seq_len"]
    total_steps = steps["warmup"] + steps["measured"]

    # Data first, all before timing: one fresh random batch per step.
    rng = np.random.default_rng(spec["data"]["seed"] + 0)
    tokens = rng.integers(4, model_cfg.vocab_size, size=(total_steps, batch, seq), dtype=np.int64).astype(np.int32)
    tokens[:, :, 0] = 1
    targets = np.concatenate([tokens[:, :, 1:], np.zeros((total_steps, batch, 1), np.int32)], axis=2)
    loss_mask = np.ones((batch, seq), np.int32)
    loss_mask[:, -1] = 0
    positions = np.broadcast_to(np.arange(seq, dtype=np.int32), (batch, seq)).copy()
    segment_ids = np.ones((batch, seq), np.int32)
    batches = [
        {"tokens": tokens[i], "targets": targets[i], "loss_mask": loss_mask, "positions": positions,
         "segment_ids": segment_ids}
        for i in range(total_steps)
    ]

    mesh = make_mesh(devices=jax.devices()[:1])
    model = init_decoder(model_cfg, spec["init"]["seed"], mesh)  # the same weights as the one-program constructor
    trainable = nnx.Param
    if workload == "sft_lora":
        from tempax.models.lora import LoraConfig, apply_lora, lora_filter

        lc = spec["lora"]
        model = apply_lora(model, LoraConfig(rank=lc["rank"], alpha=lc["alpha"], dropout=lc["dropout"],
                                             target_modules=tuple(lc["targets"])), rngs=nnx.Rngs(1))
        trainable = lora_filter
    train_cfg = TrainConfig(
        steps=total_steps, batch_size=batch, seq_len=seq, progress_bar=False, tensorboard=False,
        run_dir="/tmp/tempax-bench-sft", mesh=MeshConfig(num_devices=1), remat=remat, precision=precision,
        optimizer=OptimizerConfig(name="adamw", learning_rate=opt["learning_rate"], b1=opt["b1"], b2=opt["b2"],
                                  eps=opt["eps"], weight_decay=opt["weight_decay"], schedule="constant",
                                  decay_all=True, grad_clip_norm=opt["grad_clip"]),
        checkpoint=CheckpointConfig(save_at_end=False),
    )
    plan_lines: list[str] = []
    loss = SFTLossConfig()  # the SFT recipe defaults: fused head + cross-entropy
    trainer = Trainer(Trainable(model, logit_positions=loss.chunk_len),
                      make_sft_loss(loss.normalize, fused=loss.fused, chunk_len=loss.chunk_len), train_cfg,
                      trainable=trainable, mesh=mesh, log=plan_lines.append)
    del model
    if memory_only:  # XLA's own account of the compiled step, before anything runs
        analysis = trainer.step_memory(batches[0])
        return {"library": "tempax", "remat": remat or "none", "workload": workload, "size": size,
                "xla_temp_gib": round(analysis.temp_size_in_bytes / 2**30, 3),
                "xla_argument_gib": round(analysis.argument_size_in_bytes / 2**30, 3),
                "memory_plan": plan_lines[-1] if plan_lines else None, **settings_in_effect()}
    times: list[float] = []
    losses: list[float] = []

    def record(info: Any) -> None:  # the loop's own step timing: dispatch until the step's results are ready
        times.append(info.train_s)
        losses.append(info.metrics()["loss"])

    trainer.fit(batches, hooks=[every(1, record)])
    trainer.close()
    measured = times[steps["warmup"]:]
    step_time = statistics.median(measured)
    tokens_per_s = batch * seq / step_time
    n = model_cfg.num_params()
    flops_per_token = (6 if workload == "sft_full" else 4) * n
    roofline = matmul_flops()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "library": "tempax",
        "remat": remat or "none",
        "precision": precision,
        "workload": workload,
        "size": size,
        "tokens_per_s": round(tokens_per_s, 1),
        "step_time_s": round(step_time, 4),
        "step_times_s": [round(t, 4) for t in measured],
        "compile_and_first_step_s": round(times[0], 2),
        "model_flops_per_s": round(flops_per_token * tokens_per_s / 1e9, 2) * 1e9,
        "matmul_flops_per_s": round(roofline / 1e9, 2) * 1e9,
        "fraction_of_matmul_roofline": round(flops_per_token * tokens_per_s / roofline, 3),
        "peak_rss_gib": round(peak_kib * 1024 / 2**30, 3),
        "memory_plan": plan_lines[-1] if plan_lines else None,
        "trainable_params": trainer.num_trainable,
        "first_loss": round(losses[0], 4),
        "last_loss": round(losses[-1], 4),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "load_average_at_start": LOAD_AT_START,
        "jax": jax.__version__,
        **settings_in_effect(),
        "devices": str(jax.devices()[0]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("sft_full", "sft_lora", "all"), default="all")
    parser.add_argument("--size", choices=("tiny", "small", "all"), default="all")
    parser.add_argument("--repeats", type=int, default=2, help="separate processes per (workload, size)")
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "SIZE"), help="measure once in this process")
    parser.add_argument("--remat", choices=("none", "dots", "full"), default=None,
                        help="activation recomputation (not part of the workload; default: none)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="train.precision (not part of the float32 workload; default: fp32)")
    parser.add_argument("--memory", nargs=2, metavar=("WORKLOAD", "SIZE"),
                        help="compile one step and print XLA's memory analysis of it (temporaries), no timing")
    args = parser.parse_args()
    if args.one or args.memory:
        print(json.dumps(measure(*(args.one or args.memory), remat=args.remat, memory_only=bool(args.memory),
                                  precision=args.precision)),
              flush=True)
        return 0
    workloads = ("sft_full", "sft_lora") if args.workload == "all" else (args.workload,)
    sizes = ("tiny", "small") if args.size == "all" else (args.size,)
    for workload in workloads:
        for size in sizes:
            for _ in range(args.repeats):
                # One process per measurement, one at a time (workloads.json: "measurement").
                remat = ["--remat", args.remat] if args.remat else []
                remat += ["--precision", args.precision]
                out = subprocess.run([sys.executable, __file__, "--one", workload, size, *remat], capture_output=True,
                                     text=True, cwd=ROOT)
                lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
                if out.returncode or not lines:
                    print(json.dumps({"workload": workload, "size": size, "error": out.stderr[-2000:]}), flush=True)
                else:
                    print(lines[-1], flush=True)
    return 0


if __name__ == "__main__":
    from tempax.runtime.process import setup_process

    setup_process(job="train")  # as `tempax sft` does; TEMPAX_REEXEC=0 measures without
    sys.exit(main())
