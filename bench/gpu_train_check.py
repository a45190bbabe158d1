"""Accelerator check of training: start-up time, SFT tokens/s and MFU of the Llama-3.2-1B shape in bfloat16.

    python bench/gpu_train_check.py                 # where a GPU is lent: the 1B shape, 8 x 1024 tokens a step
    python bench/gpu_train_check.py --tiny          # the same script on a 2-layer, 128-wide copy (CPU smoke run)

For full fine-tuning and LoRA (rank 16, every projection), both with `train.precision=bf16` (bf16 compute,
float32 master weights and optimizer state), it prints one JSON line each with:
  * init_s: `init_decoder` creating the random weights in place (three compiled programs, whatever the depth);
  * first_step_s: compilation plus the first step; step_s: the median of the measured steps;
  * tokens_per_s and MFU: model FLOPs per token (6N for full fine-tuning, 4N for LoRA: forward 2N + input
    gradients 2N; attention's FLOPs are left out, as usual for MFU) times tokens/s, over the peak bf16 matmul
    FLOP/s of the device (`--peak-tflops`, default from a table of dense bf16 peaks by device kind) and over
    the bf16 matmul throughput measured here (an 8192^3 `jnp.dot`; 2048^3 with --tiny).
Random tokens; the loss is only reported. Run it once per lent machine; it takes a few minutes on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

# Dense bfloat16 tensor-core peaks (vendor data sheets, without sparsity), TFLOP/s.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0}


def peak_for(device_kind: str) -> float | None:
    for name, peak in PEAK_BF16_TFLOPS.items():
        if name.lower() in device_kind.lower():
            return peak
    return None


def measured_matmul_flops(n: int) -> float:
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
    dot = jax.jit(jnp.dot)
    dot(a, b).block_until_ready()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        dot(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def run(mode: str, args: argparse.Namespace) -> dict:
    import jax
    import numpy as np
    from flax import nnx

    from tempax.algorithms.sft.main import make_sft_loss
    from tempax.models.init import init_decoder
    from tempax.models.lora import LoraConfig, apply_lora, lora_filter
    from tempax.models.presets import get_preset
    from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig
    from tempax.train.loop import Trainer

    cfg = get_preset("llama3.2-1b").replace(param_dtype="bfloat16" if mode == "lora" else "float32")
    if args.tiny:
        cfg = cfg.replace(num_layers=2, hidden_size=128, intermediate_size=256, num_heads=4, num_kv_heads=2,
                          head_dim=32, vocab_size=2048)
    batch, seq = (2, 64) if args.tiny else (args.batch_size, args.seq_len)
    jax.clear_caches()
    t0 = time.perf_counter()
    model = init_decoder(cfg, 0)
    jax.block_until_ready(nnx.state(model))
    init_s = time.perf_counter() - t0
    trainable = nnx.Param
    if mode == "lora":
        model = apply_lora(model, LoraConfig(rank=16, alpha=32, target_modules=(
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")), rngs=nnx.Rngs(1))
        trainable = lora_filter
    train = TrainConfig(
        steps=args.warmup + args.steps, batch_size=batch, seq_len=seq, precision="bf16", progress_bar=False,
        tensorboard=False, run_dir="/tmp/tempax-gpu-train-check", mesh=MeshConfig(num_devices=1),
        optimizer=OptimizerConfig(learning_rate=1e-5, schedule="constant"),
        checkpoint=CheckpointConfig(save_at_end=False), check_memory=False,
    )
    trainer = Trainer(model, make_sft_loss(), train, trainable=trainable, log=lambda _: None)
    del model
    rng = np.random.default_rng(0)
    times, losses = [], []
    for _ in range(args.warmup + args.steps):
        tokens = rng.integers(4, cfg.vocab_size, (batch, seq)).astype(np.int32)
        b = {"tokens": tokens, "targets": np.roll(tokens, -1, 1), "loss_mask": np.ones_like(tokens),
             "positions": np.broadcast_to(np.arange(seq, dtype=np.int32), (batch, seq)).copy(),
             "segment_ids": np.ones_like(tokens)}
        t = time.perf_counter()
        metrics = trainer.train_step(b)
        jax.block_until_ready(trainer.state.params)
        times.append(time.perf_counter() - t)
        losses.append(float(metrics["loss"]))
    step_s = statistics.median(times[args.warmup:])
    tokens_per_s = batch * seq / step_s
    model_flops = (6 if mode == "full" else 4) * cfg.num_params() * tokens_per_s
    device = jax.devices()[0]
    peak = args.peak_tflops or peak_for(getattr(device, "device_kind", ""))
    matmul = measured_matmul_flops(2048 if args.tiny else 8192)
    return {
        "mode": mode, "shape": "tiny" if args.tiny else "llama3.2-1b", "params": cfg.num_params(),
        "trainable": trainer.num_trainable, "batch": batch, "seq_len": seq, "init_s": round(init_s, 2),
        "first_step_s": round(times[0], 2), "step_s": round(step_s, 4), "tokens_per_s": round(tokens_per_s, 1),
        "model_tflops_per_s": round(model_flops / 1e12, 3),
        "mfu_vs_peak": None if peak is None else round(model_flops / (peak * 1e12), 4), "peak_tflops": peak,
        "mfu_vs_measured_matmul": round(model_flops / matmul, 4), "matmul_tflops": round(matmul / 1e12, 3),
        "loss_first_last": [round(losses[0], 4), round(losses[-1], 4)],
        "device": getattr(device, "device_kind", str(device)), "jax": jax.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a 2-layer, 128-wide copy of the shape (CPU smoke run)")
    ap.add_argument("--modes", default="full,lora")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, default=None, help="the device's peak bf16 TFLOP/s for MFU")
    args = ap.parse_args(argv)
    for mode in args.modes.split(","):
        print(json.dumps(run(mode, args)), flush=True)
    return 0


if __name__ == "__main__":
    from tempax.cli.process import setup_process

    setup_process()
    sys.exit(main())
