"""`tempax demo`: post-train SmolLM2-135M-Instruct with LoRA on a CPU in about ten minutes, and show it worked.

Three stages on generated arithmetic word problems ("Sam has 23 marbles and finds 48 more..."):

  1. the base model, evaluated greedily on held-out problems: it does not know the answer format;
  2. a short LoRA SFT warm-start on ideal completions (`<reasoning>..</reasoning><answer>..</answer>`), merged into
     the weights, then evaluated;
  3. GRPO with fresh LoRA adapters on top (the SFT model is the reference), rewarded by a strict format check
     plus answer correctness, then evaluated.

It prints a table of format accuracy and answer accuracy for the three stages and writes, into the run dir it
names, the GRPO metrics (metrics.jsonl, TensorBoard), the reward curves (reward_curve.png), the SFT metrics
(sft/) and results.json with every number and a few completions.

Why these defaults (see ../shared/notes/grpo-demo-calibration.md for what a CPU GRPO run of this model can
learn, and the measurements below):
  * the format reward is strict (anchored, each tag once, in order), so copying the instructions earns little;
  * prompts are short, and the G samples of a prompt share one prefill, in sampling *and* in the training
    forward (the prompt is run once per group), since prompt tokens dominated CPU RL compute;
  * the SFT warm-start is deliberately short (6 steps of ~8 problems at LoRA lr 1e-3): it teaches most of the
    format (measured ~65% strict format, ~40% answers on held-out problems) but leaves the policy stochastic
    enough that GRPO groups disagree, so RL has signal (watch groups/zero_spread_frac and entropy). Eight steps
    give 100% format and ~47% answers, and then GRPO has little left to show in ten steps;
  * many small GRPO steps (2 prompts x 8 completions, 48 new tokens) rather than few large ones.
Measured on the idle 2-core CPU with these defaults (`tempax demo`, 2026-11-29): loading 12 s; a greedy
evaluation of 48 problems 49-58 s; the SFT stage 110 s (6 steps, the first ~45 s of it compiling); GRPO 280 s
for 10 steps (the first 97 s with compilation, then 18-22 s a step: generation ~12 s, training ~16 s); in all
9 min 38 s. Base 0% / 0%, after SFT 64.6% format / 33.3% answers, after GRPO 100% / 41.7% on 48 held-out
problems, training reward 0.49 -> 0.98 (mean of the first / last three steps).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from tempax.algorithms.common import ModelSpec
from tempax.configlib import help_field

DEFAULT_MODEL = "smollm2-135m-instruct"


_help = help_field  # one documented-field helper for every config (tempax.configlib)


@dataclass(frozen=True)
class DemoConfig:
    """Everything the demo does; the defaults fit about ten minutes on two CPU cores."""

    model: ModelSpec = _help("The model to post-train.", default_factory=lambda: ModelSpec(source=DEFAULT_MODEL))
    task: str = _help("arithmetic (generated problems, with SFT targets) or gsm8k (no SFT targets: SFT is skipped).",
                      "arithmetic")
    eval_problems: int = _help("Held-out problems evaluated greedily at each stage.", 48)
    eval_max_new_tokens: int = _help("Generation budget of the evaluation (answers take <= 40 tokens).", 48)
    sft_steps: int = _help("LoRA SFT warm-start steps (0: skip); few on purpose, see the module docstring.", 6)
    sft_batch_size: int = _help("SFT rows per step (each packs ~2 problems).", 4)
    sft_seq_len: int = _help("SFT packed row length in tokens.", 256)
    sft_learning_rate: float = _help("SFT peak learning rate (LoRA; high because the warm-start is short).", 1e-3)
    steps: int = _help("GRPO optimizer steps.", 10)
    prompts_per_step: int = _help("GRPO prompts per step.", 2)
    group_size: int = _help("GRPO completions per prompt.", 8)
    max_new_tokens: int = _help("GRPO completion budget in tokens.", 48)
    temperature: float = _help("GRPO sampling temperature.", 1.0)
    learning_rate: float = _help("GRPO learning rate (LoRA, constant).", 2e-4)
    beta: float = _help("GRPO KL weight to the SFT model (0 skips the reference pass).", 0.0)
    lora_rank: int = _help("LoRA rank (alpha = 2 x rank), all attention and MLP projections.", 16)
    train_problems: int = _help("Generated training problems (SFT targets and GRPO prompts).", 2000)
    seed: int = _help("Seed of data generation, initialisation and sampling.", 0)
    run_dir: str | None = _help("Where everything is written; null: runs/demo-<date>-<time>.", None)
    progress_bar: bool = _help("Show training progress bars.", True)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        from tempax.errors import ConfigError

        if self.task not in ("arithmetic", "gsm8k"):
            raise ConfigError(f"--task must be arithmetic or gsm8k, got {self.task!r}")
        for name in ("eval_problems", "steps", "prompts_per_step", "eval_max_new_tokens", "max_new_tokens",
                     "train_problems", "lora_rank", "sft_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"demo {name} must be >= 1, got {getattr(self, name)}")
        if self.sft_steps < 0:
            raise ConfigError(f"--sft-steps must be >= 0, got {self.sft_steps}")
        if self.group_size < 2:
            raise ConfigError(f"group_size must be >= 2, got {self.group_size}")


@dataclass
class DemoResult:
    """Evaluations per stage (name -> TaskEvaluation), stage seconds, the run dir and the files written."""

    evaluations: list[tuple[str, Any]]
    seconds: dict[str, float]
    run_dir: str
    files: dict[str, str]
    table: str


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def _sft_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"messages": list(r["prompt_messages"]) + [{"role": "assistant", "content": r["target"]}]}
            for r in rows if r.get("target")]


def _write_sft_examples(rows: list[dict[str, Any]], path: str) -> None:
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def run_sft(model: Any, tokenizer: Any, rows: list[dict[str, Any]], cfg: DemoConfig, run_dir: str,
            say: Callable[[str], None]) -> tuple[Any, dict[str, float]]:
    """LoRA SFT on the rows' targets; returns (the model with the adapters merged in, final metrics)."""
    from flax import nnx

    from tempax.algorithms.sft.trainer import make_sft_loss
    from tempax.data.formats import FormatOptions, tokenize_rows
    from tempax.data.loader import sft_loader
    from tempax.models.lora import LoraConfig, apply_lora, lora_filter, merge_lora
    from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig
    from tempax.train.loop import Trainer

    # Packing puts ~2 problems in a row: tokenise only what the steps can use (with room for the packer).
    sft_rows = _sft_rows(rows[: cfg.sft_steps * cfg.sft_batch_size * 4])
    examples, report = tokenize_rows(sft_rows, tokenizer, FormatOptions(max_length=cfg.sft_seq_len), name="demo SFT")
    loader = sft_loader(examples, batch_size=cfg.sft_batch_size, seq_len=cfg.sft_seq_len, pad_id=tokenizer.pad_id,
                        seed=cfg.seed)
    train = TrainConfig(
        steps=cfg.sft_steps, batch_size=cfg.sft_batch_size, seq_len=cfg.sft_seq_len,
        optimizer=OptimizerConfig(learning_rate=cfg.sft_learning_rate, warmup_steps=1 if cfg.sft_steps > 1 else 0,
                                  schedule="cosine", min_lr_ratio=0.1),
        mesh=MeshConfig(num_devices=1), checkpoint=CheckpointConfig(save_at_end=False, resume=False),
        run_dir=os.path.join(run_dir, "sft"), progress_bar=cfg.progress_bar, check_memory=False, seed=cfg.seed,
    )
    lora = LoraConfig(rank=cfg.lora_rank, alpha=2.0 * cfg.lora_rank)
    trainer = Trainer(apply_lora(model, lora, rngs=nnx.Rngs(cfg.seed + 1)), make_sft_loss("tokens"), train,
                      trainable=lora_filter, log=lambda text: None)
    try:
        result = trainer.fit(loader)
    finally:
        trainer.close()
    last = result.history[-1][1] if result.history else {}
    say(f"  SFT: {len(examples)} examples, {cfg.sft_steps} steps, final loss {last.get('loss', float('nan')):.3f}")
    return merge_lora(trainer.model), last


