"""The tool demo pipeline (`tempax demo --task arithmetic-tools`): does a calculator tool make SmolLM2-135M right
where it is wrong alone? Five stages on arithmetic problems past what the model computes reliably, each evaluated
greedily on the same held-out problems (answer accuracy with 95% Wilson intervals): the base model; a tool
warm-start (LoRA SFT on transcripts a scripted policy plays with the calculator, `calculator_policy`) and agentic
GRPO from it with the calculator; a plain warm-start of the same cost on the same problems' worked answers and
GRPO from it without tools. RL with the tool against RL without it, each from its own warm-start, is the
comparison; `sft:` and `grpo:` are the stages' configs (any key is an override). The measured run:
`docs/measurements/arithmetic-tools.md`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from tempax.algorithms.common import ModelSourceConfig
from tempax.algorithms.episode_eval import evaluate_task
from tempax.algorithms.grpo.config import GRPOConfig, GRPOKnobsConfig
from tempax.algorithms.grpo.main import main as grpo_main
from tempax.algorithms.sft.main import SFTConfig
from tempax.algorithms.sft.main import main as sft_main
from tempax.configlib import help_field
from tempax.data.sft import SFTDataConfig
from tempax.data.tasks.arithmetic import ArithmeticConfig
from tempax.data.tasks.spec import TaskConfig, load_task
from tempax.envs.registry import EnvironmentConfig
from tempax.envs.transcripts import record_transcripts
from tempax.errors import ConfigError
from tempax.eval.evaluate import EvalOptions, TaskEvaluation
from tempax.eval.spec import EvalConfig
from tempax.experiments.budget import Stopwatch
from tempax.experiments.pipeline import Pipeline
from tempax.experiments.stages import in_memory_train, merged, write_sft_examples
from tempax.models.lora import LoraConfig
from tempax.rewards.registry import RewardsConfig
from tempax.train.config import OptimizerConfig


TASK = "arithmetic-tools"
STAGES = ("base, no tools", "warm-start with tools", "RL with tools", "warm-start, no tools", "RL without tools")


def tools_task() -> TaskConfig:
    """Two-step problems with amounts up to 999 and products of factors up to 99 ("37 boxes of 48 stickers")."""
    return TaskConfig(name="arithmetic", num_train_problems=2000,
                      arithmetic=ArithmeticConfig(max_operand=999, max_factor=99, max_steps=2))


def tools_sft_config() -> SFTConfig:
    """The warm-start of either arm: 8 LoRA SFT steps of 4 packed 512-token rows at lr 1e-3 (cosine)."""
    return SFTConfig(
        lora=LoraConfig(rank=16, alpha=32.0), data=SFTDataConfig(path="<run_dir>/demonstrations.jsonl"),
        train=in_memory_train(steps=8, batch_size=4, seq_len=512, optimizer=OptimizerConfig(
            learning_rate=1e-3, warmup_steps=1, schedule="cosine", min_lr_ratio=0.1)),
    )


def tools_grpo_config() -> GRPOConfig:
    """Either arm's RL: 8 GRPO steps of 2 prompts x 8 episodes (48 tokens a reply, up to 2 replies with the
    calculator, 160 episode tokens: room for a cut reply, an error message and a second reply), no KL, LoRA lr
    2e-4."""
    return GRPOConfig(
        lora=LoraConfig(rank=16, alpha=32.0), task=tools_task(),
        rewards=RewardsConfig(functions=("format", "correctness")),
        env=EnvironmentConfig(name="calculator", max_turns=2, max_episode_tokens=160),
        grpo=GRPOKnobsConfig(group_size=8, max_new_tokens=48, temperature=1.0, beta=0.0, max_prompt_len=512),
        eval=EvalConfig(num_problems=0, before=False, after=False),
        train=in_memory_train(steps=8, batch_size=2, optimizer=OptimizerConfig(
            learning_rate=2e-4, schedule="constant", warmup_steps=0)),
    )


@dataclass(frozen=True)
class ToolDemoConfig:
    """The tool demo: the model, the warm-start and RL configs, the held-out problems."""

    model: ModelSourceConfig = help_field(
        "The model.", default_factory=lambda: ModelSourceConfig(source="smollm2-135m-instruct"))
    demonstrations: int = help_field("Training problems the warm-starts use (tool episodes / ideal answers).", 32)
    sft: SFTConfig = help_field("The warm-start of both arms (data.path and run_dir set by the demo).",
                                default_factory=tools_sft_config)
    grpo: GRPOConfig = help_field("RL of both arms (task, rewards, env; the no-tool arm sets env.name=single_turn).",
                                  default_factory=tools_grpo_config)
    eval_problems: int = help_field("Held-out problems every stage is evaluated on.", 256)
    eval_batch_size: int = help_field("Problems decoded together in an evaluation.", 64)
    evaluate_plain_warm_start: bool = help_field(
        "Evaluate the no-tool warm-start too (stage 4's row); false saves one evaluation.", True)
    seed: int = help_field("Seed of data generation, initialisation and sampling.", 0)
    run_dir: str | None = help_field("Where everything is written; null: runs/demo-tools-<date>-<time>.", None)

    def validate(self) -> None:
        if self.grpo.env.single_turn:
            raise ConfigError("grpo.env must be a tool environment (calculator) for the tool arm")
        if self.eval_problems < 1 or self.demonstrations < 1:
            raise ConfigError("eval_problems and demonstrations must be >= 1")


def calculator_expression(target: str) -> str:
    """The one expression that computes an arithmetic row's answer, from its ideal completion's working lines
    ("37 * 48 = 1776", "1776 + 120 = 1896" -> "37 * 48 + 120"); each line starts from the previous result, and
    only the first may be a product, so left-to-right order is the calculator's order too."""
    body = target.split("<reasoning>\n", 1)[1].split("\n</reasoning>", 1)[0]
    expression = ""
    for line in body.splitlines():
        lhs = line.split(" = ")[0]
        expression = lhs if not expression else f"{expression} {lhs.split(' ', 1)[1]}"
    return expression


