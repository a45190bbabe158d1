"""`tempax demo`: post-train SmolLM2-135M-Instruct with LoRA on a CPU in about ten minutes, and show it worked.

Three stages on generated arithmetic word problems ("Sam has 23 marbles and finds 48 more..."):

  1. the base model, evaluated greedily on held-out problems: it does not know the answer format;
  2. a short LoRA SFT warm-start on ideal completions (`<reasoning>..</reasoning><answer>..</answer>`), merged into
     the weights, then evaluated;
  3. GRPO with fresh LoRA adapters on top (the SFT model is the reference), rewarded by a strict format check
     plus answer correctness, then evaluated.

Stages 2 and 3 are `tempax.algorithms.sft.main.main` and `tempax.algorithms.grpo.main.main` on the model in
memory; `DemoConfig` embeds their two configs (`sft:`, `grpo:`), so any of their keys can be overridden
(`tempax demo grpo.guard.action=stop`), and the flags are shortcuts for the common ones.

With `--compare` (`compare=true`) the demo measures what RL adds where demonstrations are scarce: a fixed set of
N worked solutions (`demonstrations`, the ideal completions of the first N training problems) is all the SFT data
there is, and the warm-start trains on them. After it, the same compute as the GRPO stage's training in this run
goes to each of the following (`StageBudget`; `budget=wall`, the default: its wall time; `budget=cpu`: its process
CPU seconds, the fair measure on a shared machine; both are printed for every stage), every one from the same
warm-start with fresh LoRA adapters:
  (a) SFT continued on the same N (more epochs: what a user without more data would do; `scarce_sft`);
  (b) GRPO (`grpo`) on unlimited problems, with the checker (strict format + correctness rewards);
  (c) rejection-sampling fine-tuning (`rft`, `tempax.algorithms.rft`) on unlimited problems, same checker;
and, as a labelled reference row, SFT on fresh worked solutions of the next problems (`baseline`: unlimited
demonstrations, the one setting in which RL is not needed). All are evaluated on the same held-out problems, and
the table adds (b) - (a) and (c) - (a) with paired intervals.

It prints a table of format accuracy and answer accuracy per stage, each with its 95% Wilson interval
(`tempax.eval.metrics.wilson_interval`), and, with --compare, the paired differences with Newcombe's interval for
paired proportions (`paired_difference_interval`: both are scored on the same problems, whose
difficulty they share, so an interval for independent samples would be too wide). It writes, into the run dir it
names, the GRPO metrics (metrics.jsonl, TensorBoard), the reward curves (reward_curve.png), the other stages' metrics
(sft/, scarce_sft/, rft/, baseline_sft/), outcomes.jsonl (each stage's per-problem verdicts, written as soon as
the stage is evaluated) and results.json with every number and a few completions.

Why these defaults (what a CPU GRPO run of this model can learn, and the timings of these defaults:
`docs/measurements/demo-calibration.md`):
  * the format reward is strict (anchored, each tag once, in order), so copying the instructions earns little;
  * prompts are short, and the G samples of a prompt share one prefill, in sampling *and* in the training
    forward (the prompt is run once per group), since prompt tokens dominated CPU RL compute;
  * the SFT warm-start is deliberately short (6 steps of ~8 problems at LoRA lr 1e-3): it teaches most of the
    format (measured ~65% strict format, ~40% answers on held-out problems) but leaves the policy stochastic
    enough that GRPO groups disagree, so RL has signal (watch groups/zero_spread_frac and entropy). Eight steps
    give 100% format and ~47% answers, and then GRPO has little left to show in ten steps;
  * many small GRPO steps (2 prompts x 8 completions, 48 new tokens) rather than few large ones.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from tempax.algorithms.common import ModelSpec
from tempax.algorithms.grpo.config import GRPOConfig, GRPOSettings
from tempax.algorithms.rft.config import RFTConfig, RFTSettings
from tempax.algorithms.sft.main import SFTConfig
from tempax.data.sft import DataSpec
from tempax.data.tasks.arithmetic import ArithmeticConfig
from tempax.data.tasks.spec import TaskSpec, load_task
from tempax.eval.spec import EvalSpec, eval_options
from tempax.rewards.registry import RewardSpec
from tempax.configlib import describe, help_field, load_config, to_dict
from tempax.models.lora import LoraConfig, merge_lora
from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig
from tempax.train.hooks import Hook, Stop, every
from tempax.algorithms.grpo.main import main as grpo_main
from tempax.algorithms.rft.main import main as rft_main
from tempax.algorithms.sft.main import main as sft_main
from tempax.cli.plot import plot_run
from tempax.cli.train_cmds import STOPPED_EXIT_STATUS
from tempax.errors import ConfigError
from tempax.eval.evaluate import evaluate, render_rows
from tempax.eval.metrics import paired_difference_interval, wilson_interval

DEFAULT_MODEL = "smollm2-135m-instruct"

_DEMO_LORA = LoraConfig(rank=16, alpha=32.0)

# What --compare's stages get equal seconds of (`DemoConfig.budget`, `StageBudget`).
BUDGET_CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def _demo_train(**kw: Any) -> TrainConfig:
    """The loop settings both stages share: one device, no checkpoints, no memory plan (the demo is small)."""
    return TrainConfig(mesh=MeshConfig(num_devices=1), checkpoint=CheckpointConfig(save_at_end=False, resume=False),
                       check_memory=False, **kw)


def demo_sft_config() -> SFTConfig:
    """Stage 2: 6 LoRA SFT steps of 4 packed 256-token rows at lr 1e-3 (cosine, 1 warm-up step, down to 10%)."""
    return SFTConfig(
        lora=_DEMO_LORA, data=DataSpec(path="<run_dir>/sft_examples.jsonl"),
        train=_demo_train(steps=6, batch_size=4, seq_len=256, optimizer=OptimizerConfig(
            learning_rate=1e-3, warmup_steps=1, schedule="cosine", min_lr_ratio=0.1)),
    )


def demo_baseline_config() -> SFTConfig:
    """The reference row of `--compare`: SFT continued from the warm-start (fresh LoRA adapters on the merged
    warm-start model, as GRPO's) on fresh ideal completions of the problems after the N demonstrations, at a constant LoRA lr 5e-4 (the
    middle of the warm-start's cosine), 4 packed 256-token rows a step, until the GRPO stage's wall time is spent.
    `train.steps` is only an upper bound: the wall-time budget ends the run."""
    return SFTConfig(
        lora=_DEMO_LORA, data=DataSpec(path="<run_dir>/baseline_examples.jsonl"),
        train=_demo_train(steps=1000, batch_size=4, seq_len=256, optimizer=OptimizerConfig(
            learning_rate=5e-4, warmup_steps=1, schedule="constant")),
    )


def demo_scarce_sft_config() -> SFTConfig:
    """(a) of `--compare`: SFT continued from the warm-start on the same N worked solutions (epoch after epoch),
    with the baseline's settings (constant LoRA lr 5e-4, 4 packed 256-token rows a step) until the budget is
    spent; `train.steps` is only an upper bound."""
    return dataclasses.replace(demo_baseline_config(), data=DataSpec(path="<run_dir>/scarce_examples.jsonl"))


def demo_rft_config() -> RFTConfig:
    """(c) of `--compare`: rejection-sampling fine-tuning from the warm-start: rounds of 8 problems x 8 samples
    (48 new tokens, temperature 1), kept when strict format and answer are right (format + correctness >= 2),
    distinct, at most 4 per problem, fine-tuned at the baseline SFT's lr (constant 5e-4, 4 packed 256-token rows a
    step) until the budget is spent; `train.steps` is only an upper bound."""
    return RFTConfig(
        lora=_DEMO_LORA, task=TaskSpec(name="arithmetic", num_train_problems=2000),
        rewards=RewardSpec(functions=("format", "correctness")),
        rft=RFTSettings(samples_per_problem=8, problems_per_round=8, sampling_batch=8, max_new_tokens=48,
                        temperature=1.0, threshold=2.0, max_per_problem=4),
        eval=EvalSpec(num_problems=0, before=False, after=False),
        train=_demo_train(steps=1000, batch_size=4, seq_len=256, optimizer=OptimizerConfig(
            learning_rate=5e-4, warmup_steps=1, schedule="constant")),
    )


def demo_grpo_config() -> GRPOConfig:
    """Stage 3: 10 GRPO steps of 2 prompts x 8 completions (48 new tokens, temperature 1, no KL) at LoRA lr 2e-4."""
    return GRPOConfig(
        lora=_DEMO_LORA, task=TaskSpec(name="arithmetic", num_train_problems=2000),
        rewards=RewardSpec(functions=("format", "correctness")),
        grpo=GRPOSettings(group_size=8, max_new_tokens=48, temperature=1.0, beta=0.0, max_prompt_len=512),
        eval=EvalSpec(num_problems=48, max_new_tokens=48, after=True),
        train=_demo_train(steps=10, batch_size=2, optimizer=OptimizerConfig(
            learning_rate=2e-4, schedule="constant", warmup_steps=0)),
    )


@dataclass(frozen=True)
class DemoConfig:
    """The demo: the model, the held-out evaluation, and the two algorithm configs it runs (`sft.main`, then
    `grpo.main` on the SFT model). Any key is an override: `tempax demo grpo.train.optimizer.learning_rate=1e-4`."""

    model: ModelSpec = help_field("The model to post-train (both stages).",
                             default_factory=lambda: ModelSpec(source=DEFAULT_MODEL))
    sft: SFTConfig | None = help_field(
        "Stage 2, the SFT warm-start on the task's ideal completions (its data.path and run_dir are set by the "
        "demo); null skips it (as --sft-steps 0 does, and a task without SFT targets).",
        default_factory=demo_sft_config,
    )
    grpo: GRPOConfig = help_field(
        "Stage 3, GRPO (its task and eval.num_problems are the held-out problems of every stage; its run_dir is "
        "set by the demo).",
        default_factory=demo_grpo_config,
    )
    compare: bool = help_field(
        "The scarce-demonstration comparison (`--compare`, module docstring): after a warm-start on `demonstrations` "
        "worked solutions, the GRPO stage's training time in this run (`budget`: wall or process CPU seconds) goes to "
        "each of (a) SFT on the same N, (c) RFT and the reference SFT on fresh solutions; the table adds (b) - (a) and (c) - (a) "
        "with paired intervals.",
        False,
    )
    budget: str = help_field(
        "--compare: what 'the same compute' means for (a), (c) and the reference: 'wall' (each gets the wall time "
        "the GRPO stage took) or 'cpu' (each gets the GRPO stage's process CPU seconds, `time.process_time`, all "
        "threads). 'wall' is the default because on a machine running nothing else the two agree up to how well "
        "a stage fills the cores, and wall time is what a user spends; on a shared machine use 'cpu': wall time "
        "then hands more compute to whichever stage ran while the others' load was low.", "wall")
    demonstrations: int = help_field(
        "--compare: N, the worked solutions (ideal completions of the first N training problems) that are all the "
        "SFT data there is: the warm-start trains on them and (a) repeats them.", 64)
    scarce_sft: SFTConfig = help_field(
        "(a) of --compare: SFT continued on the same N worked solutions (its data.path and run_dir are set by the "
        "demo; its train.steps is an upper bound, the budget ends it).",
        default_factory=demo_scarce_sft_config,
    )
    rft: RFTConfig = help_field(
        "(c) of --compare: rejection-sampling fine-tuning with the GRPO stage's task and checker (its task, "
        "rewards, model and run_dir are set by the demo; train.steps is an upper bound, the budget ends it).",
        default_factory=demo_rft_config,
    )
    baseline: SFTConfig = help_field(
        "The reference row of --compare: SFT on fresh worked solutions of the problems after the first N "
        "(unlimited demonstrations; its data.path and run_dir are set by the demo; its train.steps is an upper "
        "bound, the budget ends it).",
        default_factory=demo_baseline_config,
    )
    grpo_difficulty: ArithmeticConfig | None = help_field(
        "The difficulty of the problems GRPO trains on (arithmetic; e.g. grpo_difficulty.max_steps=1 "
        "grpo_difficulty.max_operand=20), a curriculum lever: on problems the warm-start can solve, more of a "
        "group's samples are right and disagree, so more groups carry a learning signal. The held-out problems, "
        "the demonstrations and RFT keep the task's difficulty (`grpo.task.arithmetic`); held-out questions never "
        "enter training at any difficulty (the split is a hash of the question). null: the task's difficulty.",
        None)
    reference: bool = help_field(
        "--compare: also run the reference row (SFT on fresh worked solutions, `baseline`); false saves one "
        "budget and one evaluation.", True)
    evaluate_base: bool = help_field("Evaluate the base model first (it does not know the answer format).", True)
    seed: int = help_field("Seed of data generation, initialisation and sampling (both stages' train.seed).", 0)
    run_dir: str | None = help_field("Where everything is written; null: runs/demo-<date>-<time>.", None)
    progress_bar: bool = help_field("Show training progress bars.", True)

    @property
    def task(self) -> str:
        return self.grpo.task.name

    @property
    def eval_problems(self) -> int:
        return self.grpo.eval.num_problems

    def validate(self) -> None:
        if self.grpo.eval.num_problems < 1:
            raise ConfigError(f"--eval-problems (grpo.eval.num_problems) must be >= 1, got {self.eval_problems}")
        if self.compare and self.sft is None:
            raise ConfigError("--compare continues the SFT warm-start for GRPO's wall time; it needs the warm-start "
                              "(drop --sft-steps 0 / sft=null, or drop --compare)")
        if self.budget not in BUDGET_CLOCKS:
            raise ConfigError(f"budget must be one of {sorted(BUDGET_CLOCKS)} (what the compared stages get equal "
                              f"seconds of), got {self.budget!r}")
        if self.grpo_difficulty is not None and self.task != "arithmetic":
            raise ConfigError(f"grpo_difficulty sets generated arithmetic problems; task {self.task} has none "
                              "(drop grpo_difficulty)")
        if self.demonstrations < 1:
            raise ConfigError(f"demonstrations must be >= 1, got {self.demonstrations}")

    def stages(self, run_dir: str) -> tuple[SFTConfig | None, GRPOConfig, SFTConfig | None]:
        """The algorithm configs (warm-start SFT, GRPO, the --compare baseline SFT) with the demo's model, seed,
        run dirs and held-out evaluation filled in."""
        def train(t: TrainConfig, name: str) -> TrainConfig:
            return dataclasses.replace(t, run_dir=os.path.join(run_dir, name), seed=self.seed,
                                       progress_bar=self.progress_bar)

        g = self.grpo
        grpo = dataclasses.replace(
            g, model=self.model, train=train(g.train, "grpo"),
            task=dataclasses.replace(g.task, seed=self.seed),
            # The demo evaluates the base and the SFT model itself (in stage order); grpo.main evaluates the end.
            eval=dataclasses.replace(g.eval, batch_size=g.eval.num_problems, before=False),
        )
        sft = None
        if self.sft is not None:
            data = dataclasses.replace(self.sft.data, path=os.path.join(run_dir, "sft_examples.jsonl"))
            sft = dataclasses.replace(self.sft, model=self.model, data=data, train=train(self.sft.train, "sft"))
        baseline = None
        if self.compare:
            b = self.baseline
            data = dataclasses.replace(b.data, path=os.path.join(run_dir, "baseline_examples.jsonl"))
            baseline = dataclasses.replace(b, model=self.model, data=data, train=train(b.train, "baseline_sft"))
        return sft, grpo, baseline

    def compare_stages(self, run_dir: str) -> tuple[SFTConfig, RFTConfig]:
        """(a) and (c) of --compare, with the demo's model, seed and run dirs, and (c) with GRPO's task and checker."""
        a = self.scarce_sft
        a = dataclasses.replace(
            a, model=self.model, data=dataclasses.replace(a.data, path=os.path.join(run_dir, "scarce_examples.jsonl")),
            train=dataclasses.replace(a.train, run_dir=os.path.join(run_dir, "scarce_sft"), seed=self.seed,
                                      progress_bar=self.progress_bar))
        c = self.rft
        c = dataclasses.replace(
            c, model=self.model, task=dataclasses.replace(self.grpo.task, seed=self.seed), rewards=self.grpo.rewards,
            eval=dataclasses.replace(c.eval, num_problems=0, before=False, after=False),
            train=dataclasses.replace(c.train, run_dir=os.path.join(run_dir, "rft"), seed=self.seed,
                                      progress_bar=self.progress_bar))
        return a, c


@dataclass
class DemoResult:
    """Evaluations per stage (name -> TaskEvaluation), stage seconds, the run dir and the files written."""

    evaluations: list[tuple[str, Any]]
    seconds: dict[str, float]
    run_dir: str
    files: dict[str, str]
    table: str
    stop_reason: str | None = None
    budget: dict[str, Any] | None = None


def write_sft_examples(rows: list[dict[str, Any]], path: str, limit: int) -> int:
    """The first `limit` rows with a target as chat examples (prompt + ideal answer) in a jsonl; how many."""
    n = 0
    with open(path, "w") as f:
        for r in rows[:limit]:
            if r.get("target"):
                f.write(json.dumps({"messages": list(r["prompt_messages"]) +
                                    [{"role": "assistant", "content": r["target"]}]}) + "\n")
                n += 1
    return n


def run_sft(model: Any, tokenizer: Any, rows: list[dict[str, Any]], cfg: SFTConfig,
            say: Callable[[str], None], *, hooks: tuple = (), label: str = "SFT",
            limit: int | None = None) -> tuple[Any, int]:
    """`sft.main` on the targets of the first `limit` rows (default: what the steps can use, `sft_rows_used`) with
    the in-memory model; (the trained model, adapters merged; steps run)."""
    # Packing puts ~2 problems in a row: write only what the steps can use (with room for the packer).
    n = write_sft_examples(rows, cfg.data.path, sft_rows_used(cfg) if limit is None else limit)
    result = sft_main(cfg, hooks=hooks, log=lambda text: None, model=model, tokenizer=tokenizer)
    step, last = result.history[-1] if result.history else (0, {})
    say(f"  {label}: {n} examples, {step} steps, final loss {last.get('loss', float('nan')):.3f}"
        + (f" ({result.stop_reason})" if result.stop_reason else ""))
    trained = result.extras["model"]
    return (merge_lora(trained) if cfg.lora is not None else trained), step


def sft_rows_used(cfg: SFTConfig) -> int:
    """How many task rows `run_sft` offers the warm-start (the baseline continues on the rows after them)."""
    return cfg.train.steps * cfg.train.batch_size * 4


class StageBudget(Hook):
    """Ends a run when the seconds of `clock` it used reach `seconds`, counted from this hook's creation (so
    building the trainer and compiling count, as they do for the stage it is matched to). After each step it stops
    when finishing one more step would overshoot the budget by more than this step falls short of it, i.e. when
    used + (last step's seconds) / 2 >= seconds.

    `clock` is one of `BUDGET_CLOCKS`: "wall" (`time.perf_counter`, what a user waits) or "cpu"
    (`time.process_time`: user + system seconds of every thread of this process, i.e. the compute the stage got,
    whatever else the machine was running)."""

    def __init__(self, seconds: float, clock: str = "wall"):
        super().__init__(every=1, at_end=False)
        if clock not in BUDGET_CLOCKS:
            raise ConfigError(f"budget clock must be one of {sorted(BUDGET_CLOCKS)}, got {clock!r}")
        self.seconds, self.kind, self.clock = seconds, clock, BUDGET_CLOCKS[clock]
        self.started = self.last = self.clock()

    def __call__(self, info: Any) -> Stop | None:
        now = self.clock()
        step_s, self.last = now - self.last, now
        if now - self.started + step_s / 2 >= self.seconds:
            return Stop(f"{'wall-time' if self.kind == 'wall' else 'CPU-time'} budget of {self.seconds:.0f} s spent")
        return None


def grpo_training(cfg: GRPOConfig, difficulty: ArithmeticConfig | None) -> GRPOConfig:
    """The GRPO stage's config with its training problems at `difficulty` (None: unchanged)."""
    if difficulty is None:
        return cfg
    return dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, arithmetic=difficulty))


