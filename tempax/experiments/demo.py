"""The demo pipeline (`tempax demo`): post-train SmolLM2-135M-Instruct with LoRA on a CPU in minutes and show it
worked. The base model, a short SFT warm-start and GRPO are evaluated on the same held-out arithmetic word problems
with 95% Wilson intervals; `--compare` gives the GRPO stage's compute to other arms (more SFT on the same scarce
demonstrations, RFT, SFT on fresh ones, GRPO after the best SFT) and adds paired differences.

The stages are the algorithms' own mains on the model in memory (`tempax.experiments.stages`), chained by a
`tempax.experiments.pipeline.Pipeline`; `DemoConfig` embeds their configs, so any of their keys is an override.
What each stage and setting does, what the run writes and why the defaults are what they are:
`docs/measurements/demo-calibration.md`.
"""


from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tempax.algorithms.common import ModelSourceConfig
from tempax.algorithms.grpo.config import GRPOConfig, GRPOKnobsConfig
from tempax.algorithms.rft.config import RFTConfig, RFTKnobsConfig
from tempax.algorithms.sft.main import SFTConfig
from tempax.configlib import help_field, to_dict, with_overrides
from tempax.data.sft import SFTDataConfig
from tempax.data.tasks.arithmetic import ArithmeticConfig
from tempax.data.tasks.spec import TaskConfig, load_task
from tempax.errors import ConfigError
from tempax.eval.evaluate import evaluate
from tempax.eval.spec import EvalConfig, eval_options
from tempax.experiments.budget import BUDGET_CLOCKS, Budget, Stopwatch
from tempax.experiments.pipeline import Pipeline
from tempax.experiments.plots import plot_rewards
from tempax.experiments.stages import in_memory_train, last_step, merged, run_grpo, run_rft, run_sft
from tempax.experiments.tables import Evaluation
from tempax.experiments.validation import BestOnValidation
from tempax.models.lora import LoraConfig
from tempax.rewards.registry import RewardsConfig
from tempax.train.config import OptimizerConfig, TrainConfig
from tempax.train.loop import TrainResult

DEFAULT_MODEL = "smollm2-135m-instruct"

_DEMO_LORA = LoraConfig(rank=16, alpha=32.0)


# The held-out problems are generated in calls of at most this many rows. One call for the CPU demo's 48 (a single
# compile); GSM8K's whole test set in one call ran a 16 GiB TPU chip out of memory (the cache and attention grow
# with the rows; docs/results.md, TPU v5e).
EVAL_BATCH_CAP = 128


def eval_batch_size(problems: int) -> int:
    """Rows per generation call when the demo scores `problems` held-out problems: all of them, up to the cap."""
    return max(1, min(problems, EVAL_BATCH_CAP))


def demo_sft_config() -> SFTConfig:
    """Stage 2: 6 LoRA SFT steps of 4 packed 256-token rows at lr 1e-3 (cosine, 1 warm-up step, down to 10%)."""
    return SFTConfig(
        lora=_DEMO_LORA, data=SFTDataConfig(path="<run_dir>/sft_examples.jsonl"),
        train=in_memory_train(steps=6, batch_size=4, seq_len=256, optimizer=OptimizerConfig(
            learning_rate=1e-3, warmup_steps=1, schedule="cosine", min_lr_ratio=0.1)),
    )


def demo_baseline_config() -> SFTConfig:
    """The reference row of `--compare`: SFT continued from the warm-start (fresh LoRA adapters on the merged
    warm-start model, as GRPO's) on fresh ideal completions of the problems after the N demonstrations, at a
    constant LoRA lr 5e-4 (the middle of the warm-start's cosine), 4 packed 256-token rows a step, until the GRPO
    stage's wall time is spent.
    `train.steps` is only an upper bound: the wall-time budget ends the run."""
    return SFTConfig(
        lora=_DEMO_LORA, data=SFTDataConfig(path="<run_dir>/baseline_examples.jsonl"),
        train=in_memory_train(steps=1000, batch_size=4, seq_len=256, optimizer=OptimizerConfig(
            learning_rate=5e-4, warmup_steps=1, schedule="constant")),
    )


