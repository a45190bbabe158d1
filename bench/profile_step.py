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

On a TPU (or any backend with its own device plane in the trace) the tables come from the chip's own timeline
instead (`summarize_device`): milliseconds per step by the profiler's HLO category (`convolution fusion` = matrix
products, `custom-call` = Pallas kernels such as splash attention, `data formatting` = layout copies, ...), the
most expensive operations by JAX source operation, the programs the step ran (each one a host dispatch), and the
chip's busy time against the traced wall time: what is left is idle, where the chip waits on the host.

    python bench/profile_step.py grpo small             # two whole GRPO steps (rollouts and update), after warm-up
    python bench/profile_step.py decode llama3.2-1b --batch 64   # a preset's shape, bf16, random weights
    python bench/profile_step.py decode small --json OUT/decode.json --keep OUT/trace   # tables as JSON, trace kept
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import glob
import json
import os
import pstats
import re
import shutil
import sys
import tempfile
import time
from typing import Any, Iterable

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


Event = tuple[str, int, int, dict[str, Any]]  # name, start ns, duration ns, the profiler's stats


def device_timeline(profile) -> tuple[list[Event], list[Event], str] | None:
    """The first accelerator plane of a trace (`/device:TPU:0`, ...): its "XLA Ops" and "XLA Modules" events, and
    the plane's name; None where the trace has no accelerator plane (XLA:CPU)."""
    for plane in profile.planes:
        if not plane.name.startswith("/device:") or "CPU" in plane.name:
            continue
        lines = {line.name: line for line in plane.lines}
        if "XLA Ops" not in lines:
            continue

        def events(name: str) -> list[Event]:
            if name not in lines:
                return []
            return [(e.name, int(e.start_ns), int(e.duration_ns), event_stats(e)) for e in lines[name].events]

        return events("XLA Ops"), events("XLA Modules"), plane.name
    return None


def event_stats(event) -> dict[str, Any]:
    """An event's stats as a dict (the profiler yields them as (name, value) pairs)."""
    try:
        return {str(key): value for key, value in event.stats}
    except (TypeError, ValueError):
        return {}


def leaf_events(events: Iterable[Event]) -> list[Event]:
    """The events that contain no other event: a loop's or a call's own event spans the operations it runs, and
    counting both would count their time twice."""
    ordered = sorted(events, key=lambda e: (e[1], -e[2]))
    leaves = []
    for i, event in enumerate(ordered):
        end = event[1] + event[2]
        follower = ordered[i + 1] if i + 1 < len(ordered) else None
        if follower is not None and follower[1] < end and follower[1] + follower[2] <= end and follower[2] < event[2]:
            continue
        leaves.append(event)
    return leaves


def busy_ns(events: Iterable[Event]) -> int:
    """Nanoseconds covered by at least one event (the union of their intervals)."""
    total, reach = 0, None
    for _, start, duration, _ in sorted(events, key=lambda e: e[1]):
        end = start + duration
        if reach is None or start >= reach:
            total += duration
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


FUSION_KINDS = {"kOutput": "products (convolution fusions)", "kLoop": "elementwise (loop fusions)",
                "kInput": "reductions (input fusions)"}


def op_category(name: str, stats: dict[str, Any]) -> str:
    """What kind of operation an event is: the profiler's own HLO category where the trace has one; for an event
    named by its HLO instruction's text (`%fusion.3 = bf16[...] fusion(...), kind=kOutput, ...`, as a TPU trace
    names them) the opcode, a fusion by its kind (a TPU's kOutput fusions are rooted at a matrix product) and a
    custom call as a Pallas kernel; else the operation's name without its number."""
    category = stats.get("hlo_category")
    if category:
        return str(category)
    found = re.match(r"%[\w.\-]+ = .*? ([\w\-]+)\(", name)
    if found is None:
        return re.sub(r"\.\d+$", "", name)
    opcode = found.group(1)
    if opcode == "fusion":
        kind = re.search(r"kind=(k\w+)", name)
        return FUSION_KINDS.get(kind.group(1) if kind else "", f"fusion {kind.group(1) if kind else ''}".strip())
    return "Pallas kernels (custom-call)" if opcode == "custom-call" else opcode


def op_source(stats: dict[str, Any], name: str = "") -> str:
    """The JAX source operation behind an HLO operation, numbers folded (`.../dot_general`), from its stats; else
    the instruction's name and output shape from an event named by its HLO text."""
    op = str(stats.get("tf_op") or "")
    if not op:
        found = re.search(r'op_name="([^"]+)"', str(stats.get("long_name") or ""))
        op = found.group(1) if found else ""
    if op:
        return re.sub(r"[0-9]+", "N", op)
    head = re.match(r"(%[\w.\-]+ = (?:\([^)]*\)|\S+))", re.sub(r"\{[^}]*\}", "", name))
    return head.group(1) if head else "?"


