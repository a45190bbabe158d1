"""Same-machine reference figures: the shared workloads run by transformers + PyTorch (+ peft, TRL) on the CPU.

    python bench/peers.py                            # every workload x size, one process each
    python bench/peers.py --workload grpo_step --size tiny
    python bench/peers.py --one sft_lora small       # one measurement in this process
    python bench/peers.py --one sft_full small --dtype bf16

Why this exists: a speed ratio belongs to its CPU (the same tempax step is 0.34x PyTorch on one Xeon and 0.70x on
one EPYC), so the fastest peer is measured here, on this machine, with exactly the workload definitions that
`bench/sft.py`, `bench/decode.py` and `bench/grpo_step.py` use: shapes from ../shared/bench/workloads.json, random
init (torch seed 0), float32, the same batch and lengths, the same data (numpy default_rng(1234 + salt)), the
same warm-up / measured counts and the median. PyTorch's own thread defaults are kept. `bench/compare.py` runs
these beside tempax's benches, interleaved, and prints the ratio table.

- decode: `model.generate`, greedy, exactly max_new_tokens new tokens per row (min_new_tokens), KV cache on, one
  timed call per run.
- sft_full: forward + causal LM loss + backward + AdamW (lr 1e-5, 0.9/0.999, eps 1e-8, weight decay 0.01) on a
  fresh random batch per step.
- sft_lora: the same with peft LoRA (rank 16, alpha 32, dropout 0, on q,k,v,o,gate,up,down; A random, B zeros),
  the base frozen and AdamW over the LoRA parameters only.
- grpo_step: TRL's `GRPOTrainer` with that LoRA policy, 2 prompts x 4 completions per optimizer step (64-token
  prompts of BOS + 63 random words of the word-level tokenizer, exactly 64 sampled tokens per completion via
  min_new_tokens, temperature 1.0, top_p 1.0, no top_k), reward len(completion text) / 100, beta 0.04 (the
  reference log-probs come from the base with the adapter disabled), epsilon 0.2, one iteration, the "grpo" loss
  (each completion weighs the same, as tempax's seq_mean_token_mean), group-std-scaled advantages, AdamW as
  above without clipping. A step is timed by a callback from on_step_begin to on_step_end, so it holds the
  generation, the reward, the reference pass, the loss, backward and the update; logging falls outside.
- `--dtype bf16` (sft_full, sft_lora): the step runs under `torch.autocast("cpu", dtype=torch.bfloat16)` with the
  parameters, gradients and AdamW state kept in float32 (master weights): what a PyTorch user training in bf16
  on a CPU does. It is the peer for tempax's `train.precision=bf16`, not part of the float32 workload.

Prints one JSON object per measurement; each names the CPU (settings_in_effect()).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The shared benchmark folder (workloads.json, tokenizers/); TEMPAX_BENCH_SHARED points elsewhere (a copy).
SHARED = os.environ.get("TEMPAX_BENCH_SHARED") or os.path.join(ROOT, "..", "shared", "bench")


def load_spec() -> dict:
    with open(os.path.join(SHARED, "workloads.json")) as f:
        return json.load(f)


def run_measurement(command: list[str], /, *, cwd: str = ROOT, timeout_s: float | None = None, **label) -> dict:
    """Run one measurement process and return its last JSON line (the measurement) with `label` added; a failure
    (non-zero exit, no JSON line, timeout) comes back as {**label, "error": the end of its stderr} instead, so
    a driver records it and carries on."""
    start = time.perf_counter()
    try:
        # This checkout's tempax first, whatever the caller's PYTHONPATH or an installed copy says.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
        out = subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return {**label, "error": f"timed out after {timeout_s} s; stderr ends: {stderr[-1500:]}",
                "wall_s": round(time.perf_counter() - start, 1)}
    wall = round(time.perf_counter() - start, 1)
    record = last_json_line(out.stdout)
    if out.returncode or record is None:
        return {**label, "error": f"exit {out.returncode}: {out.stderr[-2000:]}", "wall_s": wall}
    return {**record, **label, "wall_s": wall}


def last_json_line(text: str) -> dict | None:
    """The last line of `text` that is a JSON object (libraries print their own dict-like lines: skipped)."""
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def build_model(shape: dict):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"], num_hidden_layers=shape["num_layers"],
        num_attention_heads=shape["num_heads"], num_key_value_heads=shape["num_kv_heads"],
        head_dim=shape["head_dim"], intermediate_size=shape["intermediate_size"], rope_theta=shape["rope_theta"],
        rms_norm_eps=shape["rms_norm_eps"], tie_word_embeddings=True,
        max_position_embeddings=shape["max_position_embeddings"], attention_bias=False, mlp_bias=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    model = LlamaForCausalLM(config).float()
    n = sum(p.numel() for p in model.parameters())
    assert n == shape["expected_num_params"], f"{n} parameters, workloads.json says {shape['expected_num_params']}"
    return model


def peft_lora_config(spec: dict):
    """The workload's LoRA as a peft config: rank 16, alpha 32, dropout 0, q,k,v,o,gate,up,down, no biases."""
    from peft import LoraConfig

    lc = spec["lora"]
    return LoraConfig(r=lc["rank"], lora_alpha=lc["alpha"], lora_dropout=lc["dropout"],
                      target_modules=list(lc["targets"]), bias="none", task_type="CAUSAL_LM")