def demo_scarce_sft_config() -> SFTConfig:
    """(a) of `--compare`: SFT continued from the warm-start on the same N worked solutions (epoch after epoch),
    with the baseline's settings (constant LoRA lr 5e-4, 4 packed 256-token rows a step) until the budget is
    spent; `train.steps` is only an upper bound."""
    return dataclasses.replace(demo_baseline_config(), data=SFTDataConfig(path="<run_dir>/scarce_examples.jsonl"))


def demo_rft_config() -> RFTConfig:
    """(c) of `--compare`: rejection-sampling fine-tuning from the warm-start: rounds of 8 problems x 8 samples
    (48 new tokens, temperature 1), kept when strict format and answer are right (format + correctness >= 2),
    distinct, at most 4 per problem, fine-tuned at the baseline SFT's lr (constant 5e-4, 4 packed 256-token rows a
    step) until the budget is spent; `train.steps` is only an upper bound."""
    return RFTConfig(
        lora=_DEMO_LORA, task=TaskConfig(name="arithmetic", num_train_problems=2000),
        rewards=RewardsConfig(functions=("format", "correctness")),
        rft=RFTKnobsConfig(group_size=8, problems_per_round=8, sampling_batch=8, max_new_tokens=48,
                           temperature=1.0, threshold=2.0, max_per_problem=4),
        eval=EvalConfig(num_problems=0, before=False, after=False),
        train=in_memory_train(steps=1000, batch_size=4, seq_len=256, optimizer=OptimizerConfig(
            learning_rate=5e-4, warmup_steps=1, schedule="constant")),
    )


def demo_grpo_config() -> GRPOConfig:
    """Stage 3: 10 GRPO steps of 2 prompts x 8 completions (48 new tokens, temperature 1, no KL) at LoRA lr 2e-4."""
    return GRPOConfig(
        lora=_DEMO_LORA, task=TaskConfig(name="arithmetic", num_train_problems=2000),
        rewards=RewardsConfig(functions=("format", "correctness")),
        grpo=GRPOKnobsConfig(group_size=8, max_new_tokens=48, temperature=1.0, beta=0.0, max_prompt_len=512),
        eval=EvalConfig(num_problems=48, max_new_tokens=48, after=True),
        train=in_memory_train(steps=10, batch_size=2, optimizer=OptimizerConfig(
            learning_rate=2e-4, schedule="constant", warmup_steps=0)),
    )


