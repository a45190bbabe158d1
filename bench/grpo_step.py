"""GRPO step benchmark: the `grpo_step` workload of ../shared/bench/workloads.json.

    python bench/grpo_step.py                     # both sizes, each in its own process, twice
    python bench/grpo_step.py --size small --repeats 1
    python bench/grpo_step.py --one tiny          # one measurement in this process (what the driver spawns)

Exactly the shared work: bench-tiny / bench-small shapes (random init, seed 0, float32 weights, activations and
KV cache), LoRA rank 16 / alpha 32 on q,k,v,o,gate,up,down (base frozen). Per step: 2 prompts of exactly 64
tokens (BOS + 63 ids from numpy default_rng(1234 + 2) in [4, vocab), fresh prompts every step), 4 completions
each sampled by the LoRA policy at temperature 1.0 (no top-k/top-p, up to 64 new tokens; EOS may end one),
scored by len(completion text) / 100, group advantages, reference log-probs from the frozen base (the same
weights with the adapters off; beta = 0.04), the GRPO loss (epsilon 0.2, one pass) and one AdamW update (lr 1e-5,
constant, no clipping) of the adapters. That is `Trainer.fit` over `tempax.algorithms.grpo.GRPOSource`, unchanged.

Memory settings, printed in the JSON ("remat", "micro_batch_size"): tempax runs as recipes/grpo_gsm8k_smollm2.yaml
does, train.remat=full (GRPO's default: each layer recomputed in the backward) and train.micro_batch_size=1 (one
prompt group of 4 completions per forward/backward pass, gradients accumulated: the same update,
tests/algorithms/grpo/test_objective.py). TRL's GRPOTrainer runs with its default gradient_checkpointing=True and
the whole batch in one pass. Both are memory/compute trades of the same update; `--remat none
--micro-batch-size 0` measures tempax without them.

Reported: median wall time of a whole step over the measured steps (warm-up steps, with compilation, excluded),
and its split into generation, reward, reference forward, and training (forward + backward + update), each a
median over the same steps. Also peak RSS and the 1-minute load average before and after (a load above the
core count means the figure is pessimistic). Prints one JSON object per measurement.

The peer is TRL's GRPOTrainer on the same workload, run by `bench/peers.py --workload grpo_step` (and beside
this bench, interleaved, by `bench/compare.py`); a ratio holds only for the CPU both ran on (the JSON's "cpu").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The shared benchmark folder (workloads.json, tokenizers/); TEMPAX_BENCH_SHARED points elsewhere (a copy).
SHARED = os.environ.get("TEMPAX_BENCH_SHARED") or os.path.join(ROOT, "..", "shared", "bench")


def load_spec() -> dict:
    with open(os.path.join(SHARED, "workloads.json")) as f:
        return json.load(f)


def length_reward(prompts, completions, **columns):
    """The workload's trivial reward: character length / 100."""
    return [len(c) / 100.0 for c in completions]


def build(size: str, remat: str = "full", micro_batch_size: int | None = 1, *, steps: dict | None = None,
          settings_changes: dict | None = None, ray: object = None) -> tuple:
    """The workload's trainer and rollout source: (trainer, source, settings, steps). `steps` overrides the
    workload's warm-up / measured counts, `settings_changes` the GRPO settings (bench/async_rl.py: rollout workers),
    `ray` is the source's `RayConfig`."""
    sys.path.insert(0, ROOT)
    from flax import nnx

    from tempax.algorithms.grpo.config import GRPOKnobsConfig
    from tempax.rl.rollout import Prompt, PromptSampler
    from tempax.algorithms.grpo.plan import GRPOPlan
    from tempax.algorithms.grpo.source import GRPOSource, make_grpo_trainer
    from tempax.models.decoder import Decoder
    from tempax.models.lora import LoraConfig, apply_lora, lora_filter
    from tempax.models.presets import PRESETS
    from tempax.models.tokenizer import load_tokenizer
    from tempax.rewards import combine_rewards
    from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig

    import numpy as np

    spec = load_spec()
    w = spec["workloads"]["grpo_step"]
    steps = steps or w["steps"][size]
    cfg = PRESETS[f"bench-{size}"]
    assert cfg.num_params() == spec["models"][size]["expected_num_params"], "preset does not match workloads.json"
    assert cfg.param_dtype == cfg.dtype == "float32"
    total = steps["warmup"] + steps["measured"]
    num_prompts, group, prompt_len, new = w["num_prompts"], w["group_size"], w["prompt_len"], w["max_new_tokens"]

    rng = np.random.default_rng(spec["data"]["seed"] + 2)
    ids = rng.integers(4, cfg.vocab_size, (total * num_prompts, prompt_len - 1))
    prompts = [Prompt(ids=(1, *row.tolist()), text="", columns={}) for row in ids]
    tokenizer = load_tokenizer(os.path.join(SHARED, "tokenizers", f"wordlevel_{cfg.vocab_size}"))
    lc = spec["lora"]
    model = apply_lora(
        Decoder(cfg, rngs=nnx.Rngs(spec["init"]["seed"])),
        LoraConfig(rank=lc["rank"], alpha=lc["alpha"], dropout=lc["dropout"], target_modules=tuple(lc["targets"])),
        rngs=nnx.Rngs(1),
    )
    opt = spec["optimizer"]
    settings = GRPOKnobsConfig(
        group_size=group, num_iterations=w["num_iterations"], max_new_tokens=new, max_prompt_len=prompt_len,
        temperature=w["temperature"], beta=w["beta"], epsilon=w["epsilon"], log_entropy=False,
        **(settings_changes or {}),
    )
    train = TrainConfig(
        steps=total, batch_size=num_prompts, mesh=MeshConfig(num_devices=1),
        optimizer=OptimizerConfig(name="adamw", learning_rate=opt["learning_rate"], b1=opt["b1"], b2=opt["b2"],
                                  eps=opt["eps"], weight_decay=opt["weight_decay"], schedule="constant",
                                  decay_all=True, grad_clip_norm=opt["grad_clip"]),
        checkpoint=CheckpointConfig(save_at_end=False, resume=False), run_dir=tempfile.mkdtemp(prefix="tempax-grpo-"),
        tensorboard=False, progress_bar=False, check_memory=False, remat=remat, micro_batch_size=micro_batch_size,
    )
    source = GRPOSource(tokenizer, PromptSampler(prompts, shuffle=False), combine_rewards({"length": length_reward}),
                        GRPOPlan.build(settings), prompt_len=prompt_len, ray=ray)
    trainer = make_grpo_trainer(model, settings, source.plan, train, prompt_len=prompt_len, trainable=lora_filter,
                                log=lambda text: None)
    return trainer, source, settings, steps


