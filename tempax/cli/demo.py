"""`tempax demo [--compare] [--task arithmetic|gsm8k|arithmetic-tools] [KEY=VALUE ...]`: SFT warm-start + GRPO on
verifiable arithmetic with a before/after table, the scarce-demonstration comparison, or the tool demo.

The pipelines are `tempax.experiments.demo` (`DemoConfig`, `main`) and `tempax.experiments.tool_demo`
(`ToolDemoConfig`, `main`); this module maps the flags to their config keys and runs them, which print as they go.
A demo whose GRPO stage a hook stopped early exits with status 3, as a training command does.
"""

from __future__ import annotations

import argparse

from tempax.cli.train_cmds import STOPPED_EXIT_STATUS
from tempax.configlib import describe, load_config
from tempax.experiments import tool_demo
from tempax.experiments.budget import BUDGET_CLOCKS
from tempax.experiments.demo import DEFAULT_MODEL, DemoConfig, main


# On a TPU or GPU the demo's CPU sizes leave the chip idle and score 48 problems, too few for an interval that
# tells stages apart: there it scores 300 held-out problems and trains longer. The --compare arms' step bounds
# rise too: a chip runs the CPU's bound of SFT steps in less than GRPO's time, and the bound, not the budget,
# would end them (docs/results.md, TPU v5e). Flags and KEY=VALUE still win.
ACCELERATOR_SIZES = ("grpo.eval.num_problems=300", "sft.train.steps=30", "grpo.train.steps=60",
                     "scarce_sft.train.steps=100000", "baseline.train.steps=100000", "rft.train.steps=100000")


def demo_sizes(size: str, backend: str) -> tuple[str, ...]:
    """The overrides of `--size`: none for "cpu", ACCELERATOR_SIZES for "accelerator", and for "auto" whichever
    `backend` (JAX's default backend: "cpu", "tpu", "gpu") is."""
    if size == "auto":
        size = "cpu" if backend == "cpu" else "accelerator"
    return ACCELERATOR_SIZES if size == "accelerator" else ()


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
                             "(tempax/experiments/tool_demo.py: base, warm-starts and RL with and without a "
                             "calculator)")
    parser.add_argument("--source", default=None,
                        help="--task gsm8k: a folder with train.jsonl/test.jsonl, a jsonl file or a Hub id (default "
                             "the Hub's openai/gsm8k; = grpo.task.source)")
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
    parser.add_argument("--size", choices=("auto", "cpu", "accelerator"), default="auto",
                        help="the demo's sizes: 'cpu' (the defaults above), 'accelerator' (" +
                             " ".join(ACCELERATOR_SIZES) + "), or 'auto' (default): 'accelerator' on a TPU or GPU")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="any DemoConfig key, e.g. grpo.guard.action=stop grpo.grpo.temperature=0.7 "
                             "sft.train.optimizer.learning_rate=5e-4 (see --describe)")
    parser.add_argument("--describe", action="store_true", help="list every config key with its type and help")


def _shortcuts(args: argparse.Namespace, keys: dict[str, str]) -> list[str]:
    """`key=value` for each flag of `keys` (flag -> config key) that was given."""
    return [f"{key}={getattr(args, flag)}" for flag, key in keys.items() if getattr(args, flag, None) is not None]


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    """The flags are shortcuts for keys of the typed config; KEY=VALUE overrides come after them."""
    shortcuts = _shortcuts(args, {
        "model": "model.source", "steps": "grpo.train.steps", "task": "grpo.task.name", "source": "grpo.task.source",
        "eval_problems": "grpo.eval.num_problems", "run_dir": "run_dir", "seed": "seed",
        "advantage": "grpo.grpo.advantage", "compare": "compare", "budget": "budget",
        "demonstrations": "demonstrations"})
    if args.sft_steps is not None:
        shortcuts.append("sft=null" if args.sft_steps == 0 else f"sft.train.steps={args.sft_steps}")
    if args.task == "gsm8k":
        # GSM8K answers need room: longer generations for training and evaluation.
        shortcuts += ["grpo.grpo.max_new_tokens=256", "grpo.eval.max_new_tokens=256", "grpo.task.max_train_rows=2000"]
    sizes: tuple[str, ...] = ()
    if getattr(args, "size", "cpu") != "cpu":
        import jax

        sizes = demo_sizes(args.size, jax.default_backend())
    return load_config(DemoConfig, None, [*sizes, *shortcuts, *(getattr(args, "overrides", []) or [])])


def tool_config_from_args(args: argparse.Namespace) -> tool_demo.ToolDemoConfig:
    """`--task arithmetic-tools`: the shortcuts --model, --steps, --sft-steps, --eval-problems, --run-dir, --seed,
    --demonstrations and --advantage map to the tool demo's keys; KEY=VALUE overrides come after them."""
    shortcuts = _shortcuts(args, {
        "model": "model.source", "steps": "grpo.train.steps", "sft_steps": "sft.train.steps",
        "eval_problems": "eval_problems", "run_dir": "run_dir", "seed": "seed", "demonstrations": "demonstrations",
        "advantage": "grpo.grpo.advantage"})
    return load_config(tool_demo.ToolDemoConfig, None, shortcuts + list(getattr(args, "overrides", []) or []))


def run(args: argparse.Namespace) -> int:
    if getattr(args, "describe", False):
        print(describe(DemoConfig))
        return 0
    if getattr(args, "task", None) == "arithmetic-tools":
        tool_demo.main(tool_config_from_args(args))
        return 0
    result = main(config_from_args(args))
    if result.stop_reason:
        return STOPPED_EXIT_STATUS
    return 0