@dataclass(frozen=True)
class DemoConfig:
    """The demo: the model, the held-out evaluation, and the two algorithm configs it runs (`sft.main`, then
    `grpo.main` on the SFT model). Any key is an override: `tempax demo grpo.train.optimizer.learning_rate=1e-4`."""

    model: ModelSourceConfig = help_field("The model to post-train (both stages).",
                             default_factory=lambda: ModelSourceConfig(source=DEFAULT_MODEL))
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
        "The scarce-demonstration comparison (`--compare`, docs/measurements/demo-calibration.md): after a "
        "warm-start on `demonstrations` worked solutions, the GRPO stage's training time in this run (`budget`: "
        "wall or process CPU seconds) goes to each of (a) SFT on the same N, (c) RFT and the reference SFT on fresh "
        "solutions; the table adds (b) - (a) and (c) - (a) with paired intervals.",
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
    rft: RFTConfig | None = help_field(
        "(c) of --compare: rejection-sampling fine-tuning with the GRPO stage's task and checker (its task, "
        "rewards, model and run_dir are set by the demo; train.steps is an upper bound, the budget ends it); null "
        "skips (c).",
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
    validation_problems: int = help_field(
        "--compare: V validation problems (the last V training problems; never demonstrations, never test "
        "problems) on which (a) is scored every validation_every steps; (a) keeps its best-scoring weights and "
        "stops after validation_patience scores without improvement. 0: (a) trains for the whole budget and keeps "
        "its last weights.", 0)
    validation_every: int = help_field("--compare with validation_problems: (a)'s steps between scores.", 8)
    validation_patience: int = help_field(
        "--compare with validation_problems: scores in a row without improvement that end (a) (0: only the "
        "budget ends it; the best weights are still kept).", 2)
    rl_after_sft: bool = help_field(
        "--compare: add (d), GRPO started from (a)'s kept weights (fresh adapters, (a) as the reference) for (b)'s "
        "budget: does RL add to the best SFT model? The table adds (d) - (a) and (d) - (b). Pair it with "
        "validation_problems, so that (a) is the SFT a user would keep.", False)
    after_sft_overrides: tuple[str, ...] = help_field(
        "--compare with rl_after_sft: key=value overrides of the grpo settings for (d) only, to try a lever on "
        "RL after SFT without changing (b) or the budget, e.g. after_sft_overrides=[grpo.dynamic_sampling=true].",
        ())
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
        if self.validation_problems < 0 or self.validation_every < 1 or self.validation_patience < 0:
            raise ConfigError("validation_problems >= 0, validation_every >= 1 and validation_patience >= 0, got "
                              f"{self.validation_problems}, {self.validation_every}, {self.validation_patience}")
        if self.after_sft_overrides:
            with_overrides(self.grpo, self.after_sft_overrides, where="after_sft_overrides")  # a bad key fails now
        if (self.validation_problems or self.rl_after_sft) and not self.compare:
            raise ConfigError("validation_problems and rl_after_sft are settings of --compare's (a) and (d); "
                              "add --compare")

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
            eval=dataclasses.replace(g.eval, batch_size=eval_batch_size(g.eval.num_problems), before=False),
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

    def compare_stages(self, run_dir: str) -> tuple[SFTConfig, RFTConfig | None]:
        """(a) and (c) of --compare, with the demo's model, seed and run dirs, and (c) with GRPO's task and checker
        (None: rft is null)."""
        a = self.scarce_sft
        a = dataclasses.replace(
            a, model=self.model, data=dataclasses.replace(a.data, path=os.path.join(run_dir, "scarce_examples.jsonl")),
            train=dataclasses.replace(a.train, run_dir=os.path.join(run_dir, "scarce_sft"), seed=self.seed,
                                      progress_bar=self.progress_bar))
        c = self.rft
        if c is None:
            return a, None
        c = dataclasses.replace(
            c, model=self.model, task=dataclasses.replace(self.grpo.task, seed=self.seed), rewards=self.grpo.rewards,
            eval=dataclasses.replace(c.eval, num_problems=0, before=False, after=False),
            train=dataclasses.replace(c.train, run_dir=os.path.join(run_dir, "rft"), seed=self.seed,
                                      progress_bar=self.progress_bar))
        return a, c

    def after_sft_stage(self, grpo: GRPOConfig) -> GRPOConfig:
        """(d) of --compare: the GRPO stage's settings (as `stages` filled them in) with `after_sft_overrides`, in
        its own run dir, its steps only an upper bound (the budget ends it)."""
        run_dir = os.path.join(os.path.dirname(grpo.train.run_dir), "grpo_after_sft")
        grpo = with_overrides(grpo, self.after_sft_overrides, where="after_sft_overrides")
        return dataclasses.replace(grpo, train=dataclasses.replace(grpo.train, run_dir=run_dir, steps=1000))


@dataclass
class DemoResult:
    """Evaluations per stage (name -> TaskEvaluation), stage seconds, the run dir and the files written."""

    evaluations: list[Evaluation]
    seconds: dict[str, float]
    run_dir: str
    files: dict[str, str]
    table: str
    stop_reason: str | None = None
    budget: dict[str, Any] | None = None


def grpo_training(cfg: GRPOConfig, difficulty: ArithmeticConfig | None) -> GRPOConfig:
    """The GRPO stage's config with its training problems at `difficulty` (None: unchanged)."""
    if difficulty is None:
        return cfg
    return dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, arithmetic=difficulty))


def main(cfg: DemoConfig, *, say: Callable[[str], None] | None = None) -> DemoResult:
    """Runs the stages and prints the table (see the module docstring)."""
    say = say or (lambda text: print(text, flush=True))
    watch = Stopwatch()
    run_dir = cfg.run_dir or os.path.join("runs", time.strftime("demo-%Y%m%d-%H%M%S"))
    os.makedirs(run_dir, exist_ok=True)
    with watch("total"):
        pipe, result, held, files, budget = _stages(cfg, run_dir, watch, say)
    table = _report(cfg, pipe, result, held, files, run_dir, say, budget)
    return DemoResult(evaluations=pipe.evaluations, seconds=watch.wall, run_dir=run_dir, files=files, table=table,
                      stop_reason=result.stop_reason, budget=budget)


