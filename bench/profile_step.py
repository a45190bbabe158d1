"""Where a step's time goes: one decode or training step of a benchmark workload under XLA:CPU's per-op trace.

    python bench/profile_step.py decode small          # 40 decode steps of the decode workload
    python bench/profile_step.py sft_full small        # the 4th training step of bench/sft.py's run
    python bench/profile_step.py sft_full small --precision bf16   # the same at train.precision=bf16
    python bench/profile_step.py recipe recipes/dpo_smollm2_lora.yaml train.steps=5   # any training command

Runs the workload as `bench/decode.py` / `bench/sft.py` define it (`recipe CONFIG [key=value ...]`: the 4th
training step of `tempax COMMAND --config CONFIG`, the command read from the file, on the real model it names), with XLA's per-thunk trace on
(`--xla_cpu_enable_xprof_traceme=true`, set here before JAX starts) and the optimized HLO dumped to a temporary
folder, then prints milliseconds per step:
  * by kind of operation (the fusion name without its number: `ynn_fusion` = matrix products, `dot` = other
    products, `copy_bitcast_fusion` = layout copies, ...), summed over both of XLA's worker threads;
  * the most expensive operations grouped by the JAX source operation XLA records for them (`op_name`) and the
    output shape, so e.g. a transposing copy can be traced back to the layer that needs it.
Thread times add up to more than the wall time where both cores work at once.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))


def op_sources(dump_dir: str, module: str) -> dict[str, tuple[str, str]]:
    """Operation name -> (output shape, JAX op_name) from the optimized HLO of the jitted function `module`
    (the largest such module in `dump_dir`)."""
    files = glob.glob(os.path.join(dump_dir, f"*.jit_{module}.*after_optimizations.txt"))
    files = [f for f in files if "buffer-assignment" not in f]
    if not files:
        return {}
    text = open(max(files, key=os.path.getsize)).read()
    pattern = r"%([\w.\-]+) = (\S+) \w[\w\-]*\(.*?metadata=\{op_name=\"([^\"]+)\""
    return {m.group(1): (re.sub(r"\{.*", "", m.group(2)), m.group(3)) for m in re.finditer(pattern, text)}


def summarize(trace_dir: str, dump_dir: str, module: str, steps: int, top: int) -> None:
    from jax.profiler import ProfileData

    path = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))[-1]
    kinds: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    sources: collections.Counter[tuple[str, str]] = collections.Counter()
    source_counts: collections.Counter[tuple[str, str]] = collections.Counter()
    names = op_sources(dump_dir, module)
    for plane in ProfileData.from_file(path).planes:
        for line in plane.lines:
            if "Eigen" not in line.name:  # XLA's worker threads run the operations
                continue
            for event in line.events:
                if event.name.startswith(("ThunkExecutor", "end: ", "SlinkyThreadPool")):
                    continue
                kind = re.sub(r"\.\d+$", "", event.name)
                kinds[kind] += event.duration_ns
                counts[kind] += 1
                shape, op = names.get(event.name, ("?", "?"))
                key = (kind, f"{shape} {re.sub(r'[0-9]+', 'N', op)}")
                sources[key] += event.duration_ns
                source_counts[key] += 1
    print(f"\nby kind of operation, ms per step (thread time, {steps} step(s)):")
    for kind, ns in kinds.most_common(top):
        print(f"  {ns / 1e6 / steps:10.2f}  x{counts[kind] / steps:7.1f}  {kind}")
    print("\nby source operation and output shape, ms per step:")
    for key, ns in sources.most_common(top):
        print(f"  {ns / 1e6 / steps:10.2f}  x{source_counts[key] / steps:7.1f}  {key[0]}: {key[1][:110]}")


def profile_decode(size: str, trace_dir: str, steps: int = 40) -> int:
    import jax
    from flax import nnx

    from decode import load_spec, workload_prompts
    from tempax.generate import SamplingConfig
    from tempax.generate.engine import DecodeRun
    from tempax.models.decoder import Decoder
    from tempax.models.presets import PRESETS

    spec = load_spec()
    w = spec["workloads"]["decode"]
    cfg = PRESETS[f"bench-{size}"]
    model = Decoder(cfg, rngs=nnx.Rngs(spec["init"]["seed"]))
    prompts = workload_prompts(spec, cfg.vocab_size)
    config = SamplingConfig(max_new_tokens=w["max_new_tokens"], temperature=0.0, ignore_eos=True)
    warm = DecodeRun(model, prompts, config, stop_ids=(), pad_id=0)
    warm.advance()  # compiles
    run = DecodeRun(model, prompts, config, stop_ids=(), pad_id=0)
    jax.block_until_ready(run._state)
    jax.profiler.start_trace(trace_dir)
    start = time.perf_counter()
    run.advance(steps)
    elapsed = time.perf_counter() - start
    jax.profiler.stop_trace()
    print(f"decode {size}: {elapsed / steps * 1e3:.1f} ms a step (wall, traced)")
    return steps


def trace_step(trace_dir: str, what: str, traced_step: int = 4) -> None:
    """Traces the `traced_step`-th call of `Trainer.train_step` (every algorithm's step) from now on."""
    import jax

    from tempax.train import loop

    original = loop.Trainer.train_step
    calls = {"n": 0}

    def traced(self, batch):
        calls["n"] += 1
        if calls["n"] != traced_step:
            return original(self, batch)
        jax.profiler.start_trace(trace_dir)
        start = time.perf_counter()
        out = original(self, batch)
        jax.block_until_ready(self.state.params)
        print(f"{what}: step {traced_step} took {time.perf_counter() - start:.2f} s (wall, traced)")
        jax.profiler.stop_trace()
        return out

    loop.Trainer.train_step = traced


def profile_training(workload: str, size: str, trace_dir: str, precision: str = "fp32") -> int:
    import sft

    trace_step(trace_dir, f"{workload} {size}")
    sft.measure(workload, size, precision=precision)
    return 1


def profile_recipe(config: str, overrides: list[str], trace_dir: str) -> int:
    """The 4th step of the training command `config` names (its `command:` key), run as `tempax` would run it."""
    import yaml

    from tempax.algorithms import registry

    with open(config) as f:
        command = yaml.safe_load(f)["command"]
    run_dir = os.path.join(os.path.dirname(trace_dir), "run")
    trace_step(trace_dir, f"{command} ({config})")
    registry.train(command, config, [f"train.run_dir={run_dir}", *overrides])
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=("decode", "sft_full", "sft_lora", "recipe"))
    parser.add_argument("size", help="tiny or small; for `recipe`, the recipe's YAML file")
    parser.add_argument("overrides", nargs="*", help="`recipe` only: key=value overrides of the recipe")
    parser.add_argument("--top", type=int, default=15, help="rows per table")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="train.precision (training)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="tempax-profile-")
    trace_dir, dump_dir = os.path.join(work, "trace"), os.path.join(work, "hlo")
    os.environ["XLA_FLAGS"] = " ".join(
        [os.environ.get("XLA_FLAGS", ""), "--xla_cpu_enable_xprof_traceme=true", f"--xla_dump_to={dump_dir}"]
    ).strip()
    if args.workload != "recipe" and (args.size not in ("tiny", "small") or args.overrides):
        parser.error(f"{args.workload} takes a size, tiny or small, and no overrides")
    if args.workload == "decode":
        steps, module = profile_decode(args.size, trace_dir), "_decode"
    elif args.workload == "recipe":
        steps, module = profile_recipe(args.size, args.overrides, trace_dir), "step"
    else:
        steps, module = profile_training(args.workload, args.size, trace_dir, args.precision), "step"
    summarize(trace_dir, dump_dir, module, steps, args.top)
    print(f"\ntrace and HLO: {work}")
    return 0


if __name__ == "__main__":
    from tempax.runtime.process import setup_process

    setup_process(job="train" if sys.argv[1:2] != ["decode"] else None)  # as the `tempax` command does; TEMPAX_REEXEC=0 measures without
    sys.exit(main())