def common_fields(torch) -> dict:
    """What every peer line carries: the libraries, peak RSS of this process, threads, load, and the CPU."""
    from tempax.runtime.process import settings_in_effect

    import transformers

    return {"library": f"transformers {transformers.__version__} + torch {torch.__version__}",
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
            "threads": torch.get_num_threads(), "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            **settings_in_effect()}


def measure_decode(size: str, dtype: str = "float32") -> dict:
    import numpy as np
    import torch

    assert dtype == "float32", "decode is measured in float32 only"
    spec = load_spec()
    w = spec["workloads"]["decode"]
    runs = w["runs"][size]
    model = build_model(spec["models"][size]).eval()
    batch, prompt_len, new = w["batch_size"], w["prompt_len"], w["max_new_tokens"]
    rng = np.random.default_rng(spec["data"]["seed"] + 1)
    ids = rng.integers(4, spec["models"][size]["vocab_size"], (batch, prompt_len - 1))
    prompts = torch.tensor(np.concatenate([np.ones((batch, 1), np.int64), ids], axis=1))
    times = []
    with torch.inference_mode():
        for i in range(runs["warmup"] + runs["measured"]):
            t = time.perf_counter()
            out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                                 max_new_tokens=new, min_new_tokens=new, use_cache=True, pad_token_id=0)
            elapsed = time.perf_counter() - t
            assert out.shape == (batch, prompt_len + new)
            if i >= runs["warmup"]:
                times.append(elapsed)
    median = statistics.median(times)
    return {"workload": "decode", "size": size, "dtype": dtype,
            "generated_tokens_per_s": round(batch * new / median, 1), "call_s": [round(t, 3) for t in times],
            **common_fields(torch)}



def timed_torch_steps(model, optimizer, batches, autocast=contextlib.nullcontext) -> tuple[list[float], list[float]]:
    """(seconds, loss) of each causal-LM training step of a transformers `model` over `batches` of token ids:
    forward under `autocast`, backward, `optimizer` step, gradients cleared."""
    times, losses = [], []
    for ids in batches:
        t = time.perf_counter()
        with autocast():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
        losses.append(loss.item())
    return times, losses

def measure_sft(workload: str, size: str, dtype: str = "float32") -> dict:
    """sft_full or sft_lora; `dtype` "bf16" runs forward and loss under CPU autocast (float32 master weights)."""

    import numpy as np
    import torch

    spec = load_spec()
    w = spec["workloads"][workload]
    steps = w["steps"][size]
    shape = spec["models"][size]
    model = build_model(shape)
    if workload == "sft_lora":
        from peft import get_peft_model

        model = get_peft_model(model, peft_lora_config(spec))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = spec["optimizer"]
    optimizer = torch.optim.AdamW(trainable, lr=opt["learning_rate"], betas=(opt["b1"], opt["b2"]),
                                  eps=opt["eps"], weight_decay=opt["weight_decay"])
    batch, seq = w["batch_size"], w["seq_len"]
    total = steps["warmup"] + steps["measured"]
    rng = np.random.default_rng(spec["data"]["seed"] + 0)
    tokens = rng.integers(4, shape["vocab_size"], size=(total, batch, seq))
    tokens[:, :, 0] = 1
    batches = [torch.tensor(tokens[i]) for i in range(total)]
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if dtype == "bf16" else contextlib.nullcontext
    times, losses = timed_torch_steps(model, optimizer, batches, autocast)
    assert all(p.dtype == torch.float32 for p in model.parameters()), "master weights must stay float32"
    step = statistics.median(times[steps["warmup"]:])
    tps = batch * seq / step
    flops_per_token = (6 if workload == "sft_full" else 4) * shape["expected_num_params"]
    return {"workload": workload, "size": size, "dtype": dtype, "tokens_per_s": round(tps, 1),
            "step_time_s": round(step, 4), "step_times_s": [round(t, 4) for t in times[steps["warmup"]:]],
            "model_flops_per_s": round(flops_per_token * tps / 1e9, 2) * 1e9,
            "trainable_params": sum(p.numel() for p in trainable),
            "first_loss": round(losses[0], 4), "last_loss": round(losses[-1], 4), **common_fields(torch)}


def length_reward(completions, **columns) -> list[float]:
    """The workload's trivial reward: character length of the completion text / 100."""
    return [len(c) / 100.0 for c in completions]