GRPO_STAGE = "after GRPO"
# The --compare rows (scarce demonstrations): (a), (b), (c) and the reference.
SCARCE_STAGE, COMPARE_GRPO_STAGE, RFT_STAGE, REFERENCE_STAGE, AFTER_SFT_STAGE = (
    "(a) SFT again on the N", "(b) GRPO", "(c) RFT", "ref: SFT on fresh demos", "(d) GRPO after (a)")
# Stopwatch name of each budgeted stage.
_WATCH = {SCARCE_STAGE: "scarce sft", RFT_STAGE: "rft", REFERENCE_STAGE: "baseline sft",
          AFTER_SFT_STAGE: "grpo after sft"}
# The paired differences --compare reports: (b) - (a), (c) - (a), (d) - (a), (d) - (b), and (b), (c) against the
# reference row.
COMPARISONS = ((COMPARE_GRPO_STAGE, SCARCE_STAGE), (RFT_STAGE, SCARCE_STAGE), (AFTER_SFT_STAGE, SCARCE_STAGE),
               (AFTER_SFT_STAGE, COMPARE_GRPO_STAGE), (COMPARE_GRPO_STAGE, REFERENCE_STAGE),
               (RFT_STAGE, REFERENCE_STAGE))


@dataclass
class _DemoRun:
    """What the stages of one demo run share: its settings, the pipeline that times and evaluates them, the
    tokenizer, the task's training and validation rows, the evaluation options and the number of stages."""

    cfg: DemoConfig
    pipe: Pipeline
    tokenizer: Any
    train_rows: list[dict[str, Any]]
    validation_rows: list[dict[str, Any]]
    options: Any
    n_stages: int
    say: Callable[[str], None]


def _stages(cfg: DemoConfig, run_dir: str, watch: Stopwatch, say: Callable[[str], None],
            ) -> tuple[Pipeline, TrainResult, list[dict[str, Any]], dict[str, str], dict[str, Any] | None]:
    """The stages in order: (the pipeline with its evaluations, GRPO's result, the held-out rows, the files
    written, --compare's budget record or None)."""
    sft_cfg, grpo_cfg, baseline_cfg = cfg.stages(run_dir)
    # The demo evaluates every stage itself, so the GRPO stage's wall time is training alone.
    grpo_cfg = dataclasses.replace(grpo_cfg, eval=dataclasses.replace(grpo_cfg.eval, after=False))
    compare = baseline_cfg is not None
    say(f"tempax demo: {cfg.model.source} on {cfg.task}; writing to {run_dir}")
    train_rows, held_rows, validation_rows = _task_rows(cfg, grpo_cfg, compare)
    with watch("load"):
        model, tokenizer = cfg.model.build(seed=cfg.seed)
    say(f"  loaded the model in {watch.wall['load']:.0f} s")
    options = eval_options(grpo_cfg.eval, grpo_cfg.grpo.max_new_tokens, seed=cfg.seed)
    pipe = Pipeline(
        run_dir, watch=watch, say=say,
        evaluate=lambda name, m: evaluate(m, tokenizer, held_rows, options, label=f"eval {name}"),
        line=lambda name, r, seconds: (f"  {name}: format {r.format_accuracy:.1%}, answer {r.answer_accuracy:.1%} "
                                       f"on {len(held_rows)} held-out problems ({seconds:.0f} s)"))
    n_stages = 4 + (cfg.rft is not None) + cfg.reference + cfg.rl_after_sft if compare else 3
    demo = _DemoRun(cfg, pipe, tokenizer, train_rows, validation_rows, options, n_stages, say)

    model = _warm_start(demo, model, sft_cfg, limit=cfg.demonstrations if compare else None)
    result = _grpo_stage(demo, model, grpo_cfg, compare)
    budget = None
    if compare:
        # `model` is still the warm-start: each stage trains adapters on a copy sharing its (frozen) arrays.
        budget = _compare_stages(demo, model, grpo_cfg, baseline_cfg,
                                 grpo_steps=len(result.series("reward/total_mean")))

    files: dict[str, str] = {"metrics": os.path.join(grpo_cfg.train.run_dir, "metrics.jsonl")}
    try:
        files["reward_curve"] = plot_rewards(grpo_cfg.train.run_dir, os.path.join(run_dir, "reward_curve.png"))
    except Exception as e:  # a plotting problem must not hide the results
        say(f"  (could not draw the reward curve: {e})")
    return pipe, result, held_rows, files, budget