def plot_rewards(grpo_dir: str, out_path: str) -> str:
    """The GRPO reward curves (and zero-spread fraction, entropy, lengths) as one PNG at `out_path`."""
    from tempax.cli.plot import plot_run

    metrics = ("reward/total_mean", "reward/correctness_mean", "reward/format_mean", "groups/zero_spread_frac",
               "entropy", "completion/length_mean")
    folder = os.path.dirname(out_path)
    path = plot_run(grpo_dir, out_dir=folder, metrics=metrics)
    os.replace(path, out_path)
    return out_path


class Stopwatch:
    """Wall and process-CPU seconds per named stage (`with watch("sft"): ...`).

    On a shared machine wall time over-states what a quiet one needs; the CPU time says how much work it was.
    """

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), _cpu_seconds()
        try:
            yield
        finally:
            self.wall[name] = time.perf_counter() - wall
            self.cpu[name] = _cpu_seconds() - cpu


def load_rows(cfg: DemoConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, held-out rows) of the demo's task."""
    from tempax.data.tasks import generate_arithmetic, load_gsm8k

    if cfg.task == "arithmetic":
        return (generate_arithmetic(cfg.train_problems, split="train", seed=cfg.seed),
                generate_arithmetic(cfg.eval_problems, split="test", seed=cfg.seed))
    return list(load_gsm8k("train", limit=cfg.train_problems)), list(load_gsm8k("test", limit=cfg.eval_problems))


