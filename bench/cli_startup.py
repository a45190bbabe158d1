"""What a user waits for: first and second runs of `tempax` commands, with the persistent compilation cache.

    python bench/cli_startup.py                               # generate, chat, sft (2 steps); cache off / cold / warm
    python bench/cli_startup.py --commands generate --page ''   # print only, write no docs page
    python bench/cli_startup.py --commands generate --modes cold,warm   # skip the run without the cache
    python bench/cli_startup.py --commands demo                # the main job, three times (about 12 minutes)

Each command runs as its own `tempax` process three times against one fresh `TEMPAX_CACHE` (the tokenizer is
built into it first): with `TEMPAX_COMPILE_CACHE=0 TEMPAX_WEIGHT_CACHE=0` (no compiled programs, no dequantised
weights kept), then twice with both caches on, the first of which fills them ("cold") and the second reads them
("warm"). Per run it records
the wall time, the CPU time of the process (user + system; on a shared machine the wall time mostly measures
the neighbours) and the peak RSS, and for `generate` and `chat` the time to the first generated token:
both stream their reply, so that is when its first character reaches stdout.

Commands (the model is the real SmolLM2-135M-Instruct GGUF):
  generate  tempax generate smollm2-135m-instruct --prompt "What is 12 * 7?"
  chat      tempax chat smollm2-135m-instruct, one scripted turn ("What is 12 * 7?") on stdin
  sft       tempax sft --config recipes/sft_lora_smollm2.yaml, 2 steps of 2 x 256 tokens, no evaluation
  demo      tempax demo, as `bash scripts/demo.sh` runs it (SFT warm-start, GRPO, three evaluations); not in
            the default set, each run takes minutes; its before/after table is checked equal across the modes
A measuring run appends its table to `docs/measurements/performance-history.md` (`--page`), headed by the CPU class
and the commands it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PROMPT = "What is 12 * 7?"
MODES = ("off", "cold", "warm")  # TEMPAX_COMPILE_CACHE=0; cache on and empty; cache on and filled by "cold"


def command_line(name: str, run_dir: str, data: str) -> tuple[list[str], str | None]:
    """(argv, stdin text) of one measured command."""
    tempax = [sys.executable, "-m", "tempax.cli.main"]
    if name == "generate":
        return [*tempax, "generate", "smollm2-135m-instruct", "--prompt", PROMPT], None
    if name == "chat":
        return [*tempax, "chat", "smollm2-135m-instruct"], PROMPT + "\n"
    if name == "sft":
        return [*tempax, "sft", "--config", os.path.join(ROOT, "recipes", "sft_lora_smollm2.yaml"),
                "train.steps=2", "train.batch_size=2", "train.eval_at_start=false", "train.eval_every=0",
                "train.optimizer.warmup_steps=0",
                f"train.run_dir={run_dir}", f"data.path={data}"], None
    if name == "demo":
        return [*tempax, "demo", "--run-dir", run_dir], None
    raise ValueError(f"unknown command {name!r}")


def first_reply_time(stdout: bytes, arrivals: Sequence[tuple[float, int]]) -> float | None:
    """When the first character of the reply arrived: after chat's "assistant> ", or after the line that
    `generate` prints before the completion it streams ("[0] 'prompt'"). `arrivals` are (seconds since start,
    bytes of stdout received so far), in order."""
    mark = stdout.find(b"assistant> ")
    if mark >= 0:
        first = mark + len(b"assistant> ")
    elif stdout.startswith(b"[0] ") and (end := stdout.find(b"\n")) >= 0:
        first = end + 1
    else:
        return None
    for t, received in arrivals:
        if received > first:
            return t
    return None


def measure(name: str, mode: str, env: dict[str, str], data: str) -> dict:
    env = {**env, "TEMPAX_COMPILE_CACHE": "0" if mode == "off" else "1",
           "TEMPAX_WEIGHT_CACHE": "0" if mode == "off" else "1"}
    with tempfile.TemporaryDirectory(prefix="tempax-startup-run-") as run_dir:
        argv, stdin = command_line(name, run_dir, data)
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, cwd=ROOT)
        if stdin is not None:
            proc.stdin.write(stdin.encode())
        proc.stdin.close()
        out, arrivals = b"", []
        while chunk := os.read(proc.stdout.fileno(), 4096):
            out += chunk
            arrivals.append((time.perf_counter() - start, len(out)))
        err = proc.stderr.read().decode(errors="replace")
        _, wait_status, usage = os.wait4(proc.pid, 0)  # this process's own CPU time and peak RSS
        proc.returncode = status = os.waitstatus_to_exitcode(wait_status)
        wall = time.perf_counter() - start
    record = {"command": name, "cache": mode, "status": status, "wall_s": round(wall, 2),
              "cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "peak_rss_gib": round(usage.ru_maxrss / 2**20, 2),
              "load_1min_after": round(os.getloadavg()[0], 2)}
    if name in ("chat", "generate"):
        first = first_reply_time(out, arrivals)
        record["first_token_s"] = None if first is None else round(first, 2)
    if name == "demo" and status == 0:
        record["table"] = demo_table(out.decode(errors="replace"))
    if status != 0:
        record["error"] = err.strip().splitlines()[-1] if err.strip() else f"exit {status}"
    return record


def demo_table(stdout: str) -> list[str]:
    """The demo's before/after table (`tempax.experiments.tables.interval_table`: a "stage ..." header, a dashed line, one
    row per stage) without its "training s" column, spaces collapsed: what the compilation cache must leave
    unchanged."""
    lines = stdout.splitlines()
    rows: list[str] = []
    for i, line in enumerate(lines[:-1]):
        underline = lines[i + 1].strip()
        if line.startswith("stage ") and underline and set(underline) <= {"-", " "}:
            for row in lines[i + 2:]:
                if not row.strip():
                    break
                rows.append(" ".join(row.split()[:-1]))
    return rows


def build_table(records: Sequence[dict]) -> str:
    rows = ["| command | compilation cache | wall s | CPU s | first token s | peak RSS GiB | 1-min load after |",
            "|---|---|---|---|---|---|---|"]
    for r in records:
        first = r.get("first_token_s")
        rows.append(f"| {r['command']} | {r['cache']} | {r['wall_s']} | {r['cpu_s']} | "
                    f"{'' if first is None else first} | {r['peak_rss_gib']} | {r['load_1min_after']}"
                    + (f" (error: {r['error']})" if "error" in r else "") + " |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    from tempax.runtime.host import cpu_class, cpu_info, cpu_line

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commands", default="generate,chat,sft")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(ROOT), "shared", "data", "hh-rlhf-sft",
                                                    "train.jsonl"), help="the SFT recipe's data file")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, from " + ", ".join(MODES))
    ap.add_argument("--page", default=os.path.join(ROOT, "docs", "measurements", "performance-history.md"),
                    help="the docs page the run's table is appended to ('' = none)")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise SystemExit(f"--modes: choose from {', '.join(MODES)} (got {args.modes!r})")
    if "warm" in modes and "cold" not in modes:
        raise SystemExit("--modes: warm reads what cold wrote into this run's fresh cache; name cold too")
    records = []
    with tempfile.TemporaryDirectory(prefix="tempax-startup-cache-") as cache:
        env = {**os.environ, "TEMPAX_CACHE": cache, "PYTHONPATH": ROOT}
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        subprocess.run([sys.executable, "-c", "import tempax; tempax.load_tokenizer('smollm2-135m-instruct')"],
                       env=env, check=True)
        commands = [c.strip() for c in args.commands.split(",") if c.strip()]
        for name in commands:
            for mode in modes:
                records.append(measure(name, mode, env, args.data))
                print(json.dumps(records[-1]), flush=True)
    table = build_table(records)
    print(table)
    tables = {json.dumps(r["table"]) for r in records if "table" in r}
    if len(tables) > 1:
        print("note: the demo's before/after table differs between the modes:", *sorted(tables), sep="\n")
    if args.page:
        from bench.compare import append_run, repeatable_command

        command = repeatable_command("bench/cli_startup.py", argv if argv is not None else sys.argv[1:])
        append_run(args.page, f"CPU: {cpu_line()}\n\n{table}", f"### {cpu_class(cpu_info())}: start-up of tempax "
                   f"{', '.join(commands)} (bench/cli_startup.py)", command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
