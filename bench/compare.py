"""tempax against its peers on this machine: every shared workload, interleaved, and one ratio table.

    python bench/compare.py                                   # 4 workloads x tiny, small; 2 repeats each side
    python bench/compare.py --sizes tiny --workloads sft_full,decode --repeats 3 --out runs/cmp.jsonl
    python bench/compare.py --lock LOCK_FILE --out runs/cmp.jsonl   # hold a lock file for each tempax/peer pair
    python bench/compare.py --dtype bf16 --workloads sft_full,sft_lora --sizes small
    python bench/compare.py --table-from runs/cmp.jsonl       # the table again from kept records, no measuring

A measuring run appends its table to `docs/measurements/performance-history.md` (`--page`; `--page ''` writes
nothing), at the end of its "Runs appended by the benchmarks", under a heading that names the CPU class
(`tempax.runtime.host.cpu_class`: AVX-512 + AMX, AVX-512, AVX2) and what ran, with the command that repeats it, the
CPU, the load and the flags. The page names no date: the raw records (`--out`) keep each measurement's UTC time.

For each (workload, size) cell it runs tempax's own one-measurement entry point (`bench/sft.py --one W S`,
`bench/decode.py --one S`, `bench/grpo_step.py --one S`) and each peer's that measures the workload
(`--peers`): `bench/peers.py --one W S` (transformers + PyTorch, peft for LoRA, TRL's GRPOTrainer for
grpo_step) and, for decode, `bench/peers_tunix.py --one decode S` (Tunix's Sampler, run by Tunix's own Python,
`bash scripts/setup.sh --tunix`; without it the Tunix rows say "not run"). The sides alternate, tempax, peers,
tempax, peers ... `--repeats` times, each measurement its own process and one at a time, as workloads.json's
"measurement" asks. Interleaving puts every side under the same background load; the table has a row per peer
with each side's median over its repeats and the repeats themselves, so the spread is visible.

The ratio is oriented so that > 1 means tempax is faster: tempax / peer for throughputs (tokens/s), peer /
tempax for grpo_step's seconds per step. Peak RSS is each process's ru_maxrss (the largest over the repeats).
A measurement that fails is shown with its error in its cell; the run carries on.

`--dtype bf16` (sft_full, sft_lora) runs the peer under CPU autocast to bfloat16 with float32 master weights
(bench/peers.py --dtype bf16) and tempax with `bench/sft.py --precision bf16` (train.precision=bf16). A tempax
checkout whose bench/sft.py has no --precision option shows that error in its cells, beside the peer figures.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import json
import os
import re
import statistics
import sys
from collections.abc import Iterator, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.peers import run_measurement  # noqa: E402  (after ROOT is importable when run as a script)
from bench.peers_tunix import TUNIX_SETUP, tunix_python  # noqa: E402

# workload -> (the figure's key in every side's JSON, its unit, whether a larger figure is faster, the name of
# the transformers-side peer)
METRICS = {
    "sft_full": ("tokens_per_s", "tokens/s", True, "PyTorch"),
    "sft_lora": ("tokens_per_s", "tokens/s", True, "PyTorch + peft"),
    "decode": ("generated_tokens_per_s", "generated tokens/s", True, "transformers generate"),
    "grpo_step": ("s_per_step", "s/step", False, "TRL GRPOTrainer"),
}
SIZES = ("tiny", "small")
# The peers: the side name a record carries ("peer" is the transformers side, as kept records spell it) -> the
# workloads it measures. Tunix is measured on decode only (the JAX peer's Sampler).
PEERS = {"transformers": ("peer", tuple(METRICS)), "tunix": ("tunix", ("decode",))}
TUNIX_NAME = "Tunix Sampler"


def tempax_command(workload: str, size: str, dtype: str = "float32") -> list[str]:
    """tempax's one-measurement entry point for a cell (each prints one JSON line)."""
    if workload in ("sft_full", "sft_lora"):
        precision = ["--precision", dtype] if dtype != "float32" else []
        return [sys.executable, os.path.join(HERE, "sft.py"), "--one", workload, size, *precision]
    return [sys.executable, os.path.join(HERE, f"{workload}.py"), "--one", size]


def peer_command(workload: str, size: str, dtype: str = "float32") -> list[str]:
    return [sys.executable, os.path.join(HERE, "peers.py"), "--one", workload, size, "--dtype", dtype]


def tunix_command(workload: str, size: str, python: str) -> list[str]:
    return [python, os.path.join(HERE, "peers_tunix.py"), "--one", workload, size]


def peer_sides(workload: str, peers: Sequence[str]) -> list[str]:
    """The record sides of the chosen `peers` that measure `workload`, in PEERS order."""
    return [PEERS[p][0] for p in PEERS if p in peers and workload in PEERS[p][1]]