def measure_grpo_step(size: str, dtype: str = "float32") -> dict:
    import numpy as np
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback

    assert dtype == "float32", "grpo_step is measured in float32 only"
    spec = load_spec()
    w = spec["workloads"]["grpo_step"]
    steps = w["steps"][size]
    shape = spec["models"][size]
    total = steps["warmup"] + steps["measured"]
    num_prompts, group, prompt_len, new = w["num_prompts"], w["group_size"], w["prompt_len"], w["max_new_tokens"]
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(SHARED, "tokenizers", f"wordlevel_{shape['vocab_size']}"))
    rng = np.random.default_rng(spec["data"]["seed"] + 2)
    ids = rng.integers(4, shape["vocab_size"], (total * num_prompts, prompt_len - 1))
    prompts = [" ".join(f"w{i}" for i in row) for row in ids]
    assert tokenizer(prompts[0])["input_ids"] == [1, *ids[0].tolist()], "prompt text does not encode to its ids"
    opt = spec["optimizer"]
    args = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="peers-grpo-"), use_cpu=True, bf16=False, fp16=False, seed=0,
        max_steps=total, per_device_train_batch_size=num_prompts * group, gradient_accumulation_steps=1,
        num_generations=group, max_completion_length=new, generation_kwargs={"min_new_tokens": new},
        temperature=w["temperature"], top_p=1.0, top_k=0, beta=w["beta"], epsilon=w["epsilon"],
        num_iterations=w["num_iterations"], loss_type="grpo", scale_rewards="group", shuffle_dataset=False,
        learning_rate=opt["learning_rate"], adam_beta1=opt["b1"], adam_beta2=opt["b2"], adam_epsilon=opt["eps"],
        weight_decay=opt["weight_decay"], lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=0.0 if opt["grad_clip"] is None else opt["grad_clip"],  # 0 = no clipping in Trainer
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
    )

    class StepTimer(TrainerCallback):
        """Wall time of each optimizer step (on_step_begin -> on_step_end) and the trainer's logged metrics."""

        def __init__(self):
            self.times: list[float] = []
            self.logs: list[dict] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self.start)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/min_length" in logs:
                self.logs.append(dict(logs))

    timer = StepTimer()
    trainer = trl.GRPOTrainer(model=build_model(shape), reward_funcs=length_reward, args=args,
                              train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tokenizer,
                              peft_config=peft_lora_config(spec), callbacks=[timer])
    trainer.train()
    assert len(timer.times) == total and len(timer.logs) == total, (len(timer.times), len(timer.logs))
    measured, logs = timer.times[steps["warmup"]:], timer.logs[steps["warmup"]:]
    assert all(log["completions/min_length"] == log["completions/max_length"] == new for log in timer.logs), \
        "a completion did not have exactly max_new_tokens tokens"
    assert all("kl" in log for log in timer.logs), "beta > 0 but no KL against the reference was computed"
    return {"workload": "grpo_step", "size": size, "dtype": dtype, "trl": trl.__version__,
            "s_per_step": round(statistics.median(measured), 4), "step_s": [round(t, 4) for t in measured],
            "warmup_step_s": [round(t, 2) for t in timer.times[: steps["warmup"]]],
            "mean_completion_tokens": round(statistics.mean(log["completions/mean_length"] for log in logs), 1),
            "kl_last": float(f"{logs[-1]['kl']:.4g}"),
            # GRPOConfig's default (activations recomputed in the backward); bench/grpo_step.py says what tempax ran.
            "gradient_checkpointing": args.gradient_checkpointing, **common_fields(torch)}


MEASURE = {"sft_full": lambda size, dtype: measure_sft("sft_full", size, dtype),
           "sft_lora": lambda size, dtype: measure_sft("sft_lora", size, dtype),
           "decode": measure_decode, "grpo_step": measure_grpo_step}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=(*MEASURE, "all"), default="all")
    parser.add_argument("--size", choices=("tiny", "small", "all"), default="all")
    parser.add_argument("--repeats", type=int, default=1, help="separate processes per (workload, size)")
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "SIZE"), help="measure once in this process")
    parser.add_argument("--dtype", choices=("float32", "bf16"), default="float32",
                        help="bf16: CPU autocast with float32 master weights (sft_full and sft_lora only)")
    args = parser.parse_args()
    if args.one:
        workload, size = args.one
        if workload not in MEASURE:
            parser.error(f"--one: unknown workload {workload!r}; choose from {', '.join(MEASURE)}")
        if args.dtype == "bf16" and not workload.startswith("sft_"):
            parser.error("--dtype bf16 applies to sft_full and sft_lora only")
        print(json.dumps(MEASURE[workload](size, args.dtype)), flush=True)
        return 0
    workloads = tuple(MEASURE) if args.workload == "all" else (args.workload,)
    sizes = ("tiny", "small") if args.size == "all" else (args.size,)
    for workload in workloads:
        for size in sizes:
            for _ in range(args.repeats):
                command = [sys.executable, os.path.abspath(__file__), "--one", workload, size, "--dtype", args.dtype]
                print(json.dumps(run_measurement(command, workload=workload, size=size)), flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)  # this checkout's tempax, not an installed one
    from tempax.runtime.process import setup_process

    # The peers run with glibc's default malloc, not tempax's training settings (the kept heap; huge pages, with
    # which PyTorch 2.13 was slower: docs/measurements/performance-history.md), so each library runs at its own
    # setting. Each line prints the GLIBC_TUNABLES it had.
    setup_process()  # as the `tempax` command does; TEMPAX_REEXEC=0 measures without
    sys.exit(main())