def plot_rewards(grpo_dir: str, out_path: str) -> str:
    """The GRPO reward curves (and zero-spread fraction, entropy, lengths) as one PNG at `out_path`."""
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
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.wall[name] = time.perf_counter() - wall
            self.cpu[name] = time.process_time() - cpu


def run_grpo(model: Any, tokenizer: Any, cfg: GRPOConfig, write: Callable[[str], None] | None = None) -> Any:
    """`grpo.main` on the in-memory model (the reference), with a progress line every ~1/6 of the steps."""
    steps = cfg.train.steps

    def report(info: Any) -> None:
        m = info.metrics()
        (write or info.trainer.progress.write)(
            f"  step {info.step:3d}/{steps}: reward {m['reward/total_mean']:.2f} (format "
            f"{m['reward/format_mean']:.2f}, correct {m['reward/correctness_mean']:.2f}), groups without "
            f"spread {m['groups/zero_spread_frac']:.0%}, entropy {m.get('entropy', float('nan')):.2f}, "
            f"{m['perf/step_s']:.0f} s/step")

    return grpo_main(cfg, hooks=(every(max(1, steps // 6), report, at_end=True),), log=lambda text: None,
                     model=model, tokenizer=tokenizer)


def run_rft(model: Any, tokenizer: Any, cfg: RFTConfig, say: Callable[[str], None], *, hooks: tuple = ()) -> tuple[Any, Any]:
    """`rft.main` on the in-memory model; (the trained model, adapters merged; its TrainResult)."""
    run = rft_main(cfg, hooks=hooks, log=lambda text: None, model=model, tokenizer=tokenizer)
    result = run.result
    steps = result.history[-1][0] if result.history else 0
    rewards = [v for _, v in result.series("reward/total_mean")]
    accept = [v for _, v in result.series("rft/accept_rate")]
    kept = sum(v for _, v in result.series("rft/kept"))
    if rewards:
        say(f"  RFT: {len(rewards)} rounds, {steps} steps, {kept:.0f} kept completions; sampled reward "
            f"{rewards[0]:.2f} -> {rewards[-1]:.2f}, accept rate {accept[0]:.0%} -> {accept[-1]:.0%} (first / last "
            "round)" + (f" ({result.stop_reason})" if result.stop_reason else ""))
    return (merge_lora(run.policy) if cfg.lora is not None else run.policy), result


def main(cfg: DemoConfig, *, say: Callable[[str], None] | None = None) -> DemoResult:
    """Runs the stages and prints the table (see the module docstring)."""
    say = say or (lambda text: print(text, flush=True))
    watch = Stopwatch()
    run_dir = cfg.run_dir or os.path.join("runs", time.strftime("demo-%Y%m%d-%H%M%S"))
    os.makedirs(run_dir, exist_ok=True)
    with watch("total"):
        evaluations, result, held, files, budget = _stages(cfg, run_dir, watch, say)
    table = _report(cfg, evaluations, result, held, files, watch, run_dir, say, budget)
    return DemoResult(evaluations=evaluations, seconds=watch.wall, run_dir=run_dir, files=files, table=table,
                      stop_reason=result.stop_reason, budget=budget)


GRPO_STAGE = "after GRPO"
# The --compare rows (scarce demonstrations): (a), (b), (c) and the reference.
SCARCE_STAGE, COMPARE_GRPO_STAGE, RFT_STAGE, REFERENCE_STAGE = (
    "(a) SFT again on the N", "(b) GRPO", "(c) RFT", "ref: SFT on fresh demos")
# Stopwatch name of each budgeted stage.
_WATCH = {SCARCE_STAGE: "scarce sft", RFT_STAGE: "rft", REFERENCE_STAGE: "baseline sft"}


def _stages(cfg: DemoConfig, run_dir: str, watch: Stopwatch, say: Callable[[str], None]):
    import numpy as np


    sft_cfg, grpo_cfg, baseline_cfg = cfg.stages(run_dir)
    # The demo evaluates every stage itself, so the GRPO stage's wall time is training alone.
    grpo_cfg = dataclasses.replace(grpo_cfg, eval=dataclasses.replace(grpo_cfg.eval, after=False))
    compare = baseline_cfg is not None
    n_stages = (6 if cfg.reference else 5) if compare else 3
    say(f"tempax demo: {cfg.model.source} on {cfg.task}; writing to {run_dir}")
    train_rows, held_rows = load_task(grpo_cfg.task, eval_problems=grpo_cfg.eval.num_problems)
    if compare and not any(r.get("target") for r in train_rows):
        raise ConfigError(f"--compare trains SFT on the task's ideal completions; task {cfg.task} has none "
                          "(use --task arithmetic, or drop --compare)")
    with watch("load"):
        model, tokenizer = cfg.model.build(seed=cfg.seed)
    say(f"  loaded the model in {watch.wall['load']:.0f} s")
    evaluations: list[tuple[str, Any]] = []
    options = eval_options(grpo_cfg.eval, grpo_cfg.grpo.max_new_tokens, seed=cfg.seed)

    def run_eval(name: str, m: Any) -> None:
        with watch(f"eval {name}"):
            r = evaluate(m, tokenizer, held_rows, options, label=f"eval {name}")
        evaluations.append((name, r))
        say(f"  {name}: format {r.format_accuracy:.1%}, answer {r.answer_accuracy:.1%} "
            f"on {len(held_rows)} held-out problems ({watch.wall[f'eval {name}']:.0f} s)")
        # Each stage's per-problem outcomes as soon as they exist: a run stopped before the end (a long --compare
        # on a busy machine) still has what the paired intervals need for the stages it finished.
        with open(os.path.join(run_dir, "outcomes.jsonl"), "a") as f:
            f.write(json.dumps({"stage": name, "format_ok": _outcomes(r, "format_ok"),
                                "correct": _outcomes(r, "correct"), "eval_seconds": watch.wall[f"eval {name}"],
                                "trained_seconds": {k: watch.wall[k] for k in ("sft", "grpo", *_WATCH.values())
                                                    if k in watch.wall},
                                "trained_cpu_seconds": {k: watch.cpu[k] for k in ("sft", "grpo", *_WATCH.values())
                                                        if k in watch.cpu}}) + "\n")

    say(f"[1/{n_stages}] base model")
    if cfg.evaluate_base:
        run_eval("base model", model)
    else:
        say("  not evaluated (evaluate_base=false)")

    n_demos = cfg.demonstrations if compare else None
    say(f"[2/{n_stages}] SFT warm-start on the answer format"
        + (f" ({n_demos} worked solutions: all the demonstrations there are)" if compare else ""))
    if sft_cfg is not None and any(r.get("target") for r in train_rows):
        with watch("sft"):
            model, _ = run_sft(model, tokenizer, train_rows, sft_cfg, say, limit=n_demos)
        say(f"  trained in {watch.wall['sft']:.0f} s")
        run_eval("after SFT", model)
    else:
        say("  skipped (" + ("sft: null / --sft-steps 0" if sft_cfg is None else
                             f"task {cfg.task} has no SFT targets") + ")")

    say(f"[3/{n_stages}] {'(b) ' if compare else ''}GRPO with strict format + correctness rewards"
        + (f" on problems of difficulty {cfg.grpo_difficulty}" if cfg.grpo_difficulty is not None else ""))
    with watch("grpo"):
        run = run_grpo(model, tokenizer, grpo_training(grpo_cfg, cfg.grpo_difficulty))
    result = run.result
    rewards = [v for _, v in result.series("reward/total_mean")]
    zero = [v for _, v in result.series("groups/zero_spread_frac")]
    split = {k: round(sum(v for _, v in result.series(f"perf/{k}_s"))) for k in ("step", "generation", "train")}
    say(f"  {len(rewards)} steps in {split['step']} s (generation {split['generation']} s, training "
        f"{split['train']} s; the stage {watch.wall['grpo']:.0f} s); reward {np.mean(rewards[:3]):.2f} -> "
        f"{np.mean(rewards[-3:]):.2f} (mean of first / last 3 steps); groups without reward spread: {np.mean(zero):.0%}")
    if result.stop_reason:
        say(f"  stopped early: {result.stop_reason}")
    run_eval(COMPARE_GRPO_STAGE if compare else GRPO_STAGE,
             merge_lora(run.policy) if grpo_cfg.lora is not None else run.policy)
    del run

    budget = None
    if compare:
        scarce_cfg, rft_cfg = cfg.compare_stages(run_dir)
        clock = cfg.budget
        budget = {"clock": clock, "seconds": watch.wall["grpo"], "grpo_cpu_seconds": watch.cpu["grpo"],
                  "grpo_steps": len(rewards), "demonstrations": n_demos, "stages": {}}
        seconds = watch.wall["grpo"] if clock == "wall" else watch.cpu["grpo"]
        budget["budget_seconds"] = seconds
        spent = "wall time" if clock == "wall" else "process CPU seconds"

        def budgeted(name: str, train: Callable[[StageBudget], tuple[Any, int]]) -> None:
            # `model` is still the warm-start: each stage trains adapters on a copy sharing its (frozen) arrays.
            with watch(_WATCH[name]):
                trained, steps = train(StageBudget(seconds, clock))
            budget["stages"][name] = {"seconds": watch.wall[_WATCH[name]], "cpu_seconds": watch.cpu[_WATCH[name]],
                                      "steps": steps}
            say(f"  trained in {watch.wall[_WATCH[name]]:.0f} s wall (GRPO {watch.wall['grpo']:.0f} s), "
                f"{watch.cpu[_WATCH[name]]:.0f} s process CPU (GRPO {watch.cpu['grpo']:.0f} s)")
            run_eval(name, trained)

        say(f"[4/{n_stages}] (a) SFT continued on the same {n_demos} worked solutions for GRPO's {seconds:.0f} s of {spent}")
        budgeted(SCARCE_STAGE, lambda hook: run_sft(model, tokenizer, train_rows, scarce_cfg, say, hooks=(hook,),
                                                    label="SFT on the same demonstrations", limit=n_demos))

        def train_rft(hook: StageBudget) -> tuple[Any, int]:
            trained, rft_result = run_rft(model, tokenizer, rft_cfg, say, hooks=(hook,))
            budget["rft"] = {k: [v for _, v in rft_result.series(k)] for k in
                             ("reward/total_mean", "rft/accept_rate", "rft/kept", "rft/round_steps")}
            return trained, (rft_result.history[-1][0] if rft_result.history else 0)

        say(f"[5/{n_stages}] (c) RFT with the same checker for GRPO's {seconds:.0f} s of {spent}")
        budgeted(RFT_STAGE, train_rft)
        if cfg.reference:
            say(f"[6/{n_stages}] reference: SFT on fresh worked solutions (unlimited demonstrations) for GRPO's "
                f"{seconds:.0f} s of {spent}")
            budgeted(REFERENCE_STAGE, lambda hook: run_sft(model, tokenizer, train_rows[n_demos:], baseline_cfg,
                                                           say, hooks=(hook,), label="SFT on fresh demonstrations"))

    files: dict[str, str] = {"metrics": os.path.join(grpo_cfg.train.run_dir, "metrics.jsonl")}
    try:
        files["reward_curve"] = plot_rewards(grpo_cfg.train.run_dir, os.path.join(run_dir, "reward_curve.png"))
    except Exception as e:  # a plotting problem must not hide the results
        say(f"  (could not draw the reward curve: {e})")
    return evaluations, result, held_rows, files, budget


def _outcomes(r: Any, which: str) -> list[bool]:
    """Per held-out problem, whether the (single, greedy) completion was in format / correct."""
    return [bool(getattr(x, which)[0]) for x in r.greedy_records]


def _percent(p: float) -> str:
    return f"{100 * p:5.1f}"


def interval_table(evaluations: list[tuple[str, Any]], seconds: dict[str, float] | None = None) -> str:
    """One line per stage: format and answer accuracy of its greedy completions, each with its 95% Wilson
    interval (`tempax.eval.metrics.wilson_interval`), and the stage's training seconds where given."""
    seconds = seconds or {}
    header = ["stage", "format % [95% CI]", "answer % [95% CI]", "problems", "training s"]
    lines = [header]
    for name, r in evaluations:
        row = [name]
        for which in ("format_ok", "correct"):
            flags = _outcomes(r, which)
            lo, hi = wilson_interval(sum(flags), len(flags))
            row.append(f"{_percent(sum(flags) / len(flags))} [{_percent(lo)}, {_percent(hi)}]")
        row += [str(len(r.greedy_records)), f"{seconds[name]:.0f}" if name in seconds else "-"]
        lines.append(row)
    return render_rows(lines)


# The paired differences --compare reports: (b) - (a), (c) - (a), and each against the reference row.
COMPARISONS = ((COMPARE_GRPO_STAGE, SCARCE_STAGE), (RFT_STAGE, SCARCE_STAGE), (COMPARE_GRPO_STAGE, REFERENCE_STAGE),
               (RFT_STAGE, REFERENCE_STAGE))


def compare_lines(evaluations: list[tuple[str, Any]],
                  pairs: tuple[tuple[str, str], ...] = COMPARISONS) -> tuple[list[str], dict[str, Any]]:
    """Each pair's difference (first minus second), answers and format: the paired difference with Newcombe's
    interval (`tempax.eval.metrics.paired_difference_interval`: both are evaluated on the same problems, so the
    pairs' agreement narrows the interval). (printable lines, the numbers by "A minus B" and answers / format)."""
    by_name = dict(evaluations)
    lines, numbers = [], {}
    for a, b in pairs:
        if a not in by_name or b not in by_name:
            continue
        key = f"{a} minus {b}"
        numbers[key] = {}
        for which, label in (("correct", "answers"), ("format_ok", "format")):
            d = paired_difference_interval(_outcomes(by_name[a], which), _outcomes(by_name[b], which))
            numbers[key][label] = dataclasses.asdict(d)
            lines.append(f"{key}, {label}: {100 * d.difference:+.1f} points, 95% CI [{100 * d.low:+.1f}, "
                         f"{100 * d.high:+.1f}] (paired, Newcombe; right in both {d.both}, first only {d.only_a}, "
                         f"second only {d.only_b}, neither {d.neither})")
    return lines, numbers


def _report(cfg: DemoConfig, evaluations: list[tuple[str, Any]], result: Any, held_rows: list[Any],
            files: dict[str, str], watch: Stopwatch, run_dir: str, say: Callable[[str], None],
            budget: dict[str, Any] | None) -> str:
    trained = {"after SFT": watch.wall.get("sft"), GRPO_STAGE: watch.wall.get("grpo"),
               COMPARE_GRPO_STAGE: watch.wall.get("grpo"), **{k: watch.wall.get(v) for k, v in _WATCH.items()}}
    table = interval_table(evaluations, {k: v for k, v in trained.items() if v is not None})
    lines, numbers = compare_lines(evaluations) if budget is not None else ([], {})
    files["results"] = os.path.join(run_dir, "results.json")
    with open(files["results"], "w") as f:
        json.dump({
            "config": to_dict(cfg),
            "stages": {name: r.to_dict() for name, r in evaluations},
            "seconds": watch.wall,
            "cpu_seconds": watch.cpu,
            "load_average": os.getloadavg(),
            "grpo_history": result.history,
            "stop_reason": result.stop_reason,
            "comparison": {"budget": budget, **numbers} if budget is not None else None,
            "examples": {name: [dataclasses.asdict(x) for x in r.greedy_records[:3]] for name, r in evaluations},
        }, f, indent=2, default=str)
    say("")
    say(f"Held-out {cfg.task} problems ({len(held_rows)}, greedy decoding; 95% Wilson intervals):")
    say(table)
    for line in lines:
        say(line)
    if budget is not None:
        say(f"Scarce demonstrations: the warm-start and (a) had {budget['demonstrations']} worked solutions; (b) "
            f"and (c) unlimited problems with the checker; the reference row unlimited worked solutions.")
        say(f"Equal {'wall time' if budget['clock'] == 'wall' else 'process CPU seconds'} (budget={budget['clock']}): "
            f"GRPO trained {budget['grpo_steps']} steps in {budget['seconds']:.0f} s wall, "
            f"{budget['grpo_cpu_seconds']:.0f} s CPU; "
            + "; ".join(f"{name} {v['steps']} steps in {v['seconds']:.0f} s wall, {v['cpu_seconds']:.0f} s CPU"
                        for name, v in budget["stages"].items()) + ", all from the same warm-start, in this run.")
    say("")
    say(f"total {watch.wall['total']:.0f} s (process CPU time {watch.cpu['total']:.0f} s). Files: "
        + ", ".join(f"{k} {v}" for k, v in files.items()))
    return "\n".join([table, *lines])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = DemoConfig()
    assert d.sft is not None
    parser.add_argument("--model", default=None, help=f"model source (default {DEFAULT_MODEL}; = model.source)")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"GRPO steps (default {d.grpo.train.steps}; = grpo.train.steps)")
    parser.add_argument("--sft-steps", type=int, default=None,
                        help=f"SFT warm-start steps, 0 to skip (default {d.sft.train.steps}; = sft.train.steps)")
    parser.add_argument("--task", choices=("arithmetic", "gsm8k", "arithmetic-tools"), default=None,
                        help="the task (default arithmetic; = grpo.task.name); arithmetic-tools runs the tool demo "
                             "(tempax/cli/demo_tools.py: base, warm-starts and RL with and without a calculator)")
    parser.add_argument("--eval-problems", type=int, default=None,
                        help=f"held-out problems per evaluation (default {d.eval_problems}; = grpo.eval.num_problems)")
    parser.add_argument("--run-dir", default=None, help="output folder (default runs/demo-<date>-<time>)")
    parser.add_argument("--seed", type=int, default=None, help="seed (default 0)")
    parser.add_argument("--compare", action="store_true", default=None,
                        help="the scarce-demonstration comparison: after a warm-start on N worked solutions, GRPO's "
                             "wall time each for (a) SFT on the same N, (b) GRPO, (c) RFT and SFT on fresh "
                             "solutions (reference), on the same held-out problems (= compare=true)")
    parser.add_argument("--budget", choices=tuple(BUDGET_CLOCKS), default=None,
                        help="--compare: equal 'wall' time (default) or equal process 'cpu' seconds per stage; use "
                             "cpu on a shared machine (= budget)")
    parser.add_argument("--demonstrations", type=int, default=None,
                        help=f"--compare: the N worked solutions (default {d.demonstrations}; = demonstrations)")
    parser.add_argument("--advantage", choices=("grpo", "dr_grpo", "rloo", "reinforce_pp"), default=None,
                        help="GRPO advantage estimator (default grpo; = grpo.grpo.advantage)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="any DemoConfig key, e.g. grpo.guard.action=stop grpo.grpo.temperature=0.7 "
                             "sft.train.optimizer.learning_rate=5e-4 (see --describe)")
    parser.add_argument("--describe", action="store_true", help="list every config key with its type and help")


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    """The flags are shortcuts for keys of the typed config; KEY=VALUE overrides come after them."""
    shortcuts: list[str] = []
    for flag, key in (("model", "model.source"), ("steps", "grpo.train.steps"), ("task", "grpo.task.name"),
                      ("eval_problems", "grpo.eval.num_problems"), ("run_dir", "run_dir"), ("seed", "seed"),
                      ("advantage", "grpo.grpo.advantage"), ("compare", "compare"), ("budget", "budget"),
                      ("demonstrations", "demonstrations")):
        value = getattr(args, flag, None)
        if value is not None:
            shortcuts.append(f"{key}={value}")
    if args.sft_steps is not None:
        shortcuts.append("sft=null" if args.sft_steps == 0 else f"sft.train.steps={args.sft_steps}")
    if args.task == "gsm8k":
        # GSM8K answers need room: longer generations for training and evaluation; it has no SFT targets.
        shortcuts += ["grpo.grpo.max_new_tokens=256", "grpo.eval.max_new_tokens=256", "grpo.task.max_train_rows=2000"]
    return load_config(DemoConfig, None, shortcuts + list(getattr(args, "overrides", []) or []))


def run(args: argparse.Namespace) -> int:
    if getattr(args, "describe", False):
        print(describe(DemoConfig))
        return 0
    if getattr(args, "task", None) == "arithmetic-tools":
        from tempax.cli import demo_tools  # its own stages and config (ToolDemoConfig)

        return demo_tools.run(args)
    result = main(config_from_args(args))
    if result.stop_reason:
        return STOPPED_EXIT_STATUS
    return 0