def _task_rows(cfg: DemoConfig, grpo_cfg: GRPOConfig, compare: bool,
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The task's (training, held-out, validation) rows, the validation rows being the last `validation_problems`
    training problems, checked against what the stages need."""
    train_rows, held_rows = load_task(grpo_cfg.task, eval_problems=grpo_cfg.eval.num_problems)
    validation_rows = train_rows[len(train_rows) - cfg.validation_problems:] if cfg.validation_problems else []
    if validation_rows and len(train_rows) - len(validation_rows) < cfg.demonstrations:
        raise ConfigError(f"validation_problems={cfg.validation_problems} leaves fewer than the {cfg.demonstrations} "
                          f"demonstrations among the task's {len(train_rows)} training problems; lower it")
    if compare and not any(r.get("target") for r in train_rows):
        raise ConfigError(f"--compare trains SFT on the task's ideal completions; task {cfg.task} has none "
                          "(use --task arithmetic, or drop --compare)")
    return train_rows, held_rows, validation_rows


def _warm_start(demo: _DemoRun, model: Any, sft_cfg: SFTConfig | None, *, limit: int | None) -> Any:
    """Stages 1 and 2: the base model's evaluation, then the SFT warm-start (on the first `limit` worked solutions
    with --compare) and its evaluation; returns the model the later stages start from."""
    cfg, pipe, say = demo.cfg, demo.pipe, demo.say
    say(f"[1/{demo.n_stages}] base model")
    if cfg.evaluate_base:
        pipe.evaluate("base model", model)
    else:
        say("  not evaluated (evaluate_base=false)")

    say(f"[2/{demo.n_stages}] SFT warm-start on the answer format"
        + (f" ({limit} worked solutions: all the demonstrations there are)" if limit is not None else ""))
    if sft_cfg is not None and any(r.get("target") for r in demo.train_rows):
        model, _ = pipe.train("sft", lambda: run_sft(model, demo.tokenizer, demo.train_rows, sft_cfg, say,
                                                     limit=limit))
        say(f"  trained in {pipe.watch.wall['sft']:.0f} s")
        pipe.evaluate("after SFT", model, trained="sft")
    else:
        say("  skipped (" + ("sft: null / --sft-steps 0" if sft_cfg is None else
                             f"task {cfg.task} has no SFT targets") + ")")
    return model


def _grpo_stage(demo: _DemoRun, model: Any, grpo_cfg: GRPOConfig, compare: bool) -> TrainResult:
    """Stage 3 ((b) of --compare): GRPO from `model`, a summary of its training, and its evaluation; returns its
    result without the trained policy, which no later stage starts from."""
    cfg, pipe, say, watch = demo.cfg, demo.pipe, demo.say, demo.pipe.watch
    say(f"[3/{demo.n_stages}] {'(b) ' if compare else ''}GRPO with strict format + correctness rewards"
        + (f" on problems of difficulty {cfg.grpo_difficulty}" if cfg.grpo_difficulty is not None else ""))
    result = pipe.train("grpo", lambda: run_grpo(model, demo.tokenizer, grpo_training(grpo_cfg, cfg.grpo_difficulty)))
    rewards = [v for _, v in result.series("reward/total_mean")]
    zero = [v for _, v in result.series("groups/zero_spread_frac")]
    split = {k: round(sum(v for _, v in result.series(f"perf/{k}_s"))) for k in ("step", "generation", "train")}
    say(f"  {len(rewards)} steps in {split['step']} s (generation {split['generation']} s, training "
        f"{split['train']} s; the stage {watch.wall['grpo']:.0f} s); reward {np.mean(rewards[:3]):.2f} -> "
        f"{np.mean(rewards[-3:]):.2f} (mean of first / last 3 steps); groups without reward spread: "
        f"{np.mean(zero):.0%}")
    if result.stop_reason:
        say(f"  stopped early: {result.stop_reason}")
    pipe.evaluate(COMPARE_GRPO_STAGE if compare else GRPO_STAGE, merged(result.model, grpo_cfg.lora), trained="grpo")
    # The policy is let go here so that --compare's stages do not hold it beside their own.
    return dataclasses.replace(result, model=None, source=None)


def _compare_stages(demo: _DemoRun, model: Any, grpo_cfg: GRPOConfig, baseline_cfg: SFTConfig, *,
                    grpo_steps: int) -> dict[str, Any]:
    """--compare's stages after GRPO, each from the warm-start `model` for the GRPO stage's budget: (a), (d) from
    (a)'s kept weights, (c) and the reference row; returns the budget record."""
    cfg, pipe, say, watch = demo.cfg, demo.pipe, demo.say, demo.pipe.watch
    scarce_cfg, rft_cfg = cfg.compare_stages(pipe.run_dir)
    n_demos = cfg.demonstrations
    equal = Budget.of(watch, "grpo", cfg.budget, label="GRPO")
    budget = {"clock": equal.clock, "seconds": watch.wall["grpo"], "grpo_cpu_seconds": watch.cpu["grpo"],
              "grpo_steps": grpo_steps, "demonstrations": n_demos, "stages": pipe.budgeted_stages,
              "budget_seconds": equal.seconds}
    seconds, spent = equal.seconds, equal.spent
    number = iter(range(4, demo.n_stages + 1))
    kept: dict[str, Any] = {}

    def train_scarce(hook: Any) -> tuple[Any, int]:
        kept["a"], steps = _scarce_sft(demo, model, scarce_cfg, hook, budget)
        return kept["a"], steps

    say(f"[{next(number)}/{demo.n_stages}] (a) SFT continued on the same {n_demos} worked solutions for GRPO's "
        f"{seconds:.0f} s of {spent}" + (f", kept at its best score on {len(demo.validation_rows)} validation "
                                         "problems" if demo.validation_rows else ""))
    pipe.budgeted(SCARCE_STAGE, _WATCH[SCARCE_STAGE], equal, train_scarce)

    if cfg.rl_after_sft:
        after_cfg = grpo_training(cfg.after_sft_stage(grpo_cfg), cfg.grpo_difficulty)

        def train_after(hook: Any) -> tuple[Any, int]:
            run = run_grpo(kept.pop("a"), demo.tokenizer, after_cfg, hooks=(hook,))
            return merged(run.model, after_cfg.lora), last_step(run)

        say(f"[{next(number)}/{demo.n_stages}] (d) GRPO from (a)'s weights for GRPO's {seconds:.0f} s of {spent}")
        pipe.budgeted(AFTER_SFT_STAGE, _WATCH[AFTER_SFT_STAGE], equal, train_after)
    kept.clear()

    def train_rft(hook: Any) -> tuple[Any, int]:
        trained, rft_result = run_rft(model, demo.tokenizer, rft_cfg, say, hooks=(hook,))
        budget["rft"] = {k: [v for _, v in rft_result.series(k)] for k in
                         ("reward/total_mean", "rft/accept_rate", "rft/kept", "rft/round_steps")}
        return trained, last_step(rft_result)

    if rft_cfg is not None:
        say(f"[{next(number)}/{demo.n_stages}] (c) RFT with the same checker for GRPO's {seconds:.0f} s of {spent}")
        pipe.budgeted(RFT_STAGE, _WATCH[RFT_STAGE], equal, train_rft)
    if cfg.reference:
        say(f"[{next(number)}/{demo.n_stages}] reference: SFT on fresh worked solutions (unlimited demonstrations) "
            f"for GRPO's {seconds:.0f} s of {spent}")
        pipe.budgeted(REFERENCE_STAGE, _WATCH[REFERENCE_STAGE], equal, lambda hook: run_sft(
            model, demo.tokenizer, demo.train_rows[n_demos:], baseline_cfg, say, hooks=(hook,),
            label="SFT on fresh demonstrations"))
    return budget


