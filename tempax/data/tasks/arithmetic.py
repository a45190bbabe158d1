"""A generated, verifiable arithmetic task: one- and two-step word problems with exact integer answers.

"Sam has 23 marbles and finds 48 more. How many marbles does Sam have now?" -> 71, with the ideal completion
`<reasoning>\\n23 + 48 = 71\\n</reasoning>\\n<answer>\\n71\\n</answer>` as `target` for an SFT warm-start.

Problems are short on purpose: on CPU the prompt is re-read for every sampled completion, so prompt tokens are a
large share of RL compute. Generation is deterministic given (seed, split, config) - `random.Random` seeded with a
string is stable across processes and Python hash seeds. Train and held-out ("test") splits are disjoint by
construction: a question belongs to the held-out split iff the SHA-256 of its text falls in the first
`heldout_percent` of buckets, so no seed or size can make the splits share a question.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from tempax.data.tasks.common import SYSTEM_PROMPT, build_prompt_messages, format_target
from tempax.errors import ConfigError

SPLITS = ("train", "test")
OPERATIONS = ("add", "sub", "mul")

NAMES = (
    "Sam", "Ava", "Leo", "Mia", "Noah", "Lily", "Omar", "Zoe", "Ben", "Nina", "Raj", "Emma", "Kai", "Lucy",
    "Tom", "Ivy", "Max", "Sara", "Finn", "Rosa",
)
OBJECTS = (
    "marbles", "stickers", "pencils", "apples", "coins", "cards", "shells", "books", "balloons", "cookies",
    "stamps", "beads",
)
# Verb phrases; {x} is the amount, {friend} another name.
ADD_PHRASES = ("finds {x} more", "gets {x} more from {friend}", "buys {x} more")
SUB_PHRASES = ("gives {x} to {friend}", "loses {x}", "sells {x}")
GROUP_WORDS = ("boxes", "bags", "packs")

# Generation gives up after this many draws in a row brought no new question of the wanted split: the question
# space is (nearly) exhausted. Held-out keeps ~heldout_percent of draws, so a healthy run misses ~10 in a row.
MAX_CONSECUTIVE_MISSES = 20_000
T = TypeVar("T")


@dataclass(frozen=True)
class ArithmeticConfig:
    """Difficulty of the generated problems.

    Attributes:
      max_operand: amounts that are added or subtracted lie in [2, max_operand].
      max_factor: both factors of a multiplication lie in [2, max_factor] (kept small: "5 boxes of 7").
      max_steps: 1 or 2 operations per problem; with 2, one- and two-step problems are drawn equally often.
      operations: which of "add", "sub", "mul" may appear.
      heldout_percent: share (in %) of all possible questions reserved for the held-out split.
    """

    max_operand: int = 50
    max_factor: int = 9
    max_steps: int = 2
    operations: tuple[str, ...] = OPERATIONS
    heldout_percent: int = 10

    def __post_init__(self) -> None:
        if self.max_operand < 3:
            raise ConfigError(f"max_operand must be >= 3, got {self.max_operand}")
        if self.max_factor < 2:
            raise ConfigError(f"max_factor must be >= 2, got {self.max_factor}")
        if self.max_steps not in (1, 2):
            raise ConfigError(f"max_steps must be 1 or 2, got {self.max_steps}")
        unknown = sorted(set(self.operations) - set(OPERATIONS))
        if unknown or not self.operations:
            raise ConfigError(
                f"operations must be a non-empty subset of {OPERATIONS}, got {self.operations}"
            )
        if not 0 < self.heldout_percent < 100:
            raise ConfigError(f"heldout_percent must be in 1..99, got {self.heldout_percent}")


def is_heldout_question(question: str, heldout_percent: int) -> bool:
    """Whether `question` belongs to the held-out split (stable hash bucket of its text)."""
    bucket = int.from_bytes(hashlib.sha256(question.encode("utf-8")).digest()[:8], "big") % 100
    return bucket < heldout_percent


def distinct_problems(
    draw: Callable[[], tuple[str, T] | None], n: int, *, split: str, heldout_percent: int, what: str, fix: str
) -> list[tuple[str, T]]:
    """The first `n` draws (`draw() -> (question, payload)`, None for a draw that broke a constraint) whose
    question is new and belongs to `split` (`is_heldout_question`). `what` names the task in messages; `fix` says
    what to change when `MAX_CONSECUTIVE_MISSES` draws in a row bring nothing new (the space is exhausted)."""
    if split not in SPLITS:
        raise ConfigError(f"{what} split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise ConfigError(f"{what}: number of problems must be >= 0, got {n}")
    want_heldout = split == "test"
    found: list[tuple[str, T]] = []
    seen: set[str] = set()
    misses = 0
    while len(found) < n:
        misses += 1
        if misses > MAX_CONSECUTIVE_MISSES:
            raise ConfigError(f"{what}: found only {len(found)} distinct {split} problems of {n} requested; {fix}")
        drawn = draw()
        if drawn is None:
            continue
        question = drawn[0]
        if question in seen or is_heldout_question(question, heldout_percent) != want_heldout:
            continue
        seen.add(question)
        misses = 0
        found.append(drawn)
    return found


def _draw_problem(rng: random.Random, cfg: ArithmeticConfig) -> tuple[str, list[str], int] | None:
    """One random problem: (question, reasoning lines, answer), or None when the draw broke a constraint."""
    has_add_sub = bool({"add", "sub"} & set(cfg.operations))
    # With multiplication alone there is nothing to chain it with, so every problem is one product.
    steps = rng.randint(1, cfg.max_steps) if has_add_sub else 1
    name, friend = rng.sample(NAMES, 2)
    objects = rng.choice(OBJECTS)
    lines: list[str] = []
    # The opening clause is either a multiplication ("buys 3 boxes of 7 stickers") or a plain amount; each
    # allowed operation is equally likely to open the problem.
    use_mul = "mul" in cfg.operations and (not has_add_sub or rng.random() < 1 / len(cfg.operations))
    if use_mul:
        a, b = rng.randint(2, cfg.max_factor), rng.randint(2, cfg.max_factor)
        value = a * b
        opening = f"{name} buys {a} {rng.choice(GROUP_WORDS)} of {b} {objects}"
        lines.append(f"{a} * {b} = {value}")
        actions_needed = steps - 1
    else:
        value = rng.randint(2, cfg.max_operand)
        opening = f"{name} has {value} {objects}"
        actions_needed = steps
    actions = []
    for _ in range(actions_needed):
        kinds = [op for op in ("add", "sub") if op in cfg.operations]
        kind = rng.choice(kinds)
        if kind == "sub":
            if value < 2:
                return None
            x = rng.randint(1, min(cfg.max_operand, value - 1))
            new_value, sign, phrase = value - x, "-", rng.choice(SUB_PHRASES)
        else:
            x = rng.randint(2, cfg.max_operand)
            new_value, sign, phrase = value + x, "+", rng.choice(ADD_PHRASES)
        actions.append(phrase.format(x=x, friend=friend))
        lines.append(f"{value} {sign} {x} = {new_value}")
        value = new_value
    if len(actions) == 2:
        statement = f"{opening}, {actions[0]}, then {actions[1]}."
    elif len(actions) == 1:
        statement = f"{opening} and {actions[0]}."
    else:
        statement = f"{opening}."
    question = f"{statement} How many {objects} does {name} have now?"
    return question, lines, value


def generate_arithmetic(
    n: int,
    *,
    split: str = "train",
    seed: int = 0,
    config: ArithmeticConfig = ArithmeticConfig(),
    system_prompt: str | None = SYSTEM_PROMPT,
) -> list[dict[str, Any]]:
    """`n` distinct problems of `split` as rows `{prompt_messages, question, answer, target}`.

    `answer` is the integer result as text; `target` the ideal completion. The same (n, split, seed, config)
    always gives the same rows, and a smaller `n` gives a prefix of a larger one.
    """
    rng = random.Random(f"tempax-arithmetic:{seed}:{split}")

    def draw() -> tuple[str, tuple[list[str], int]] | None:
        problem = _draw_problem(rng, config)
        return None if problem is None else (problem[0], (problem[1], problem[2]))

    fix = "raise task.arithmetic.max_operand / task.arithmetic.max_factor or task.arithmetic.max_steps"
    return [
        {
            "prompt_messages": build_prompt_messages(question, system_prompt),
            "question": question,
            "answer": str(result),
            "target": format_target("\n".join(lines), str(result)),
        }
        for question, (lines, result) in distinct_problems(draw, n, split=split, what="arithmetic",
                                                           heldout_percent=config.heldout_percent, fix=fix)
    ]