def summarize_device(ops: list[Event], modules: list[Event], plane: str, *, steps: int, wall_s: float,
                     top: int = 15) -> dict[str, Any]:
    """Prints and returns where the traced steps' device time went: by HLO category, by source operation, by
    program, and busy against `wall_s` (milliseconds per step; idle is the wall time the chip ran nothing)."""
    leaves = leaf_events(ops)
    per_step = lambda ns: round(ns / 1e6 / steps, 3)  # noqa: E731
    categories: collections.Counter[str] = collections.Counter()
    sources: collections.Counter[tuple[str, str]] = collections.Counter()
    for name, _, duration, stats in leaves:
        categories[op_category(name, stats)] += duration
        sources[(op_category(name, stats), op_source(stats, name))] += duration
    programs: collections.Counter[str] = collections.Counter()
    program_calls: collections.Counter[str] = collections.Counter()
    for name, _, duration, _ in modules:
        program = re.sub(r"\(\d+\)$", "", name)
        programs[program] += duration
        program_calls[program] += 1
    busy = busy_ns(leaves)
    wall_ms = wall_s * 1e3 / steps
    table = {
        "device": plane, "steps": steps, "wall_ms_per_step": round(wall_ms, 3), "busy_ms_per_step": per_step(busy),
        "idle_ms_per_step": round(wall_ms - busy / 1e6 / steps, 3),
        "by_category_ms": {k: per_step(v) for k, v in categories.most_common()},
        "by_source_ms": [[k[0], k[1], per_step(v)] for k, v in sources.most_common(top)],
        "programs": [[k, program_calls[k] / steps, per_step(v)] for k, v in programs.most_common(top)],
    }
    print(f"\n{plane}: {steps} step(s); ms per step: wall {wall_ms:.2f}, chip busy {table['busy_ms_per_step']:.2f}, "
          f"idle {table['idle_ms_per_step']:.2f} (the chip waiting on the host)")
    print("\nby HLO category, ms per step:")
    for kind, ms in list(table["by_category_ms"].items())[:top]:
        print(f"  {ms:10.3f}  {kind}")
    print("\nby source operation, ms per step:")
    for kind, op, ms in table["by_source_ms"]:
        print(f"  {ms:10.3f}  {kind}: {op[:120]}")
    print("\nprograms (one host dispatch each), calls and ms per step:")
    for program, calls, ms in table["programs"]:
        print(f"  {ms:10.3f}  x{calls:6.1f}  {program[:100]}")
    return table


def decode_model(size: str):
    """The model and config of the decode profile: `tiny`/`small` are the shared workload's float32 bench presets,
    any other name a preset of `tempax.models.presets` in bfloat16 (random weights, seed 0)."""
    from flax import nnx

    from tempax.models.decoder import Decoder
    from tempax.models.init import init_decoder
    from tempax.models.presets import PRESETS, get_preset

    if size in ("tiny", "small"):
        from decode import load_spec

        cfg = PRESETS[f"bench-{size}"]
        return Decoder(cfg, rngs=nnx.Rngs(load_spec()["init"]["seed"])), cfg
    cfg = get_preset(size).replace(param_dtype="bfloat16", dtype="bfloat16")
    return init_decoder(cfg, 0), cfg


def profile_decode(size: str, trace_dir: str, steps: int = 40, batch: int | None = None) -> tuple[int, float]:
    import jax
    import numpy as np

    from decode import load_spec, workload_prompts
    from tempax.generate import SamplingConfig
    from tempax.generate.engine import DecodeRun

    spec = load_spec()
    w = spec["workloads"]["decode"]
    model, cfg = decode_model(size)
    if batch is None and size in ("tiny", "small"):
        prompts = workload_prompts(spec, cfg.vocab_size)
        new = w["max_new_tokens"]
    else:  # gpu_train_check's decode shape: 64-token prompts, 128 new tokens
        prompts = np.random.default_rng(1).integers(4, cfg.vocab_size, (batch or 1, 64)).tolist()
        new = 128
    steps = min(steps, new - 2)
    config = SamplingConfig(max_new_tokens=new, temperature=0.0, ignore_eos=True)
    warm = DecodeRun(model, prompts, config, stop_ids=(), pad_id=0)
    warm.advance()  # compiles
    run = DecodeRun(model, prompts, config, stop_ids=(), pad_id=0)
    jax.block_until_ready(run._state)
    jax.profiler.start_trace(trace_dir)
    start = time.perf_counter()
    run.advance(steps)
    jax.block_until_ready(run._state)
    elapsed = time.perf_counter() - start
    jax.profiler.stop_trace()
    print(f"decode {size} batch {len(prompts)}: {elapsed / steps * 1e3:.2f} ms a step (wall, traced)")
    return steps, elapsed