def peak_rss_gib(record: dict) -> float | None:
    """Peak RSS in GiB from either spelling the benches use (peak_rss_gib, peak_rss_mb in MiB)."""
    if "peak_rss_gib" in record:
        return record["peak_rss_gib"]
    if "peak_rss_mb" in record:
        return record["peak_rss_mb"] / 1024
    return None


def first_error_line(error: str, width: int = 140) -> str:
    """The line of an error text that says what went wrong (the last non-empty one), fit for a table cell."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    text = (lines[-1] if lines else "failed").replace("|", "\\|")
    return text if len(text) <= width else text[: width - 3] + "..."


def side_summary(records: Sequence[dict], key: str) -> dict:
    """One side of one cell: its figures in run order, their median, the largest peak RSS, the errors."""
    not_run = [r["not_run"] for r in records if "not_run" in r]
    records = [r for r in records if "not_run" not in r]
    figures = [r[key] for r in records if "error" not in r and key in r]
    errors = [first_error_line(r.get("error", f"no {key!r} in the record")) for r in records
              if "error" in r or key not in r]
    rss = [peak_rss_gib(r) for r in records if peak_rss_gib(r) is not None]
    return {"figures": figures, "median": statistics.median(figures) if figures else None,
            "peak_rss_gib": max(rss) if rss else None, "errors": errors, "not_run": not_run[0] if not_run else None}


def speed_ratio(tempax: float, peer: float, higher_is_faster: bool) -> float:
    """tempax's speed relative to the peer, > 1 when tempax is faster: tempax / peer for a throughput, peer /
    tempax for a time. E.g. 120 vs 100 tokens/s -> 1.2; 5 vs 10 s/step -> 2.0."""
    return tempax / peer if higher_is_faster else peer / tempax


def _figure(x: float) -> str:
    return f"{x:.3g}" if x < 10 else f"{x:.1f}"


def _rank(names: Sequence[str], name: str) -> int:
    return names.index(name) if name in names else len(names)


def _cell(side: dict) -> tuple[str, str]:
    if side["median"] is None:
        if side.get("not_run"):
            return f"not run ({side['not_run']})", ""
        if not side["errors"]:
            return "not measured", ""
        count = f" ({len(side['errors'])} failed)" if len(side["errors"]) > 1 else ""
        return f"error{count}: " + "; ".join(dict.fromkeys(side["errors"])), ""
    repeats = ", ".join(_figure(f) for f in side["figures"])
    if side["errors"]:
        repeats += f" ({len(side['errors'])} failed: {side['errors'][0]})"
    return _figure(side["median"]), repeats


def build_table(records: Sequence[dict]) -> str:
    """The markdown ratio table of a compare run, a pure function of its records (the JSON lines kept by
    --out): each carries its side ("tempax" / "peer"), workload, size, dtype, and the driver's
    host_cpu, utc and load_average_before labels beside the bench's own fields."""
    cells: dict[tuple[str, str, str], dict[str, list[dict]]] = {}
    for r in records:
        cell = cells.setdefault((r["workload"], r["size"], r.get("dtype", "float32")), {"tempax": [], "peer": []})
        cell.setdefault(r["side"], []).append(r)
    order = {w: i for i, w in enumerate(METRICS)}
    rows = ["| workload | size | tempax | tempax repeats | peer | peer repeats | tempax vs peer (> 1: tempax faster) "
            "| peak RSS GiB tempax / peer |", "|---|---|---|---|---|---|---|---|"]
    for (workload, size, dtype) in sorted(cells, key=lambda c: (order.get(c[0], 99), _rank(SIZES, c[1]), c[2])):
        sides = cells[workload, size, dtype]
        key, unit, higher_is_faster, transformers_name = METRICS[workload]
        tempax = side_summary(sides["tempax"], key)
        tempax_figure, tempax_repeats = _cell(tempax)
        workload_label = workload + (f" {dtype}" if dtype != "float32" else "")
        for side in [s for s in sides if s != "tempax"]:
            peer = side_summary(sides[side], key)
            ratio = ("" if tempax["median"] is None or peer["median"] is None else
                     f"{speed_ratio(tempax['median'], peer['median'], higher_is_faster):.2f}x")
            rss = " / ".join("?" if s["peak_rss_gib"] is None else f"{s['peak_rss_gib']:.2f}" for s in (tempax, peer))
            peer_name = transformers_name if side == "peer" else TUNIX_NAME
            peer_label = peer_name + (" bf16 autocast" if dtype != "float32" else "")
            peer_figure, peer_repeats = _cell(peer)
            rows.append(f"| {workload_label} {unit} | {size} | {tempax_figure} | {tempax_repeats} | {peer_figure} "
                        f"({peer_label}) | {peer_repeats} | {ratio} | {rss} |")
    return "\n".join([*header_lines(records), "", *rows, "", *library_lines(records), *completion_lines(records)])