def run_grpo(model: Any, tokenizer: Any, rows: list[dict[str, Any]], cfg: DemoConfig, run_dir: str,
             write: Callable[[str], None] | None = None) -> tuple[Any, Any]:
    """GRPO with fresh LoRA adapters on `model` (the reference); returns (trained policy, TrainResult)."""
    from flax import nnx

    from tempax.algorithms.grpo.config import GRPOSettings, RewardSpec
    from tempax.algorithms.grpo.rollout import PromptSampler, encode_prompts, round_up
    from tempax.algorithms.grpo.source import GRPOSource, grpo_hooks, make_grpo_trainer
    from tempax.algorithms.grpo.trainer import build_rewards
    from tempax.models.lora import LoraConfig, apply_lora, lora_filter
    from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig
    from tempax.train.hooks import every

    settings = GRPOSettings(group_size=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
                            temperature=cfg.temperature, beta=cfg.beta, max_prompt_len=512)
    prompts, _ = encode_prompts(tokenizer, rows, max_prompt_len=settings.max_prompt_len)
    train = TrainConfig(
        steps=cfg.steps, batch_size=cfg.prompts_per_step,
        optimizer=OptimizerConfig(learning_rate=cfg.learning_rate, schedule="constant", warmup_steps=0),
        mesh=MeshConfig(num_devices=1), checkpoint=CheckpointConfig(save_at_end=False, resume=False),
        run_dir=os.path.join(run_dir, "grpo"), progress_bar=cfg.progress_bar, check_memory=False, seed=cfg.seed,
    )
    policy = apply_lora(model, LoraConfig(rank=cfg.lora_rank, alpha=2.0 * cfg.lora_rank), rngs=nnx.Rngs(cfg.seed + 2))
    prompt_len = round_up(max(len(p.ids) for p in prompts), 8)
    source = GRPOSource(tokenizer, PromptSampler(prompts, seed=cfg.seed),
                        build_rewards(RewardSpec(functions=("format", "correctness"))), settings, prompt_len=prompt_len)
    trainer = make_grpo_trainer(policy, settings, train, prompt_len=prompt_len, trainable=lora_filter,
                                log=lambda text: None)

    def report(info: Any) -> None:
        m = info.metrics()
        (write or info.trainer.progress.write)(
            f"  step {info.step:3d}/{cfg.steps}: reward {m['reward/total_mean']:.2f} (format "
            f"{m['reward/format_mean']:.2f}, correct {m['reward/correctness_mean']:.2f}), groups without "
            f"spread {m['groups/zero_spread_frac']:.0%}, entropy {m.get('entropy', float('nan')):.2f}, "
            f"{m['perf/step_s']:.0f} s/step")

    try:
        result = trainer.fit(source, hooks=[*grpo_hooks(source, settings),
                                            every(max(1, cfg.steps // 6), report, at_end=True)])
    finally:
        trainer.close()
    return trainer.model, result


def main(cfg: DemoConfig, *, say: Callable[[str], None] | None = None) -> DemoResult:
    """Runs the three stages and prints the table (see the module docstring)."""
    say = say or (lambda text: print(text, flush=True))
    watch = Stopwatch()
    run_dir = cfg.run_dir or os.path.join("runs", time.strftime("demo-%Y%m%d-%H%M%S"))
    os.makedirs(run_dir, exist_ok=True)
    with watch("total"):
        evaluations, result, held, files = _stages(cfg, run_dir, watch, say)
    table = _report(cfg, evaluations, result, held, files, watch, run_dir, say)
    return DemoResult(evaluations=evaluations, seconds=watch.wall, run_dir=run_dir, files=files, table=table)


def _stages(cfg: DemoConfig, run_dir: str, watch: Stopwatch, say: Callable[[str], None]):
    import numpy as np

    from tempax.eval.evaluate import EvalOptions, evaluate
    from tempax.models.lora import merge_lora

    say(f"tempax demo: {cfg.model.source} on {cfg.task}; writing to {run_dir}")
    with watch("load"):
        model, tokenizer = cfg.model.build(seed=cfg.seed)
    say(f"  loaded the model in {watch.wall['load']:.0f} s")
    train_rows, held_rows = load_rows(cfg)
    options = EvalOptions(max_new_tokens=cfg.eval_max_new_tokens, greedy=True, batch_size=cfg.eval_problems)
    evaluations: list[tuple[str, Any]] = []

    def run_eval(name: str, m: Any) -> None:
        with watch(f"eval {name}"):
            r = evaluate(m, tokenizer, held_rows, options)
        evaluations.append((name, r))
        say(f"  {name}: format {r.format_accuracy:.1%}, answer {r.answer_accuracy:.1%} "
            f"on {len(held_rows)} held-out problems ({watch.wall[f'eval {name}']:.0f} s)")

    say("[1/3] base model")
    run_eval("base model", model)

    say("[2/3] SFT warm-start on the answer format")
    if cfg.sft_steps and any(r.get("target") for r in train_rows):
        with watch("sft"):
            model, _ = run_sft(model, tokenizer, train_rows, cfg, run_dir, say)
        say(f"  trained in {watch.wall['sft']:.0f} s")
        run_eval("after SFT", model)
    else:
        say("  skipped (" + ("--sft-steps 0" if not cfg.sft_steps else f"task {cfg.task} has no SFT targets") + ")")

    say("[3/3] GRPO with strict format + correctness rewards")
    with watch("grpo"):
        policy, result = run_grpo(model, tokenizer, train_rows, cfg, run_dir)
    rewards = [v for _, v in result.series("reward/total_mean")]
    zero = [v for _, v in result.series("groups/zero_spread_frac")]
    split = {k: round(sum(v for _, v in result.series(f"perf/{k}_s"))) for k in ("generation", "train")}
    say(f"  {cfg.steps} steps in {watch.wall['grpo']:.0f} s (generation {split['generation']} s, training "
        f"{split['train']} s); reward {np.mean(rewards[:3]):.2f} -> {np.mean(rewards[-3:]):.2f} (mean of first / "
        f"last 3 steps); groups without reward spread: {np.mean(zero):.0%}")
    run_eval("after GRPO", merge_lora(policy))

    files: dict[str, str] = {"metrics": os.path.join(run_dir, "grpo", "metrics.jsonl")}
    try:
        files["reward_curve"] = plot_rewards(os.path.join(run_dir, "grpo"), os.path.join(run_dir, "reward_curve.png"))
    except Exception as e:  # a plotting problem must not hide the results
        say(f"  (could not draw the reward curve: {e})")
    return evaluations, result, held_rows, files


def _report(cfg: DemoConfig, evaluations: list[tuple[str, Any]], result: Any, held_rows: list[Any],
            files: dict[str, str], watch: Stopwatch, run_dir: str, say: Callable[[str], None]) -> str:
    from tempax.eval.evaluate import format_table

    table = format_table(evaluations)
    files["results"] = os.path.join(run_dir, "results.json")
    with open(files["results"], "w") as f:
        json.dump({
            "config": dataclasses.asdict(cfg),
            "stages": {name: r.to_dict() for name, r in evaluations},
            "seconds": watch.wall,
            "cpu_seconds": watch.cpu,
            "load_average": os.getloadavg(),
            "grpo_history": result.history,
            "examples": {name: [dataclasses.asdict(x) for x in r.greedy_records[:3]] for name, r in evaluations},
        }, f, indent=2, default=str)
    say("")
    say(f"Held-out {cfg.task} problems ({len(held_rows)}, greedy decoding):")
    say(table)
    say("")
    say(f"total {watch.wall['total']:.0f} s (process CPU time {watch.cpu['total']:.0f} s). Files: "
        + ", ".join(f"{k} {v}" for k, v in files.items()))
    return table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = DemoConfig()
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"model source (default {DEFAULT_MODEL})")
    parser.add_argument("--steps", type=int, default=d.steps, help=f"GRPO steps (default {d.steps})")
    parser.add_argument("--sft-steps", type=int, default=d.sft_steps,
                        help=f"SFT warm-start steps, 0 to skip (default {d.sft_steps})")
    parser.add_argument("--task", choices=("arithmetic", "gsm8k"), default=d.task, help="the task")
    parser.add_argument("--eval-problems", type=int, default=d.eval_problems,
                        help=f"held-out problems per evaluation (default {d.eval_problems})")
    parser.add_argument("--run-dir", default=None, help="output folder (default runs/demo-<date>-<time>)")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed (default 0)")


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    cfg = DemoConfig(
        model=ModelSpec(source=args.model), task=args.task, steps=args.steps, sft_steps=args.sft_steps,
        eval_problems=args.eval_problems, run_dir=args.run_dir, seed=args.seed,
    )
    if args.task == "gsm8k":
        # GSM8K answers need room: longer generations for training and evaluation.
        cfg = dataclasses.replace(cfg, max_new_tokens=256, eval_max_new_tokens=256)
    return cfg


def run(args: argparse.Namespace) -> int:
    main(config_from_args(args))
    return 0