def _scarce_sft(demo: _DemoRun, model: Any, scarce_cfg: SFTConfig, hook: Any,
                budget: dict[str, Any]) -> tuple[Any, int]:
    """(a) of --compare: SFT continued on the same demonstrations under `hook` (the budget); with validation
    problems, scored every `validation_every` steps and kept at its best score (recorded in `budget`).
    (the model it keeps, its steps)."""
    cfg, say, rows = demo.cfg, demo.say, demo.validation_rows
    best = None
    if rows:
        val_options = dataclasses.replace(demo.options, greedy=True, group_size=0, ks=(1,),
                                          batch_size=eval_batch_size(len(rows)))
        best = BestOnValidation(
            every=cfg.validation_every, patience=cfg.validation_patience, budget=hook, say=say,
            score=lambda m: evaluate(m, demo.tokenizer, rows, val_options, label="validation").answer_accuracy)
    trained, steps = run_sft(model, demo.tokenizer, demo.train_rows, scarce_cfg, say,
                             hooks=(hook,) if best is None else (hook, best),
                             label="SFT on the same demonstrations", limit=cfg.demonstrations)
    if best is not None:
        trained = merged(best.best_model(), scarce_cfg.lora)
        budget["validation"] = {"problems": len(rows), "scores": best.history,
                                "kept_step": best.best_step, "kept_score": best.best_score,
                                "seconds": best.wall_seconds, "cpu_seconds": best.cpu_seconds}
        say(f"  kept the weights of step {best.best_step} of {steps} (validation answers "
            f"{best.best_score:.1%} on {len(rows)} problems; the scoring took "
            f"{best.wall_seconds:.0f} s wall, {best.cpu_seconds:.0f} s process CPU, outside the budget)")
    return trained, steps


