"""The memory plan beside XLA's own figure for the compiled train step, for SFT (full and LoRA), DPO and a GRPO step.

    python bench/memory_plan.py                      # preset:llama3.2-1b, bf16, 8 x 1024 (an accelerator's size)
    python bench/memory_plan.py --small              # a 4-layer, 256-wide copy at 4 x 256: a few minutes on a CPU
    python bench/memory_plan.py --workloads sft_full --remat none,full --memory device,bf16_moments,offload_optimizer

For each workload x remat x `train.memory` setting it builds the trainer the algorithm builds (its loss, its
trainable parameters, what its rows hold), from a model of shapes only: no weight is allocated, so a step the
device could not hold still compiles, and XLA's figure for it is read without running it. One JSON line each:

  plan_gib     the plan's total per device with the activations of the loss on this batch (`Trainer.memory_plan
               (batch)`, what a run checks before its first step compiles), and its parts; plan_before_batch_gib,
               the plan made when the trainer is built (a decoder over rows of tokens_per_row)
  xla_gib      XLA's figure from `compiled.memory_analysis()`: arguments + outputs + temporaries - aliased (device
               memory; `xla_host_gib` is what XLA places in host memory). When XLA refuses the step for lack of
               memory, the figure its error gives (`xla_from`: "error") and that error's first line
  ratio        plan / XLA; compile_s, the seconds lowering and compiling took

Workloads (batch rows B, tokens per row T; `--batch`, `--seq-len`):
  sft_full, sft_lora   SFT's fused, chunked loss (its defaults), full fine-tuning or rank-16 LoRA on every projection
  dpo, dpo_lora        DPO's sigmoid loss over B rows (B / 2 pairs) with the reference log-probs in the batch, full
                       fine-tuning; or LoRA with the adapters switched off as the reference (a second forward pass)
  grpo, grpo_full      a GRPO step on B / G prompts of --grpo-prompt-len tokens and G = --grpo-group completions of
                       --grpo-completion-len tokens (LoRA; or full fine-tuning), beta 0.04 (reference log-probs in the
                       batch)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

SMALL_SHAPE = dict(num_layers=4, hidden_size=256, intermediate_size=1024, num_heads=4, num_kv_heads=2, head_dim=64,
                   vocab_size=8192)
WORKLOADS = ("sft_full", "sft_lora", "dpo", "dpo_lora", "grpo", "grpo_full")
GiB = 2**30


def text_batch(rows: int, seq_len: int, vocab: int) -> dict:
    """An SFT / preference batch of whole rows of random tokens, every position supervised but the last."""
    import numpy as np

    rng = np.random.RandomState(0)
    tokens = rng.randint(3, vocab, (rows, seq_len)).astype(np.int32)
    mask = np.ones((rows, seq_len), np.int32)
    mask[:, -1] = 0
    return {"tokens": tokens, "targets": np.roll(tokens, -1, axis=1), "loss_mask": mask,
            "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32), (rows, seq_len)).copy(),
            "segment_ids": np.ones((rows, seq_len), np.int32)}


def rollout_batch(prompts: int, group: int, prompt_len: int, completion_len: int, vocab: int) -> dict:
    """A GRPO batch in `tempax.rl.rollout.build_batch`'s layout, random tokens, every completion full length."""
    import numpy as np

    rng = np.random.RandomState(0)
    shape = (prompts, group, completion_len)
    return {"prompt_tokens": rng.randint(3, vocab, (prompts, prompt_len)).astype(np.int32),
            "prompt_segments": np.ones((prompts, prompt_len), np.int32),
            "completion_tokens": rng.randint(3, vocab, shape).astype(np.int32),
            "completion_mask": np.ones(shape, np.float32), "completion_segments": np.ones(shape, np.int32),
            "advantages": rng.randn(prompts, group).astype(np.float32),
            "ref_logp": -np.ones(shape, np.float32)}