def header_lines(records: Sequence[dict]) -> list[str]:
    """CPU and load average of the run, from the records' driver labels."""
    cpus = sorted({r["host_cpu"] for r in records if "host_cpu" in r})
    loads = [r["load_average_before"][0] for r in records if "load_average_before" in r]
    lines = [f"CPU: {'; '.join(cpus) or 'unknown'}"]
    if loads:
        lines.append(f"1-min load average before each measurement: {min(loads):.2f} to {max(loads):.2f} "
                     f"(median {statistics.median(loads):.2f})")
    return lines


def library_lines(records: Sequence[dict]) -> list[str]:
    peers = sorted({r["library"] + (f" + TRL {r['trl']}" if "trl" in r else "") for r in records
                    if r.get("side") != "tempax" and "library" in r})
    jax = sorted({r["jax"] for r in records if r.get("side") == "tempax" and "jax" in r})
    flags = sorted({r["xla_flags"] for r in records if r.get("side") == "tempax" and "xla_flags" in r})
    return [f"Peers: {'; '.join(peers) or 'none measured'}. tempax on JAX {', '.join(jax) or '?'}, XLA_FLAGS "
            f"{' / '.join(repr(f) for f in flags) or '?'}."]


def completion_lines(records: Sequence[dict]) -> list[str]:
    """grpo_step's work depends on how long the completions ran (the workload allows EOS on tempax's side; the
    peer forces 64 tokens), so the table says each side's mean completion length."""
    lines = []
    for size in SIZES:
        grpo = [r for r in records if r.get("workload") == "grpo_step" and r.get("size") == size]
        means = {side: ", ".join(str(r["mean_completion_tokens"]) for r in grpo
                                 if r.get("side") == side and "mean_completion_tokens" in r) or "?"
                 for side in ("tempax", "peer")}
        if means != {"tempax": "?", "peer": "?"}:
            lines.append(f"grpo_step {size} mean completion tokens: tempax {means['tempax']}; peer {means['peer']}.")
    return lines


@contextlib.contextmanager
def held(lock_path: str | None) -> Iterator[None]:
    """Hold an exclusive flock on `lock_path` (the shared heavy-run lock), or nothing when it is None."""
    if lock_path is None:
        yield
        return
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def side_commands(workload: str, size: str, dtype: str, peers: Sequence[str]) -> list[tuple[str, list[str] | str]]:
    """(side, command) for each side of one repeat of a cell, tempax first; a peer that cannot run here (Tunix
    without its environment, or asked for a bf16 cell it does not measure) comes with the reason instead."""
    commands: list[tuple[str, list[str] | str]] = [("tempax", tempax_command(workload, size, dtype))]
    for side in peer_sides(workload, peers):
        if side == "peer":
            commands.append((side, peer_command(workload, size, dtype)))
        elif dtype != "float32":
            commands.append((side, "Tunix is measured in float32 only"))
        else:
            python = tunix_python()
            commands.append((side, tunix_command(workload, size, python) if python else
                             f"no Tunix environment: `{TUNIX_SETUP}`"))
    return commands


def measure_all(workloads: Sequence[str], sizes: Sequence[str], *, repeats: int, dtype: str = "float32",
                out: str | None = None, lock: str | None = None, timeout_s: float | None = None,
                peers: Sequence[str] = tuple(PEERS)) -> list[dict]:
    """Run every cell, tempax and its peers alternating, one process at a time; return (and keep in `out`) every
    record. The sides of one repeat run under one hold of `lock`, so they are back to back."""
    from tempax.runtime.host import cpu_line

    records: list[dict] = []
    sink = open(out, "w") if out else None
    plan = [(w, s, r) for w in workloads for s in sizes for r in range(repeats)]
    try:
        for n, (workload, size, repeat) in enumerate(plan, 1):
            with held(lock):
                for side, command in side_commands(workload, size, dtype, peers):
                    label = {"side": side, "workload": workload, "size": size, "repeat": repeat,
                             "dtype": dtype, "host_cpu": cpu_line(),
                             "utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
                             "load_average_before": [round(x, 2) for x in os.getloadavg()]}
                    if isinstance(command, str):  # the reason this side is not run
                        record = {**label, "not_run": command}
                    else:
                        record = run_measurement(command, timeout_s=timeout_s, **label,
                                                 command=" ".join(command[1:]))
                    records.append(record)
                    if sink:
                        sink.write(json.dumps(record) + "\n")
                        sink.flush()
                    key = METRICS[workload][0]
                    said = record.get(key, f"not run: {record['not_run']}" if "not_run" in record else
                                      "error: " + first_error_line(record.get("error", "")))
                    print(f"[{n}/{len(plan)}] {side} {workload} {size}: {said} ({record.get('wall_s')} s)",
                          file=sys.stderr, flush=True)
    finally:
        if sink:
            sink.close()
    return records