def calculator_policy(messages: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, Any] | str:
    """The scripted policy of a correct tool-use episode for an arithmetic row: a calculator call on the row's
    expression, then the worked answer with the calculator's result."""
    expression = calculator_expression(row["target"])
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if not results:
        return {"content": "", "tool_calls": [{"name": "calculator", "arguments": {"expression": expression}}]}
    return f"<reasoning>\n{expression} = {results[-1]}\n</reasoning>\n<answer>\n{results[-1]}\n</answer>"


def main(cfg: ToolDemoConfig, *, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Runs the five stages and prints the table; returns the numbers written to results.json."""
    say = say or (lambda text: print(text, flush=True))
    cfg.validate()
    run_dir = cfg.run_dir or os.path.join("runs", time.strftime("demo-tools-%Y%m%d-%H%M%S"))
    os.makedirs(run_dir, exist_ok=True)
    watch = Stopwatch()
    with watch("total"):
        demo = _ToolDemoRun(cfg, run_dir, say, watch)
        _run_stages(demo)
    return _report(demo)


class _ToolDemoRun:
    """What the five stages share (the task's rows, the model, the pipeline that times and evaluates them, the
    episode counters) and the two kinds of stage each arm runs: a warm-start and RL."""

    def __init__(self, cfg: ToolDemoConfig, run_dir: str, say: Callable[[str], None], watch: Stopwatch):
        self.cfg, self.run_dir, self.say, self.watch = cfg, run_dir, say, watch
        self.task = dataclasses.replace(cfg.grpo.task, seed=cfg.seed)
        self.train_rows, self.held_rows = load_task(self.task, eval_problems=cfg.eval_problems)
        self.model, self.tokenizer = cfg.model.build(seed=cfg.seed)
        self.max_new = cfg.grpo.grpo.max_new_tokens
        self.options = EvalOptions(max_new_tokens=self.max_new, greedy=True, group_size=0,
                                   batch_size=cfg.eval_batch_size)
        self.counters: dict[str, dict[str, float]] = {}
        self.notes: dict[str, str] = {}  # a row -> the episode counters its evaluation said
        self.pipe = Pipeline(run_dir, watch=watch, say=say, evaluate=self._evaluate, line=self._line)

    def _evaluate(self, name: str, policy: Any, env: EnvironmentConfig) -> TaskEvaluation:
        factory = None if env.single_turn else env.build(self.tokenizer)
        said: list[str] = []
        r = evaluate_task(policy, self.tokenizer, self.held_rows, self.options, env_factory=factory,
                          max_turns=env.max_turns,
                          episode_tokens=env.episode_tokens(self.max_new, key="grpo.grpo.max_new_tokens"),
                          label=name, log=said.append)
        if said:
            self.notes[name] = said[0]
        return r

    def _line(self, name: str, r: TaskEvaluation, seconds: float) -> str:
        return (f"  {name}: answer {r.answer_accuracy:.1%}, format {r.format_accuracy:.1%} on "
                f"{len(self.held_rows)} held-out problems ({seconds:.0f} s)"
                + (f"; {self.notes[name]}" if name in self.notes else ""))

    def warm_start(self, name: str, env: EnvironmentConfig) -> Any:
        """LoRA SFT of the base model on the first `demonstrations` problems: tool-use transcripts the scripted
        policy plays with `env`, or the ideal completions where `env` is single-turn; the model, merged."""
        cfg, tokenizer = self.cfg, self.tokenizer
        path = os.path.join(self.run_dir, f"{name}.jsonl")
        rows = self.train_rows[:cfg.demonstrations]
        if env.single_turn:
            write_sft_examples(rows, path, len(rows))
        else:
            record_transcripts(path, env.build(tokenizer), rows, calculator_policy, tokenizer=tokenizer,
                               max_turns=env.max_turns)
        sft = dataclasses.replace(cfg.sft, model=cfg.model, data=dataclasses.replace(cfg.sft.data, path=path),
                                  train=dataclasses.replace(cfg.sft.train, run_dir=os.path.join(self.run_dir, name),
                                                            seed=cfg.seed, progress_bar=False))
        result = self.pipe.train(name, lambda: sft_main(sft, log=lambda text: None, model=self.model,
                                                        tokenizer=tokenizer))
        self.say(f"  SFT {name}: {cfg.demonstrations} demonstrations, {result.history[-1][0]} steps, final loss "
                 f"{result.history[-1][1].get('loss', float('nan')):.3f} ({self.watch.wall[name]:.0f} s)")
        return merged(result.model, sft.lora)

    def reinforce(self, name: str, start: Any, env: EnvironmentConfig) -> Any:
        """GRPO from `start` in `env` with the demo's RL settings; the policy, merged. Its last step's episode and
        entropy counters are kept in `counters`."""
        cfg = self.cfg
        g = dataclasses.replace(cfg.grpo, model=cfg.model, task=self.task, env=env,
                                train=dataclasses.replace(cfg.grpo.train, run_dir=os.path.join(self.run_dir, name),
                                                          seed=cfg.seed, progress_bar=False))
        run = self.pipe.train(name, lambda: grpo_main(g, log=lambda text: None, model=start, tokenizer=self.tokenizer))
        history = run.history
        first, last = history[0][1], history[-1][1]
        self.counters[name] = {k: v for k, v in last.items() if k.startswith(("episode/", "entropy/"))}
        self.say(f"  GRPO {name}: {len(history)} steps in {self.watch.wall[name]:.0f} s; reward "
                 f"{first['reward/total_mean']:.2f} -> {last['reward/total_mean']:.2f} (first -> last step)"
                 + "".join(f", {k} {v:.2f}" for k, v in sorted(self.counters[name].items())))
        return merged(run.model, g.lora)


def _run_stages(demo: _ToolDemoRun) -> None:
    """The five stages in order: the tool arm (warm-start, RL), then the plain arm, each evaluated."""
    cfg, pipe, say = demo.cfg, demo.pipe, demo.say
    tool_env = cfg.grpo.env
    plain_env = dataclasses.replace(tool_env, name="single_turn", max_turns=1, max_episode_tokens=None)
    say(f"tempax demo --task {TASK}: {cfg.model.source}; {len(demo.held_rows)} held-out problems; writing to "
        f"{demo.run_dir}")
    say("[1/5] base model, no tools")
    pipe.evaluate(STAGES[0], demo.model, env=plain_env)
    say(f"[2/5] warm-start on {cfg.demonstrations} tool-use episodes")
    tool_start = demo.warm_start("tool_demos", tool_env)
    pipe.evaluate(STAGES[1], tool_start, env=tool_env, trained="tool_demos")
    say("[3/5] GRPO with the calculator")
    pipe.evaluate(STAGES[2], demo.reinforce("grpo_tools", tool_start, tool_env), env=tool_env, trained="grpo_tools")
    del tool_start
    say(f"[4/5] warm-start on the same {cfg.demonstrations} problems' worked answers, no tools")
    plain_start = demo.warm_start("plain_demos", plain_env)
    if cfg.evaluate_plain_warm_start:
        pipe.evaluate(STAGES[3], plain_start, env=plain_env, trained="plain_demos")
    else:
        say("  not evaluated (evaluate_plain_warm_start=false)")
    say("[5/5] GRPO without tools, same steps and samples")
    pipe.evaluate(STAGES[4], demo.reinforce("grpo_plain", plain_start, plain_env), env=plain_env,
                  trained="grpo_plain")


def _report(demo: _ToolDemoRun) -> dict[str, Any]:
    """Says the table and writes results.json; returns what it holds."""
    pipe, watch, say = demo.pipe, demo.watch, demo.say
    table = pipe.table()
    say("")
    say(f"Held-out arithmetic-tools problems ({len(demo.held_rows)}, greedy; 95% Wilson intervals):")
    say(table)
    say(f"total {watch.wall['total']:.0f} s wall, {watch.cpu['total']:.0f} s process CPU")
    out = {"table": table, "wall_s": watch.wall["total"], "cpu_s": watch.cpu["total"],
           "seconds": {name: watch.wall[name] for name in pipe.training}, "episode_metrics": demo.counters,
           "accuracy": {name: r.answer_accuracy for name, r in pipe.evaluations},
           "examples": {name: [dataclasses.asdict(x) for x in r.greedy_records[:3]] for name, r in pipe.evaluations}}
    with open(os.path.join(demo.run_dir, "results.json"), "w") as f:
        json.dump(out, f, indent=2, default=str)
    return out