def workload(name: str, cfg, args) -> tuple:
    """(trainable model, loss_fn, trainable filter, batch, seq_len) of one workload, on a model of shapes only."""
    from flax import nnx

    from tempax.algorithms.grpo.config import GRPOKnobsConfig
    from tempax.algorithms.grpo.objective import make_grpo_loss
    from tempax.algorithms.preference.batches import LOGPROB_CHUNK, REF_LOGPS
    from tempax.algorithms.preference.dpo import DPOLoss
    from tempax.algorithms.sft.main import SFTLossConfig, make_sft_loss
    from tempax.models.decoder import Decoder
    from tempax.models.lora import LoraConfig, apply_lora, lora_filter
    from tempax.train.trainable import Trainable

    lora = name in ("sft_lora", "dpo_lora", "grpo")

    def build():
        model = Decoder(cfg, rngs=nnx.Rngs(0))
        return (apply_lora(model, LoraConfig(rank=16, alpha=32.0), rngs=nnx.Rngs(1)) or model) if lora else model

    model = nnx.eval_shape(build)
    trainable = lora_filter if lora else nnx.Param
    b, t = args.batch, args.seq_len
    if name.startswith("sft"):
        spec = SFTLossConfig()
        loss = make_sft_loss(spec.normalize, fused=spec.fused, chunk_len=spec.chunk_len)
        return Trainable(model, logit_positions=spec.chunk_len), loss, trainable, text_batch(b, t, cfg.vocab_size), t
    if name.startswith("dpo"):
        batch = text_batch(b, t, cfg.vocab_size)
        if not lora:
            batch[REF_LOGPS] = -batch["loss_mask"].sum(axis=1).astype("float32")
        loss = DPOLoss(reference="adapters_off" if lora else "batch")
        return Trainable(model, logit_positions=LOGPROB_CHUNK), loss, trainable, batch, t
    group, prompt_len, completion_len = args.grpo_group, args.grpo_prompt_len, args.grpo_completion_len
    prompts = max(b // group, 1)
    batch = rollout_batch(prompts, group, prompt_len, completion_len, cfg.vocab_size)
    row = prompt_len + group * completion_len
    return (Trainable(model, tokens_per_row=row), make_grpo_loss(GRPOKnobsConfig(group_size=group)), trainable,
            batch, prompt_len + completion_len)


def bench_trainer(name: str, cfg, remat: str, memory: str, args, mesh=None) -> tuple:
    """(trainer, batch, rows, tokens per row) of one workload under `remat` and `train.memory=memory`, on `mesh`
    (None: the config's, over this process's devices)."""
    from tempax.train.config import CheckpointConfig, MeshConfig, TrainConfig
    from tempax.train.loop import Trainer
    from tempax.train.optim import OptimizerConfig

    model, loss, trainable, batch, seq_len = workload(name, cfg, args)
    rows = len(next(iter(batch.values())))
    train = TrainConfig(steps=10, batch_size=rows, seq_len=seq_len, precision=args.precision, remat=remat,
                        memory=memory, check_memory=False, progress_bar=False, tensorboard=False, report_to=(),
                        run_dir=os.path.join(args.run_dir, name), mesh=MeshConfig(num_devices=1),
                        optimizer=OptimizerConfig(learning_rate=1e-5),
                        checkpoint=CheckpointConfig(save_at_end=False, async_save=False))
    return Trainer(model, loss, train, trainable=trainable, log=lambda _: None, mesh=mesh), batch, rows, seq_len


def xla_figures(analysis) -> dict:
    """XLA's figures from `compiled.memory_analysis()`, in GiB: device memory (arguments + outputs + temporaries -
    aliased), host memory likewise, and the device's parts."""
    device = (analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes
              - analysis.alias_size_in_bytes)
    host = (analysis.host_argument_size_in_bytes + analysis.host_output_size_in_bytes
            + analysis.host_temp_size_in_bytes - analysis.host_alias_size_in_bytes)
    return dict(xla_from="memory_analysis", xla_gib=round(device / GiB, 3), xla_host_gib=round(host / GiB, 3),
                xla_parts_gib={k: round(getattr(analysis, f"{k}_size_in_bytes") / GiB, 3)
                               for k in ("argument", "output", "temp", "alias")})


def measure(name: str, cfg, remat: str, memory: str, args) -> dict:
    import jax

    from tempax.errors import is_device_out_of_memory
    from tempax.train.memory import xla_bytes_needed

    trainer, batch, rows, seq_len = bench_trainer(name, cfg, remat, memory, args)
    first, plan = trainer.memory_plan(), trainer.memory_plan(batch)
    out = {"workload": name, "remat": remat, "memory": memory, "rows": rows,
           "tokens_per_row": trainer.memory_profile.tokens_per_row or seq_len, "precision": args.precision,
           "plan_gib": round(plan.total / GiB, 3), "plan_before_batch_gib": round(first.total / GiB, 3),
           "plan_parts_gib": {k: round(getattr(plan, k) / GiB, 3) for k in (
               "weights", "compute_copy", "gradients", "optimizer", "activations", "backward", "held", "host")}}
    start = time.perf_counter()
    try:
        analysis = trainer.step_memory(batch)
    except Exception as e:  # a step XLA refuses for lack of memory still has a figure: the one its error gives
        if not is_device_out_of_memory(e):
            raise
        needed = xla_bytes_needed(str(e))
        out.update(xla_from="error", error=str(e).strip().splitlines()[0][:300],
                   xla_gib=None if needed is None else round(needed / GiB, 3))
    else:
        out.update(xla_figures(analysis))
    out["compile_s"] = round(time.perf_counter() - start, 1)
    if out.get("xla_gib"):
        out["ratio"] = round(out["plan_gib"] / out["xla_gib"], 3)
    out.update(backend=jax.default_backend(), device=jax.devices()[0].device_kind)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3.2-1b", help="the model shape (tempax.models.presets)")
    ap.add_argument("--small", action="store_true",
                    help=f"the preset at {SMALL_SHAPE} and 4 x 256 tokens (with --grpo-* scaled down): CPU-sized")
    ap.add_argument("--workloads", default="sft_full,sft_lora,dpo,grpo", help=f"comma-separated, of {WORKLOADS}")
    ap.add_argument("--remat", default="none,dots,full")
    ap.add_argument("--memory", default="device", help="comma-separated train.memory settings (not auto)")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--batch", type=int, default=None, help="rows a step (default 8; 4 with --small)")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens a row (default 1024; 256 with --small)")
    ap.add_argument("--grpo-group", type=int, default=None, help="G (default 8; 4 with --small)")
    ap.add_argument("--grpo-prompt-len", type=int, default=None, help="default 256; 64 with --small")
    ap.add_argument("--grpo-completion-len", type=int, default=None, help="default 512; 128 with --small")
    ap.add_argument("--run-dir", default=os.path.join("runs", "memory_plan"))
    args = ap.parse_args(argv)
    small = args.small
    for key, full_size, small_size in (("batch", 8, 4), ("seq_len", 1024, 256), ("grpo_group", 8, 4),
                                       ("grpo_prompt_len", 256, 64), ("grpo_completion_len", 512, 128)):
        if getattr(args, key) is None:
            setattr(args, key, small_size if small else full_size)

    from tempax.models.presets import get_preset

    cfg = get_preset(args.preset).replace(param_dtype="bfloat16" if args.precision == "bf16" else "float32")
    if small:
        cfg = cfg.replace(**SMALL_SHAPE)
    for name in args.workloads.split(","):
        if name not in WORKLOADS:
            raise SystemExit(f"unknown workload {name!r}: one of {', '.join(WORKLOADS)}")
        for remat in args.remat.split(","):
            for memory in args.memory.split(","):
                row = measure(name, cfg, remat, memory, args)
                row.update(preset=args.preset, small=small)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