def imitated_class(real_class: str, xla_flags: str, aten_capability: str | None) -> str:
    """The class a run stands for: the real one, or, with `--xla_cpu_max_isa=ISA` in XLA_FLAGS (and PyTorch's
    ATEN_CPU_CAPABILITY), "ISA imitated on <real class>": the instruction set only, not that CPU's units."""
    m = re.search(r"--xla_cpu_max_isa=(\S+)", xla_flags)
    if not m:
        return real_class
    torch = f", ATEN_CPU_CAPABILITY={aten_capability}" if aten_capability else ", PyTorch not limited"
    return f"{m.group(1).upper()} imitated on {real_class} (--xla_cpu_max_isa={m.group(1)}{torch})"


def run_heading(records: Sequence[dict], cpu_class: str) -> str:
    """The page heading of one run: its CPU class and the workloads and sizes it measured."""
    workloads = [w for w in METRICS if any(r.get("workload") == w for r in records)]
    sizes = [s for s in SIZES if any(r.get("size") == s for r in records)]
    return f"### {cpu_class}: {', '.join(workloads) or 'nothing measured'} at {', '.join(sizes) or '-'}"


def repeatable_command(script: str, argv: Sequence[str],
                       local: Sequence[str] = ("--out", "--lock", "--page")) -> str:
    """The command line that repeats a run, without the options that only name this machine's files."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in local:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in local)):
            kept.append(arg)
    return " ".join(["python", script, *kept])


def append_run(page: str, table: str, heading: str, command: str) -> None:
    """Appends one run (heading, the command that repeats it, the table) to the page, creating the page with its
    introduction and its "Runs appended by the benchmarks" section when it does not exist yet."""
    new = not os.path.exists(page)
    with open(page, "a", encoding="utf-8") as f:
        if new:
            f.write("# Speed against the peers, per CPU class\n\nA ratio belongs to its CPU and its run. Figures "
                    "for AVX2 taken on an AVX-512 host with `--xla_cpu_max_isa=AVX2` and `ATEN_CPU_CAPABILITY=avx2` "
                    "imitate the instruction set only, not an AVX2 CPU's execution units; such a run says so in its "
                    "heading and its XLA_FLAGS line.\n\n## Runs appended by the benchmarks\n")
        f.write(f"\n{heading}\n\n`{command}`\n\n{table}\n")


def _names(text: str, allowed: Sequence[str], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise SystemExit(f"--{what}: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(allowed)}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default=",".join(METRICS), help="comma-separated, from " + ", ".join(METRICS))
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated, from tiny, small")
    parser.add_argument("--repeats", type=int, default=2, help="measurements per side per cell, interleaved")
    parser.add_argument("--peers", default=",".join(PEERS),
                        help="comma-separated, from " + ", ".join(PEERS) + " (Tunix: decode only)")
    parser.add_argument("--dtype", choices=("float32", "bf16"), default="float32",
                        help="bf16 (sft_full, sft_lora): tempax --precision bf16, the peer under CPU autocast")
    parser.add_argument("--out", help="write every raw JSON record here (JSON lines)")
    parser.add_argument("--lock", help="a lock file held for each tempax/peer pair (other jobs that take it wait)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds before one measurement is failed")
    parser.add_argument("--table-from", metavar="FILE.jsonl", help="print the table of kept records; measure nothing")
    parser.add_argument("--page", default=os.path.join(ROOT, "docs", "measurements", "performance-history.md"),
                        help="the docs page a measuring run appends its table to ('' = none)")
    args = parser.parse_args(argv)
    if args.table_from:
        with open(args.table_from) as f:
            records = [json.loads(line) for line in f if line.strip()]
    else:
        workloads = _names(args.workloads, tuple(METRICS), "workloads")
        if args.dtype != "float32" and not all(w.startswith("sft_") for w in workloads):
            raise SystemExit("--dtype bf16 applies to sft_full and sft_lora only: pass --workloads sft_full,sft_lora")
        if args.repeats < 1:
            raise SystemExit("--repeats must be at least 1")
        records = measure_all(workloads, _names(args.sizes, SIZES, "sizes"), repeats=args.repeats,
                              dtype=args.dtype, out=args.out, lock=args.lock, timeout_s=args.timeout,
                              peers=_names(args.peers, tuple(PEERS), "peers"))
    table = build_table(records)
    print(table, flush=True)
    if args.page and not args.table_from:
        from tempax.runtime.host import cpu_class, cpu_info

        command = repeatable_command("bench/compare.py", argv if argv is not None else sys.argv[1:])
        label = imitated_class(cpu_class(cpu_info()), os.environ.get("XLA_FLAGS", ""),
                               os.environ.get("ATEN_CPU_CAPABILITY"))
        append_run(args.page, table, run_heading(records, label), command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
