"""The TPU goals, measured as a user meets them: each case is a whole command in its own process, timed from outside.

    bash scripts/tpu/run.sh python bench/tpu_check.py --cases first_step --out OUT --record OUT/tpu.jsonl
    python bench/tpu_check.py --tiny --cases first_step,full_ft      # the same cases on tiny shapes (CPU smoke run)

Cases (`--cases`, comma-separated; groups expand to their cases):

* `sft_lora_cold`, `sft_lora_cached` (group `first_step`): `tempax sft --config
  recipes/sft_shape_llama3.2-1b_lora.yaml` at 8 x 1024 tokens, `train.remat` from `--remat`, first with an empty
  `TEMPAX_CACHE` (a cold compile), then again with the cache the first run filled. Reported: the seconds from the
  process's start to its "train step 1/" line (`first_step_s`: start-up, loading, the memory plan, compilation and
  the first step), the seconds from the memory plan's line to the same line (`compile_and_step_s`), and from the
  run's metrics the median tokens/s of the steps after the second, with MFU = 4N x tokens/s over the chip's peak.
* `sft_full` (group `full_ft`): the same recipe with `lora=null` (every weight trained, float32 master weights,
  AdamW) and `train.memory=auto`: the memory setting it chose, whether it ran, its first step, tokens/s and MFU
  (6N a token).
* `generate_cold`: `tempax generate` of the LoRA run's directory (the 1B shape), one new token, bfloat16, with an
  empty cache: the wall time of the whole command bounds the time to the first token from above.
* `grpo_step_small`: `bench/grpo_step.py --one small`, the shared GRPO workload (first step and steady seconds).

Each case writes its whole output to OUT/<case>.log and one JSON line to stdout; `--record FILE` appends a figure
record (topic "tpu", bench/results.py) for each case that finished. A case that fails or runs past `--timeout`
reports that, and the next case still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RECIPE = "recipes/sft_shape_llama3.2-1b_lora.yaml"
PEAK_TFLOPS = 197.0  # TPU v5e, dense bf16, the data sheet
GROUPS = {"first_step": ("sft_lora_cold", "sft_lora_cached"), "full_ft": ("sft_full",)}
ORDER = ("sft_lora_cold", "sft_lora_cached", "sft_full", "generate_cold", "grpo_step_small")
TINY = ("model.overrides={param_dtype: bfloat16, num_layers: 2, hidden_size: 128, intermediate_size: 256, "
        "num_heads: 4, num_kv_heads: 2, head_dim: 32}")


def timed_run(cmd: list[str], log_path: str, env: dict, timeout: float, marks: dict[str, str]) -> dict:
    """Runs cmd, writing its output to log_path; returns the exit status, the wall time and, for each mark, the
    seconds from the start to the first output line containing that text."""
    seen: dict[str, float] = {}
    start = time.perf_counter()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
                                bufsize=1)
        watchdog = threading.Timer(timeout, proc.kill)  # a silent, stuck process is ended too
        watchdog.start()
        for line in proc.stdout:
            now = time.perf_counter() - start
            log.write(f"[{now:7.1f}] {line}")
            log.flush()
            for name, text in marks.items():
                if name not in seen and text in line:
                    seen[name] = now
        status = proc.wait()
        watchdog.cancel()
    wall = time.perf_counter() - start
    return {"status": status if wall <= timeout else "timed out", "wall_s": round(wall, 1),
            **{f"{k}_at_s": round(v, 1) for k, v in seen.items()}}


def steady_tokens_per_s(run_dir: str) -> float | None:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    rates = []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if row.get("step", 0) >= 3 and "tokens_per_s" in row:
                rates.append(row["tokens_per_s"])
    return statistics.median(rates) if rates else None


def sft_case(name: str, args: argparse.Namespace, env: dict, cache: str, extra: list[str]) -> dict:
    run_dir = os.path.join(args.work, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    batch, seq = (2, 64) if args.tiny else (8, 1024)
    cmd = [sys.executable, "-m", "tempax.cli.main", "sft", "--config", RECIPE, f"data.path={args.data}",
           f"model.tokenizer={args.tokenizer}", f"train.batch_size={batch}", f"train.seq_len={seq}",
           f"train.steps={args.steps}", f"train.run_dir={run_dir}", f"train.remat={args.remat}",
           *([TINY] if args.tiny else []), *extra, *args.set]
    out = timed_run(cmd, os.path.join(args.out, f"{name}.log"), {**env, "TEMPAX_CACHE": cache}, args.timeout,
                    {"plan": "memory plan per device", "chose": "train.memory=auto chose", "step1": "train step 1/"})
    if "step1_at_s" in out:
        out["first_step_s"] = out["step1_at_s"]
        if "plan_at_s" in out:
            out["compile_and_step_s"] = round(out["step1_at_s"] - out["plan_at_s"], 1)
    rate = steady_tokens_per_s(run_dir)
    if rate is not None:
        from tempax.models.presets import get_preset

        params = get_preset("llama3.2-1b").num_params()
        flops_per_token = (6 if "lora=null" in extra else 4) * params
        out.update(tokens_per_s=round(rate, 1), mfu=round(flops_per_token * rate / (PEAK_TFLOPS * 1e12), 4))
    with open(os.path.join(args.out, f"{name}.log")) as f:
        chose = [line.split("] ", 1)[1].strip() for line in f if "train.memory=auto chose" in line]
    if chose:
        out["memory"] = chose[0]
    return out


def case(name: str, args: argparse.Namespace, env: dict) -> dict:
    cold = os.path.join(args.work, "cache-cold")
    if name == "sft_lora_cold":
        shutil.rmtree(cold, ignore_errors=True)
        return sft_case(name, args, env, cold, ["train.checkpoint.save_at_end=true"])
    if name == "sft_lora_cached":
        return sft_case(name, args, env, cold, [])
    if name == "sft_full":
        return sft_case(name, args, env, os.path.join(args.work, "cache-full"), ["lora=null", "train.memory=auto"])
    if name == "generate_cold":
        cache = os.path.join(args.work, "cache-generate")
        shutil.rmtree(cache, ignore_errors=True)
        cmd = [sys.executable, "-m", "tempax.cli.main", "generate", os.path.join(args.work, "sft_lora_cold"),
               "--prompt", "What is 12 * 7?", "--max-new-tokens", "1", "--dtype", "bfloat16"]
        out = timed_run(cmd, os.path.join(args.out, f"{name}.log"), {**env, "TEMPAX_CACHE": cache}, args.timeout,
                        {"done": " tokens in "})
        with open(os.path.join(args.out, f"{name}.log")) as f:
            done = [line.split("] ", 1)[1].strip() for line in f if " tokens in " in line]
        if done:  # "1 tokens in 2.93 s (prefill 2.93 s, ...)": the prefill gives the first token
            out["prefill_s"] = float(done[0].split("(prefill ", 1)[1].split(" s", 1)[0])
        return out
    if name == "grpo_step_small":
        size = "tiny" if args.tiny else "small"
        cmd = [sys.executable, os.path.join(HERE, "grpo_step.py"), "--one", size]
        out = timed_run(cmd, os.path.join(args.out, f"{name}.log"), env, args.timeout, {})
        with open(os.path.join(args.out, f"{name}.log")) as f:
            lines = [line.split("] ", 1)[1] for line in f if "] {" in line]
        if lines:
            measured = json.loads(lines[-1])
            out.update({k: measured.get(k) for k in ("s_per_step", "warmup_step_s", "median_generation_s",
                                                      "median_train_s", "median_reference_s", "peak_rss_mb")})
        return out
    raise SystemExit(f"tpu_check: unknown case {name!r}; cases: {', '.join(ORDER)}; groups: {', '.join(GROUPS)}")


def summary(name: str, out: dict) -> str | None:
    """The figure a record quotes, or None when the case did not finish."""
    if out.get("status") != 0:
        return None
    if name.startswith("sft_"):
        if "first_step_s" not in out:
            return None
        text = f"first step {out['first_step_s']} s from the process's start"
        if "compile_and_step_s" in out:
            text += f" ({out['compile_and_step_s']} s after the memory plan)"
        if "tokens_per_s" in out:
            text += f"; then {out['tokens_per_s']:,.0f} tok/s, {100 * out['mfu']:.1f}% MFU"
        if "memory" in out:
            text += f"; {out['memory'].split(':')[0]}"
        return text
    if name == "generate_cold":
        return (f"{out.get('done_at_s', out['wall_s'])} s from the command's start to its first token, of which "
                f"{out.get('prefill_s')} s compiling and running the prefill (empty cache)")
    if name == "grpo_step_small" and out.get("s_per_step") is not None:
        return (f"first step {out['warmup_step_s'][0]} s, then {out['s_per_step']} s a step (generation "
                f"{out['median_generation_s']} s, train {out['median_train_s']} s)")
    return None


WHAT = {
    "sft_lora_cold": "LoRA SFT, Llama-3.2-1B shape, 8 x 1024, remat {remat}: first step, cold compilation cache",
    "sft_lora_cached": "the same, second run from the compilation cache",
    "sft_full": "full fine-tuning, Llama-3.2-1B shape, 8 x 1024, remat {remat}, float32 master weights, "
                "train.memory=auto",
    "generate_cold": "tempax generate of the 1B shape, empty cache: time to the first token (whole command)",
    "grpo_step_small": "bench/grpo_step.py small (the shared GRPO workload)",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(ORDER), help=f"comma-separated cases or groups ({', '.join(GROUPS)})")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "tpu_check"), help="logs go here")
    ap.add_argument("--work", default=None, help="run dirs and caches (default: a folder under the system's temp)")
    ap.add_argument("--data", default=".tpu/data/hh-rlhf-sft/train.jsonl", help="chat rows for the SFT cases")
    ap.add_argument("--tokenizer", default=".tpu/data/tokenizer", help="a tokenizer folder for the preset shape")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--remat", default="full", help="train.remat of the SFT cases")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for the SFT cases, repeatable (e.g. --set loss.fused=false)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds each case may take")
    ap.add_argument("--tiny", action="store_true", help="2-layer, 128-wide copies (a CPU smoke run)")
    ap.add_argument("--record", metavar="FILE", help="append a figure record (topic tpu) per finished case")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    args.work = args.work or tempfile.mkdtemp(prefix="tempax-tpu-check-")
    names = [n for item in args.cases.split(",") if item.strip() for n in GROUPS.get(item.strip(), (item.strip(),))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    # Asked in a child process: a process that holds the TPU keeps every other process off it.
    probe = subprocess.run([sys.executable, "-c", "import jax; d = jax.devices()[0]; "
                            "print(getattr(d, 'device_kind', str(d))); print(jax.__version__)"],
                           capture_output=True, text=True, env=env)
    device, jax_version = (probe.stdout.split("\n") + ["?", "?"])[:2] if probe.returncode == 0 else ("?", "?")
    for name in names:
        out = {"case": name, **case(name, args, env), "device": device, "jax": jax_version}
        print(json.dumps(out), flush=True)
        figure = summary(name, out)
        if args.record and figure is not None and not args.tiny:
            remat = f" --remat {args.remat}" if name.startswith("sft_") and args.remat != "full" else ""
            remat += "".join(f" --set {kv}" for kv in args.set) if name.startswith("sft_") else ""
            what = WHAT[name].format(remat=args.remat)
            what += "".join(f", {kv}" for kv in args.set) if name.startswith("sft_") else ""
            record = {"kind": "figure", "topic": "tpu", "what": what,
                      "figure": figure, "cpu": device,
                      "command": f"bash scripts/tpu/run.sh python bench/tpu_check.py --cases {name}{remat}"}
            with open(args.record, "a") as f:
                f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