def profile_grpo(size: str, trace_dir: str, traced_steps: int = 2) -> tuple[int, float]:
    """Whole steps of bench/grpo_step.py's workload (rollouts, rewards, reference and update) right after its
    warm-up steps, traced together."""
    import jax

    import grpo_step
    from tempax.algorithms.grpo.source import grpo_hooks
    from tempax.train.guards import CollapseGuardConfig
    from tempax.train.hooks import Hook

    trainer, source, _, steps = grpo_step.build(size, steps={"warmup": 2, "measured": traced_steps})
    first = steps["warmup"]
    window: dict[str, float] = {}
    host = cProfile.Profile()

    class TraceWindow(Hook):
        def __call__(self, info):
            if info.step == first:
                jax.profiler.start_trace(trace_dir)
                window["start"] = time.perf_counter()
                host.enable()
            elif info.step == first + traced_steps:
                jax.block_until_ready(info.trainer.params)
                host.disable()
                window["elapsed"] = time.perf_counter() - window["start"]
                jax.profiler.stop_trace()

    trainer.fit(source, hooks=[*grpo_hooks(source, CollapseGuardConfig(enabled=False)), TraceWindow()])
    trainer.close()
    print(f"grpo_step {size}: {window['elapsed'] / traced_steps:.3f} s a step (wall, traced, {traced_steps} steps)")
    HOST["functions"] = host_functions(pstats.Stats(host), traced_steps)
    return traced_steps, window["elapsed"]


HOST: dict[str, list] = {}  # the host's busiest functions over a traced window, where the workload profiles them


def host_functions(stats: "pstats.Stats", steps: int, top: int = 20) -> list[list]:
    """[function, own ms per step, cumulative ms per step] of the host's Python during the traced steps, by own
    time: what the host did while the chip idled (waits on the chip show as the function that blocked)."""
    rows = []
    for (path, line, name), (_, _, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = re.sub(r".*/(site-packages|tempax|bench)/", r"\1/", path)
        rows.append([f"{where}:{line}({name})", round(own * 1e3 / steps, 3), round(cumulative * 1e3 / steps, 3)])
    return sorted(rows, key=lambda row: -row[1])[:top]


TRACED: dict[str, float] = {}  # the traced step's wall seconds, set by `trace_step`'s wrapper


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
        TRACED["elapsed"] = time.perf_counter() - start
        print(f"{what}: step {traced_step} took {TRACED['elapsed']:.2f} s (wall, traced)")
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
    parser.add_argument("workload", choices=("decode", "sft_full", "sft_lora", "grpo", "recipe"))
    parser.add_argument("size", help="tiny or small (decode: also a preset's name); for `recipe`, the recipe's YAML")
    parser.add_argument("overrides", nargs="*", help="`recipe` only: key=value overrides of the recipe")
    parser.add_argument("--top", type=int, default=15, help="rows per table")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="train.precision (training)")
    parser.add_argument("--batch", type=int, default=None, help="decode: rows (64-token prompts, 128 new tokens)")
    parser.add_argument("--json", default=None, help="write the device tables to this file as JSON")
    parser.add_argument("--keep", default=None, help="copy the trace folder here")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="tempax-profile-")
    trace_dir, dump_dir = os.path.join(work, "trace"), os.path.join(work, "hlo")
    os.environ["XLA_FLAGS"] = " ".join(
        [os.environ.get("XLA_FLAGS", ""), "--xla_cpu_enable_xprof_traceme=true", f"--xla_dump_to={dump_dir}"]
    ).strip()
    sized = ("tiny", "small")
    if args.workload not in ("recipe", "decode") and (args.size not in sized or args.overrides):
        parser.error(f"{args.workload} takes a size, tiny or small, and no overrides")
    if args.workload == "decode" and args.overrides:
        parser.error("decode takes a size or a preset's name, and no overrides")
    if args.workload == "decode":
        (steps, elapsed), module = profile_decode(args.size, trace_dir, batch=args.batch), "_decode"
    elif args.workload == "grpo":
        (steps, elapsed), module = profile_grpo(args.size, trace_dir), "step"
    elif args.workload == "recipe":
        steps, module = profile_recipe(args.size, args.overrides, trace_dir), "step"
        elapsed = TRACED["elapsed"]
    else:
        steps, module = profile_training(args.workload, args.size, trace_dir, args.precision), "step"
        elapsed = TRACED["elapsed"]
    path = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))[-1]
    from jax.profiler import ProfileData

    device = device_timeline(ProfileData.from_file(path))
    if device is None:
        summarize(trace_dir, dump_dir, module, steps, args.top)
    else:
        table = summarize_device(*device, steps=steps, wall_s=elapsed, top=args.top)
        table.update(workload=args.workload, size=args.size, overrides=args.overrides, batch=args.batch)
        if HOST.get("functions"):
            table["host_functions"] = HOST["functions"]
        if args.json:
            with open(args.json, "w") as f:
                json.dump(table, f, indent=1)
    if HOST.get("functions"):
        print("\nthe host's Python in the traced steps, by own time (ms per step: own, cumulative):")
        for function, own, cumulative in HOST["functions"][: args.top]:
            print(f"  {own:10.3f} {cumulative:10.3f}  {function[:110]}")
    if args.keep:
        shutil.copytree(trace_dir, args.keep, dirs_exist_ok=True)
    print(f"\ntrace and HLO: {work}")
    return 0


if __name__ == "__main__":
    from tempax.runtime.process import setup_process

    setup_process(job="train" if sys.argv[1:2] != ["decode"] else None)  # as the `tempax` command does; TEMPAX_REEXEC=0 measures without
    sys.exit(main())
