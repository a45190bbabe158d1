"""Accelerator check, one script sized for about 15 minutes of one GPU: SFT, decoding and a GRPO step.

    python bench/gpu_train_check.py                 # where a GPU is lent: the 1B shape, 8 x 1024 tokens a step
    python bench/gpu_train_check.py --tiny          # the same script on 2-layer, 128-wide copies (CPU smoke run)
    python bench/gpu_train_check.py --parts decode --decode-batches 1   # one part, one setting

Parts (`--parts`, default all three; each prints JSON lines, and a part that fails prints its error and the
script goes on to the next):

* `train`: SFT of the exact Llama-3.2-1B shape, full fine-tuning and LoRA, for every attention implementation
  (`--attention`: "cudnn" = `jax.nn.dot_product_attention` on cuDNN's fused kernel, "tempax" = the einsum
  attention; `ModelConfig.attention_impl`) and every remat choice (`--remat`: none, dots, full). Each line:
  * init_s: `init_decoder` creating the random weights in place (three compiled programs, whatever the depth);
  * first_step_s: compilation plus the first step; step_s: the median of the measured steps;
  * tokens_per_s and MFU: model FLOPs per token (6N for full fine-tuning, 4N for LoRA: forward 2N + input
    gradients 2N; attention's FLOPs are left out, as usual for MFU) times tokens/s, over the peak bf16 matmul
    FLOP/s of the device (`--peak-tflops`, default from a table of dense bf16 peaks by device kind) and over
    the bf16 matmul throughput measured here (an 8192^3 `jnp.dot`; 512^3 with --tiny).
  Random tokens; the loss is only reported.
* `decode`: greedy decoding of random-weight bfloat16 models of the SmolLM2-135M and Llama-3.2-1B shapes at
  batch 1 and 64 (`--decode-batches`), 64-token prompts, 128 new tokens. tokens/s is batch x steps / decode
  time of the second call (the first compiles); every step reads all weights once plus the whole KV-cache
  buffer (the engine attends over its preallocated length, masked), so bytes per step = weight bytes + K and
  V bytes of the buffer, and the fraction of HBM bandwidth is bytes per step x steps per second over the
  device's peak (`--hbm-tbps`, default from a table by device kind: H200 4.8 TB/s).
* `grpo`: `bench/grpo_step.py`'s measurement of the shared grpo_step workload, small (tiny with --tiny); it
  reads `workloads.json` from `--shared` (default: the shared bench folder next to the checkout).

With `--tiny` the shapes shrink (2 layers, 128 wide) and "cudnn" becomes "xla" (no cuDNN on a CPU), so the whole
script runs on a CPU in about a minute; `tests/bench/test_gpu_train_check.py` runs it so.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

# Dense bfloat16 tensor-core peaks (vendor data sheets, without sparsity), TFLOP/s.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0}
# HBM bandwidth (vendor data sheets), TB/s: H100 SXM 3.35, A100 80GB 2.0.
PEAK_HBM_TBPS = {"H200": 4.8, "H100": 3.35, "A100": 2.0, "L4": 0.3, "A10": 0.6}
TINY_SHAPE = dict(num_layers=2, hidden_size=128, intermediate_size=256, num_heads=4, num_kv_heads=2, head_dim=32,
                  vocab_size=2048)


def peak_for(device_kind: str, table: dict[str, float] = PEAK_BF16_TFLOPS) -> float | None:
    for name, peak in table.items():
        if name.lower() in device_kind.lower():
            return peak
    return None


def kv_bytes_per_step(cfg, batch: int, cache_len: int, bytes_per_value: int) -> int:
    """K and V of every layer over the whole cache buffer: 2 x layers x batch x kv_heads x cache_len x head_dim
    values (e.g. SmolLM2-135M, batch 1, 256 slots, bf16: 2 x 30 x 1 x 3 x 256 x 64 x 2 B = 5.9 MB)."""
    return 2 * cfg.num_layers * batch * cfg.num_kv_heads * cache_len * cfg.head_dim * bytes_per_value


@functools.lru_cache(maxsize=None)
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


def run(mode: str, args: argparse.Namespace, attention: str = "tempax", remat: str = "none") -> dict:
    import jax
    import numpy as np
    from flax import nnx

    from tempax.algorithms.sft.main import make_sft_loss
    from tempax.models.init import init_decoder
    from tempax.models.lora import LoraConfig, apply_lora, lora_filter
    from tempax.models.presets import get_preset
    from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig
    from tempax.train.loop import Trainer

    cfg = get_preset("llama3.2-1b").replace(param_dtype="bfloat16" if mode == "lora" else "float32",
                                            attention_impl=attention)
    if args.tiny:
        cfg = cfg.replace(**TINY_SHAPE)
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
        steps=args.warmup + args.steps, batch_size=batch, seq_len=seq, precision="bf16", remat=remat,
        progress_bar=False,
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
    matmul = measured_matmul_flops(512 if args.tiny else 8192)  # once per process
    return {
        "part": "train", "mode": mode, "attention": attention, "remat": remat,
        "shape": "tiny" if args.tiny else "llama3.2-1b", "params": cfg.num_params(),
        "trainable": trainer.num_trainable, "batch": batch, "seq_len": seq, "init_s": round(init_s, 2),
        "first_step_s": round(times[0], 2), "step_s": round(step_s, 4), "tokens_per_s": round(tokens_per_s, 1),
        "model_tflops_per_s": round(model_flops / 1e12, 3),
        "mfu_vs_peak": None if peak is None else round(model_flops / (peak * 1e12), 4), "peak_tflops": peak,
        "mfu_vs_measured_matmul": round(model_flops / matmul, 4), "matmul_tflops": round(matmul / 1e12, 3),
        "loss_first_last": [round(losses[0], 4), round(losses[-1], 4)],
        "device": getattr(device, "device_kind", str(device)), "jax": jax.__version__,
    }


def decode(shape: str, batch: int, args: argparse.Namespace) -> dict:
    import jax
    import numpy as np

    from tempax.generate import SamplingConfig
    from tempax.generate.engine import DecodeRun, bucket_batch, bucket_length
    from tempax.models.init import init_decoder
    from tempax.models.presets import get_preset

    cfg = get_preset(shape).replace(param_dtype="bfloat16", dtype="bfloat16")
    if args.tiny:
        cfg = cfg.replace(**TINY_SHAPE)
    prompt_len, new = 64, 128
    model = init_decoder(cfg, 0)
    prompts = np.random.default_rng(1).integers(4, cfg.vocab_size, (batch, prompt_len)).tolist()
    config = SamplingConfig(max_new_tokens=new, temperature=0.0, ignore_eos=True, logprobs=False)
    calls = []
    for _ in range(2):  # the first compiles
        t = time.perf_counter()
        run = DecodeRun(model, prompts, config, stop_ids=(), pad_id=0)
        run.advance()
        out = run.output()
        calls.append({"wall_s": time.perf_counter() - t, "prefill_s": out.prefill_s, "decode_s": out.decode_s,
                      "steps": out.steps})
    last = calls[-1]
    decode_steps = last["steps"] - 1  # prefill gives the first token
    steps_per_s = decode_steps / last["decode_s"]
    cache_len = bucket_length(prompt_len) + bucket_length(new)  # the engine's buffer, as DecodeRun sizes it
    weight_bytes = 2 * cfg.num_params()
    step_bytes = weight_bytes + kv_bytes_per_step(cfg, bucket_batch(batch), cache_len, 2)
    device = jax.devices()[0]
    kind = getattr(device, "device_kind", str(device))
    hbm = args.hbm_tbps or peak_for(kind, PEAK_HBM_TBPS)
    return {
        "part": "decode", "shape": "tiny-" + shape if args.tiny else shape, "params": cfg.num_params(),
        "batch": batch, "prompt_len": prompt_len, "new_tokens": new, "first_call_s": round(calls[0]["wall_s"], 2),
        "prefill_s": round(last["prefill_s"], 4), "decode_s": round(last["decode_s"], 4),
        "tokens_per_s": round(batch * steps_per_s, 1), "bytes_per_step": step_bytes,
        "read_tb_per_s": round(step_bytes * steps_per_s / 1e12, 4), "hbm_tbps": hbm,
        "fraction_of_hbm": None if hbm is None else round(step_bytes * steps_per_s / (hbm * 1e12), 4),
        "device": kind, "jax": jax.__version__,
    }


def grpo(args: argparse.Namespace) -> dict:
    import bench.grpo_step as grpo_step

    if args.shared:
        grpo_step.SHARED = args.shared
    return {"part": "grpo", **grpo_step.measure("tiny" if args.tiny else "small")}


def _report(part: str, fn, *fn_args, **labels) -> None:
    """Prints fn's JSON record, or the error it raised (with the part's labels): the other parts still run."""
    try:
        record = fn(*fn_args)
    except Exception as e:  # noqa: BLE001 - a GPU run must report every part it can, whatever one part hits
        record = {"part": part, **labels, "error": f"{type(e).__name__}: {e}"[:2000]}
    print(json.dumps(record), flush=True)


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a 2-layer, 128-wide copy of the shape (CPU smoke run)")
    ap.add_argument("--modes", default="full,lora")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, default=None, help="the device's peak bf16 TFLOP/s for MFU")
    ap.add_argument("--parts", default="train,decode,grpo", help="comma-separated: train, decode, grpo")
    ap.add_argument("--attention", default="cudnn,tempax", help="train: attention implementations to try")
    ap.add_argument("--remat", default="none,full", help="train: remat choices to try (none, dots, full)")
    ap.add_argument("--decode-shapes", default="smollm2-135m,llama3.2-1b")
    ap.add_argument("--decode-batches", default="1,64")
    ap.add_argument("--hbm-tbps", type=float, default=None, help="the device's HBM bandwidth in TB/s")
    ap.add_argument("--shared", default=None, help="the shared bench folder (workloads.json) for the grpo part")
    args = ap.parse_args(argv)
    parts = _names(args.parts)
    if "train" in parts:
        for mode in _names(args.modes):
            for attention in _names(args.attention):
                attention = "xla" if args.tiny and attention == "cudnn" else attention
                for remat in _names(args.remat):
                    _report("train", run, mode, args, attention, remat, mode=mode, attention=attention,
                            remat=remat)
    if "decode" in parts:
        for shape in _names(args.decode_shapes):
            for batch in (int(b) for b in _names(args.decode_batches)):
                _report("decode", decode, shape, batch, args, shape=shape, batch=batch)
    if "grpo" in parts:
        _report("grpo", grpo, args)
    return 0


if __name__ == "__main__":
    from tempax.runtime.process import setup_process

    setup_process()
    sys.exit(main())
