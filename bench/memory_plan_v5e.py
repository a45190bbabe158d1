"""The memory plan beside XLA's figure for the train step compiled for a TPU v5e chip, on a machine without one.

    pip install libtpu          # the TPU compiler; no chip is needed to compile against a v5e's topology
    python bench/memory_plan_v5e.py --workloads sft_lora --remat dots
    python bench/memory_plan_v5e.py --workloads sft_full --remat full --memory offload_optimizer,offload_optimizer_and_master

It builds the trainer `bench/memory_plan.py` builds for each workload (a model of shapes only), on a mesh of one
compile-only v5e device, and compiles its step with the TPU compiler: XLA's figure is then what the chip's
program needs (arguments + outputs + temporaries - aliased, in device memory; `xla_host_gib` in host memory).
`plan_gib` is the plan the run prints before compiling, with the activations traced on the TPU's ops. A step
whose temporaries exceed the chip's 15.75 GiB is refused by the compiler; its message is reported instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# Before JAX loads: the TPU runtime must not look for a chip or a cloud metadata server, and JAX runs on the CPU.
# Compiling opens no chip, so the runtime's one-process lock (a file a finished run may leave behind) is skipped.
for key, value in (("TPU_SKIP_MDS_QUERY", "1"), ("TPU_ACCELERATOR_TYPE", "v5litepod-1"),
                   ("TPU_WORKER_HOSTNAMES", "localhost"), ("JAX_PLATFORMS", "cpu"),
                   ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")):
    os.environ.setdefault(key, value)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

GiB = 2**30


def v5e_mesh():
    """A (data, fsdp, tensor) = (1, 1, 1) mesh on one compile-only v5e device."""
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh

    topology = topologies.get_topology_desc("v5e:1x1", platform="tpu", chips_per_host_bounds=[1, 1, 1],
                                            wrap=[False, False, False])
    return Mesh(np.array(topology.devices).reshape(1, 1, 1), ("data", "fsdp", "tensor"))


def _on_the_cpu(fn):
    """`fn` under a CPU mesh: the trainer derives the optimizer state's shardings from `optimizer.init` on
    placeholders, which makes a few scalars eagerly, and eager arrays cannot live on a compile-only device."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    def wrapped(*args):
        with jax.set_mesh(Mesh(np.array(jax.devices("cpu")[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))):
            return fn(*args)

    return wrapped


def measure(name: str, cfg, remat: str, memory: str, args) -> dict:
    import jax

    import memory_plan
    from tempax import ops
    from tempax.parallel.rules import use_mesh
    from tempax.train import loop

    loop.state_shardings = _on_the_cpu(loop.state_shardings)
    loop.host_state_shardings = _on_the_cpu(loop.host_state_shardings)
    with ops.use_backend("tpu"):
        trainer, batch, rows, seq_len = memory_plan.bench_trainer(name, cfg, remat, memory, args, mesh=v5e_mesh())
        plan = trainer.memory_plan()
        out = {"workload": name, "remat": remat, "memory": memory, "rows": rows, "tokens_per_row": seq_len,
               "precision": args.precision, "plan_gib": round(plan.total / GiB, 3),
               "plan_parts_gib": {k: round(getattr(plan, k) / GiB, 3) for k in (
                   "weights", "compute_copy", "gradients", "optimizer", "activations", "backward", "host")}}
        shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=trainer.batch_sharding) for k, v in batch.items()}
        start = time.perf_counter()
        try:
            with use_mesh(trainer.mesh):
                analysis = trainer._step.lower(trainer.state, trainer.rest, shapes).compile().memory_analysis()
        except Exception as e:  # the compiler refuses a step whose temporaries exceed the chip
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            out.update(xla_from="error", error=str(e).strip().splitlines()[0][:300])
        else:
            figures = memory_plan.xla_figures(analysis)
            out.update(figures, ratio=round(out["plan_gib"] / figures["xla_gib"], 3))
    out["compile_s"] = round(time.perf_counter() - start, 1)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3.2-1b")
    ap.add_argument("--workloads", default="sft_lora,sft_full", help="comma-separated: sft_full, sft_lora, dpo, ...")
    ap.add_argument("--remat", default="dots,full")
    ap.add_argument("--memory", default="device", help="comma-separated train.memory settings (not auto)")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--run-dir", default=os.path.join("runs", "memory_plan_v5e"))
    args = ap.parse_args(argv)
    args.grpo_group, args.grpo_prompt_len, args.grpo_completion_len = 8, 256, 512

    from tempax.models.presets import get_preset

    cfg = get_preset(args.preset).replace(param_dtype="bfloat16" if args.precision == "bf16" else "float32")
    for name in args.workloads.split(","):
        for remat in args.remat.split(","):
            for memory in args.memory.split(","):
                row = measure(name, cfg, remat, memory, args)
                row.update(preset=args.preset, device="TPU v5 lite (compile-only)")
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
