"""Which task a verifiable-reward run trains and evaluates on (`TaskConfig`), and its rows (`load_task`): shared by
the algorithms that sample answers to problems and check them (GRPO, RFT) and by the demo."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from tempax.configlib import help_field
from tempax.data.tasks.arithmetic import ArithmeticConfig, generate_arithmetic
from tempax.data.tasks.code import CodeTaskConfig, generate_code_problems
from tempax.data.tasks.gsm8k import load_gsm8k
from tempax.errors import ConfigError


@dataclass(frozen=True)
class TaskConfig:
    """Where the prompts and reference answers come from."""

    name: Literal["gsm8k", "arithmetic", "code", "jsonl"] = help_field(
        "gsm8k (grade-school math, answer after '####'), arithmetic (generated one/two-step word problems), code "
        "(generated function-writing problems with hidden tests, for the code_tests reward) or jsonl (the rows of `source` as they are, for a user environment's reset; no held-out split).",
        "gsm8k",
    )
    source: str | None = help_field(
        "gsm8k: a folder with train.jsonl/test.jsonl, a jsonl file or a Hub id; null: the Hub's openai/gsm8k. "
        "jsonl: the file of task rows (one JSON object a line).",
        None,
    )
    train_split: str = help_field("Split the prompts are drawn from.", "train")
    eval_split: str = help_field("Held-out split for evaluation.", "test")
    max_train_rows: int | None = help_field("Use only the first N training problems (null: all).", None)
    num_train_problems: int = help_field("arithmetic, code: how many training problems to generate.", 2000)
    arithmetic: ArithmeticConfig = help_field("arithmetic: difficulty of the generated problems.",
                                         default_factory=ArithmeticConfig)
    code: CodeTaskConfig = help_field("code: hidden tests per problem and the held-out share.",
                                      default_factory=CodeTaskConfig)
    seed: int = help_field("arithmetic, code: generation seed (train and held-out splits are disjoint for any seed).", 0)

    def validate(self) -> None:
        if self.max_train_rows is not None and self.max_train_rows < 1:
            raise ConfigError(f"task.max_train_rows must be >= 1 or null, got {self.max_train_rows}")
        if self.num_train_problems < 1:
            raise ConfigError(f"task.num_train_problems must be >= 1, got {self.num_train_problems}")
        if self.name == "jsonl" and not self.source:
            raise ConfigError("task.name=jsonl needs task.source, the .jsonl file of task rows")


def load_task(spec: TaskConfig, *, eval_problems: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, held-out rows) of the task."""
    if spec.name == "arithmetic":
        train = generate_arithmetic(spec.num_train_problems, split="train", seed=spec.seed, config=spec.arithmetic)
        held = generate_arithmetic(eval_problems, split="test", seed=spec.seed, config=spec.arithmetic) \
            if eval_problems else []
    elif spec.name == "code":
        train = generate_code_problems(spec.num_train_problems, split="train", seed=spec.seed, config=spec.code)
        held = generate_code_problems(eval_problems, split="test", seed=spec.seed, config=spec.code) \
            if eval_problems else []
    elif spec.name == "jsonl":
        train, held = read_task_rows(str(spec.source)), []
    else:
        train = list(load_gsm8k(spec.train_split, spec.source, limit=spec.max_train_rows))
        held = list(load_gsm8k(spec.eval_split, spec.source, limit=eval_problems)) if eval_problems else []
    if spec.max_train_rows is not None:
        train = train[: spec.max_train_rows]
    return train, held


def split_rows(name: str, split: str, num_problems: int, source: str | None = None,
               seed: int = 0) -> list[dict[str, Any]]:
    """The first `num_problems` rows of one split of task `name` (what `tempax eval` scores): a generated task's
    "test" split is its held-out problems and any other split its training problems; gsm8k reads `split` of
    `source` (as `TaskConfig.source`)."""
    if name == "arithmetic":
        return generate_arithmetic(num_problems, split="test" if split == "test" else "train", seed=seed)
    if name == "code":
        return generate_code_problems(num_problems, split="test" if split == "test" else "train", seed=seed)
    return list(load_gsm8k(split, source, limit=num_problems))


def read_task_rows(path: str) -> list[dict[str, Any]]:
    """Every line of a .jsonl file as one task row (a JSON object), blank lines skipped."""
    try:
        with open(path) as f:
            lines = [(i, line) for i, line in enumerate(f, 1) if line.strip()]
    except OSError as e:
        raise ConfigError(f"task.source={path!r}: cannot read it ({e.strerror})") from None
    rows = []
    for i, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{i}: not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{i}: a task row must be a JSON object, got {type(row).__name__}")
        rows.append(row)
    if not rows:
        raise ConfigError(f"task.source={path!r} holds no task rows")
    return rows