def measure(size: str, remat: str = "full", micro_batch_size: int | None = 1) -> dict:
    sys.path.insert(0, ROOT)
    import jax

    from tempax.runtime.process import settings_in_effect
    from tempax.algorithms.grpo.source import grpo_hooks
    from tempax.train.guards import CollapseGuardConfig

    load_before = os.getloadavg()[0]
    trainer, source, settings, steps = build(size, remat, micro_batch_size)
    result = trainer.fit(source, hooks=grpo_hooks(source, CollapseGuardConfig(enabled=False)))
    trainer.close()
    measured = [m for _, m in result.history[steps["warmup"]:]]
    med = lambda key: statistics.median(m[key] for m in measured)  # noqa: E731
    return {
        "library": "tempax",
        "workload": "grpo_step",
        "size": size,
        "remat": remat,
        "micro_batch_size": micro_batch_size,
        "memory_trade": "train.remat and train.micro_batch_size trade compute for memory in the same update, as TRL's "
                        "gradient_checkpointing=True does",
        "s_per_step": round(med("perf/step_s"), 4),
        "step_s": [round(m["perf/step_s"], 4) for m in measured],
        "median_generation_s": round(med("perf/generation_s"), 4),
        "median_reward_s": round(med("perf/reward_s"), 4),
        "median_reference_s": round(med("perf/reference_s"), 4),
        "median_train_s": round(med("perf/train_s"), 4),
        "warmup_step_s": [round(m["perf/step_s"], 2) for _, m in result.history[: steps["warmup"]]],
        "mean_completion_tokens": round(statistics.mean(m["completion/length_mean"] for m in measured), 1),
        "kl_last": round(measured[-1].get("kl", float("nan")), 6),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "load_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "jax": jax.__version__,
        **settings_in_effect(),
        "device": str(jax.devices()[0]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("tiny", "small", "all"), default="all")
    parser.add_argument("--repeats", type=int, default=2, help="separate processes per size")
    parser.add_argument("--one", metavar="SIZE", help="measure SIZE in this process and print one JSON line")
    parser.add_argument("--remat", choices=("none", "dots", "full"), default="full",
                        help="train.remat: per-layer recomputation in the training pass")
    parser.add_argument("--micro-batch-size", type=int, default=1,
                        help="train.micro_batch_size: prompt groups per forward/backward pass (0: all at once)")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, remat=args.remat, micro_batch_size=args.micro_batch_size or None)), flush=True)
        return 0
    sizes = ("tiny", "small") if args.size == "all" else (args.size,)
    for size in sizes:
        for _ in range(args.repeats):
            # One process per measurement, one at a time (workloads.json: "measurement").
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", size, "--remat", args.remat,
                                  "--micro-batch-size", str(args.micro_batch_size)], capture_output=True, text=True,
                                 cwd=ROOT)
            lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
            if out.returncode or not lines:
                print(json.dumps({"workload": "grpo_step", "size": size, "error": out.stderr[-2000:]}), flush=True)
            else:
                print(lines[-1], flush=True)
    return 0


if __name__ == "__main__":
    from tempax.runtime.process import setup_process

    setup_process()  # as the `tempax` command does; TEMPAX_REEXEC=0 measures without
    sys.exit(main())