def _report(cfg: DemoConfig, pipe: Pipeline, result: TrainResult, held_rows: list[dict[str, Any]],
            files: dict[str, str], run_dir: str, say: Callable[[str], None], budget: dict[str, Any] | None) -> str:
    """Writes results.json, says the table (and --compare's paired differences and budgets) and returns the
    printed table with the difference lines."""
    watch, evaluations = pipe.watch, pipe.evaluations
    table = pipe.table()
    lines, numbers = pipe.comparisons(COMPARISONS) if budget is not None else ([], {})
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
        ran = budget["stages"]
        say(f"Scarce demonstrations: the warm-start and (a) had {budget['demonstrations']} worked solutions; "
            + ", ".join(x for x, stage in (("(b)", None), ("(c)", RFT_STAGE), ("(d)", AFTER_SFT_STAGE))
                           if stage is None or stage in ran)
            + " unlimited problems with the checker"
            + ("; the reference row unlimited worked solutions" if REFERENCE_STAGE in ran else "") + "."
            + (" (d) is GRPO started from (a)'s kept weights." if AFTER_SFT_STAGE in ran else ""))
        if "validation" in budget:
            v = budget["validation"]
            say(f"(a) kept the weights of step {v['kept_step']}, its best validation score ({v['kept_score']:.1%} "
                f"answers on {v['problems']} validation problems; scores by step: "
                + ", ".join(f"{step} {score:.1%}" for step, score in v["scores"]) + ").")
        say(f"Equal {'wall time' if budget['clock'] == 'wall' else 'process CPU seconds'} (budget={budget['clock']}): "
            f"GRPO trained {budget['grpo_steps']} steps in {budget['seconds']:.0f} s wall, "
            f"{budget['grpo_cpu_seconds']:.0f} s CPU; "
            + "; ".join(f"{name} {v['steps']} steps in {v['seconds']:.0f} s wall, {v['cpu_seconds']:.0f} s CPU"
                        + (f" (of which validation scoring {budget['validation']['cpu_seconds']:.0f} s CPU, outside "
                           "the budget)" if name == SCARCE_STAGE and "validation" in budget else "")
                        for name, v in budget["stages"].items()) + ", all from the same warm-start, in this run.")
    say("")
    say(f"total {watch.wall['total']:.0f} s (process CPU time {watch.cpu['total']:.0f} s). Files: "
        + ", ".join(f"{k} {v}" for k, v in files.items()))
    return "\n".join([table, *lines])
