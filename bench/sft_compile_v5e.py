"""How long the TPU compiler takes over the SFT train step for a v5e chip, for each form of the loss, on a machine
without one. Needs libtpu (the TPU compiler; `pip install libtpu`, or its folder on PYTHONPATH); no chip.

    python bench/sft_compile_v5e.py                                 # llama3.2-1b, LoRA r16, bf16, 8 x 1024, remat full
    python bench/sft_compile_v5e.py --layers 2 --repeat 2           # the full 128k vocabulary, two decoder layers
    python bench/sft_compile_v5e.py --forms fused64,plain --workload sft_full

Each form is the SFT loss a run builds from `loss.fused` / `loss.chunk_len` (`SFTLossConfig`) and the
`Trainable(model, logit_positions=...)` it wraps the model in:

  fused64      loss.fused=true  loss.chunk_len=64     the fused head in a scan of 64-position chunks
  fused_whole  loss.fused=true  loss.chunk_len=null   the fused head over the whole sequence at once
  plain        loss.fused=false                       [B, T, V] logits + causal_lm_loss

The trainer is `bench/memory_plan.py`'s (a model of shapes only) on a mesh of one compile-only v5e device
(`bench/memory_plan_v5e.py`). One JSON line per form and repeat: lower_s and compile_s (the seconds `lower()` and
`compile()` took on this machine; *_cpu_s, the CPU seconds of this process, every thread, which a CPU shared
with other work inflates less), hlo_ops (instructions in the optimized HLO), whiles (while loops in
it), XLA's cost analysis (flops, bytes accessed) and its memory figure. The cost analysis counts a while loop's
body once, whatever its trip count: the layers' scan in every form, and fused64's 16 chunks too, so its flops
compare between fused_whole and plain only. Times on a shared CPU are inflated; compare the forms within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import memory_plan_v5e  # noqa: E402  (sets the TPU runtime's environment before JAX loads)

FORMS = {"fused64": (True, 64), "fused_whole": (True, None), "plain": (False, None)}
GiB = 2**30


def loss_spec(form: str):
    """The `SFTLossConfig` of a form."""
    from tempax.algorithms.sft.main import SFTLossConfig

    fused, chunk_len = FORMS[form]
    return SFTLossConfig(fused=fused, chunk_len=chunk_len)


def optimized_hlo_counts(text: str) -> tuple[int, int]:
    """(instructions, while loops) in an optimized HLO module's text."""
    ops = sum(1 for line in text.splitlines() if re.match(r"\s*(ROOT\s+)?%?[\w.\-]+ = ", line))
    return ops, len(re.findall(r"\bwhile\(", text))


def measure(form: str, workload: str, cfg, args) -> dict:
    import jax

    import memory_plan
    from tempax import ops
    from tempax.algorithms.sft.main import make_sft_loss
    from tempax.parallel.rules import use_mesh
    from tempax.train.trainable import Trainable

    with ops.use_backend("tpu"):
        spec = loss_spec(form)
        original = memory_plan.workload

        def sft_workload(name, cfg, args):
            model, _, trainable, batch, seq_len = original(name, cfg, args)
            loss = make_sft_loss(spec.normalize, fused=spec.fused, chunk_len=spec.chunk_len)
            return (Trainable(model.module, logit_positions=spec.chunk_len if spec.fused else None), loss, trainable,
                    batch, seq_len)

        # memory_plan builds SFT with SFTLossConfig()'s form; the trainer it builds around is otherwise the one wanted
        memory_plan.workload = sft_workload
        try:
            trainer, batch, rows, seq_len = memory_plan.bench_trainer(workload, cfg, args.remat, "device", args,
                                                                      mesh=memory_plan_v5e.v5e_mesh())
        finally:
            memory_plan.workload = original
        shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=trainer.batch_sharding) for k, v in batch.items()}
        with use_mesh(trainer.mesh):
            start, cpu_start = time.perf_counter(), time.process_time()
            lowered = trainer._step.lower(trainer.state, trainer.rest, shapes)
            lowered_at, cpu_lowered_at = time.perf_counter(), time.process_time()
            compiled = lowered.compile()
            compiled_at, cpu_compiled_at = time.perf_counter(), time.process_time()
    ops_count, whiles = optimized_hlo_counts(compiled.as_text())
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {"form": form, "fused": spec.fused, "chunk_len": spec.chunk_len, "workload": workload,
            "layers": cfg.num_layers, "vocab": cfg.vocab_size, "rows": rows, "tokens_per_row": seq_len,
            "remat": args.remat, "lower_s": round(lowered_at - start, 1), "compile_s": round(compiled_at - lowered_at, 1),
            "lower_cpu_s": round(cpu_lowered_at - cpu_start, 1), "compile_cpu_s": round(cpu_compiled_at - cpu_lowered_at, 1),
            "hlo_ops": ops_count, "whiles": whiles, "tflops": round(cost.get("flops", 0.0) / 1e12, 3),
            "bytes_accessed_gib": round(cost.get("bytes accessed", 0.0) / GiB, 2),
            **memory_plan.xla_figures(compiled.memory_analysis()), "device": "TPU v5 lite (compile-only)"}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3.2-1b")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the preset's)")
    ap.add_argument("--workload", default="sft_lora", choices=("sft_lora", "sft_full"))
    ap.add_argument("--forms", default="fused64,fused_whole,plain", help=f"comma-separated, of {', '.join(FORMS)}")
    ap.add_argument("--remat", default="full")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=1, help="compile every form this many times, forms interleaved")
    ap.add_argument("--run-dir", default=os.path.join("runs", "sft_compile_v5e"))
    args = ap.parse_args(argv)
    forms = args.forms.split(",")
    unknown = [f for f in forms if f not in FORMS]
    if unknown:
        raise SystemExit(f"unknown form(s) {', '.join(unknown)}: each one of {', '.join(FORMS)}")

    from tempax.models.presets import get_preset

    cfg = get_preset(args.preset).replace(param_dtype="bfloat16" if args.precision == "bf16" else "float32")
    if args.layers:
        cfg = cfg.replace(num_layers=args.layers)
    from tempax.train import loop

    loop.state_shardings = memory_plan_v5e._on_the_cpu(loop.state_shardings)
    loop.host_state_shardings = memory_plan_v5e._on_the_cpu(loop.host_state_shardings)
    for _ in range(args.repeat):
        for form in forms:
            row = measure(form, args.workload, cfg, args)
            row.update(preset=args.preset)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
