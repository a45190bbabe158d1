"""A generated code task: write a small Python function (lists, strings, arithmetic), checked by hidden tests.

    "Write a Python function `count_above_7(xs: list[int]) -> int` that returns how many elements of xs are
    greater than 7." -> tests [{"args": [[3, 9, 12]], "expected": 2}, ...]

Each problem comes from a family (a description and a reference implementation with parameters, e.g. the
threshold 7 above) and gets `tests_per_problem` random argument lists, whose expected values the reference
computes here. Rows are `{prompt_messages, question, entry_point, tests, answer, target}`: `answer` is the
reference source, `target` the ideal completion (the reference in a ```python block) for an SFT warm-start, and
`tests` stay with the trainer: the program under test sees only the arguments (`tempax.rewards.code`).

Generation is deterministic given (seed, split, config), as for the arithmetic task; train and held-out ("test")
splits are disjoint by construction: a question is held out iff the SHA-256 of its text falls in the first
`heldout_percent` buckets (`tempax.data.tasks.arithmetic.is_heldout_question`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

from tempax.data.tasks.arithmetic import distinct_problems
from tempax.data.tasks.common import build_prompt_messages
from tempax.errors import ConfigError

CODE_SYSTEM_PROMPT = (
    "Write the Python function the user asks for. Reply with one ```python code block that defines it; "
    "it is run against hidden tests."
)


@dataclass(frozen=True)
class CodeTaskConfig:
    """The generated code problems.

    Attributes:
      tests_per_problem: hidden tests drawn for each problem.
      heldout_percent: share (in %) of all possible questions reserved for the held-out split.
    """

    tests_per_problem: int = 8
    heldout_percent: int = 10

    def __post_init__(self) -> None:
        if self.tests_per_problem < 1:
            raise ConfigError(f"tests_per_problem must be >= 1, got {self.tests_per_problem}")
        if not 0 < self.heldout_percent < 100:
            raise ConfigError(f"heldout_percent must be in 1..99, got {self.heldout_percent}")


@dataclass(frozen=True)
class Family:
    """A kind of problem: `params(rng)` draws its parameters, `name` / `signature` / `description` / `source`
    are format strings over them (the function's name, its typed parameters and return type, what it does, the
    reference body), and `args(rng)` draws one test's arguments."""

    name: str
    signature: str
    description: str
    source: str
    params: Callable[[random.Random], dict[str, Any]]
    args: Callable[[random.Random], list[Any]]


def _ints(rng: random.Random, low: int = -20, high: int = 20, most: int = 8) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(0, most))]


def _word(rng: random.Random, letters: str = "abcdefghij") -> str:
    return "".join(rng.choice(letters) for _ in range(rng.randint(1, 6)))


def _text(rng: random.Random) -> str:
    return " ".join(_word(rng, "abcdeiou") for _ in range(rng.randint(0, 5)))


FAMILIES: tuple[Family, ...] = (
    Family("sum_multiples_of_{k}", "xs: list[int]) -> int", "returns the sum of the elements of xs that are "
           "divisible by {k}", "    return sum(x for x in xs if x % {k} == 0)",
           lambda r: {"k": r.randint(2, 9)}, lambda r: [_ints(r)]),
    Family("count_above_{t}", "xs: list[int]) -> int", "returns how many elements of xs are greater than {t}",
           "    return sum(1 for x in xs if x > {t})", lambda r: {"t": r.randint(-20, 30)}, lambda r: [_ints(r)]),
    Family("scale_{m}_shift_{a}", "xs: list[int]) -> list[int]", "returns a new list with each element x of xs "
           "replaced by {m} * x + ({a})", "    return [{m} * x + ({a}) for x in xs]",
           lambda r: {"m": r.randint(2, 12), "a": r.randint(-20, 20)}, lambda r: [_ints(r)]),
    Family("drop_multiples_of_{k}", "xs: list[int]) -> list[int]", "returns the elements of xs that are not "
           "divisible by {k}, in their order", "    return [x for x in xs if x % {k} != 0]",
           lambda r: {"k": r.randint(2, 9)}, lambda r: [_ints(r)]),
    Family("rotate_left_{n}", "xs: list[int]) -> list[int]", "returns xs rotated left by {n} positions (the "
           "first {n} elements moved to the end, wrapping around for short lists; an empty list stays empty)",
           "    if not xs:\n        return []\n    n = {n} % len(xs)\n    return xs[n:] + xs[:n]",
           lambda r: {"n": r.randint(1, 6)}, lambda r: [_ints(r)]),
    Family("running_sum_from_{s}", "xs: list[int]) -> list[int]", "returns the running sums of xs started at "
           "{s}: element i is {s} plus the sum of xs[0..i]", "    out, total = [], {s}\n    for x in xs:\n"
           "        total += x\n        out.append(total)\n    return out",
           lambda r: {"s": r.randint(-5, 5)}, lambda r: [_ints(r)]),
    Family("count_letter_{c}", "s: str) -> int", "returns how many times the letter '{c}' occurs in s",
           "    return s.count('{c}')", lambda r: {"c": r.choice("abcdefghij")}, lambda r: [_text(r)]),
    Family("shift_letters_{k}", "s: str) -> str", "returns s with every lowercase letter a-z shifted {k} places "
           "forward in the alphabet (wrapping from z to a) and every other character unchanged",
           "    return ''.join(chr((ord(ch) - 97 + {k}) % 26 + 97) if 'a' <= ch <= 'z' else ch for ch in s)",
           lambda r: {"k": r.randint(1, 25)}, lambda r: [_text(r)]),
    Family("replace_vowels_with_{c}", "s: str) -> str", "returns s with every vowel (a, e, i, o, u) replaced by "
           "'{c}'", "    return ''.join('{c}' if ch in 'aeiou' else ch for ch in s)",
           lambda r: {"c": r.choice("xyzqw")}, lambda r: [_text(r)]),
    Family("words_longer_than_{n}", "s: str) -> list[str]", "returns the words of s (split on spaces) that have "
           "more than {n} letters, in their order", "    return [w for w in s.split() if len(w) > {n}]",
           lambda r: {"n": r.randint(1, 4)}, lambda r: [_text(r)]),
    Family("quadratic_{a}_{b}_{c}", "x: int) -> int", "returns {a} * x * x + ({b}) * x + ({c})",
           "    return {a} * x * x + ({b}) * x + ({c})",
           lambda r: {"a": r.randint(1, 9), "b": r.randint(-20, 20), "c": r.randint(-20, 20)},
           lambda r: [r.randint(-30, 30)]),
    Family("digit_sum_times_{m}", "n: int) -> int", "returns {m} times the sum of the decimal digits of n (n >= 0)",
           "    return {m} * sum(int(d) for d in str(n))", lambda r: {"m": r.randint(1, 9)},
           lambda r: [r.randint(0, 10 ** r.randint(1, 6))]),
    Family("count_divisors_above_{d}", "n: int) -> int", "returns how many divisors of n (n >= 1) are greater "
           "than {d}", "    return sum(1 for k in range(1, n + 1) if n % k == 0 and k > {d})",
           lambda r: {"d": r.randint(1, 6)}, lambda r: [r.randint(1, 500)]),
    Family("fizz_{a}_buzz_{b}", "n: int) -> str", "returns 'FizzBuzz' if n is divisible by both {a} and {b}, "
           "'Fizz' if only by {a}, 'Buzz' if only by {b}, else str(n)",
           "    if n % {a} == 0 and n % {b} == 0:\n        return 'FizzBuzz'\n    if n % {a} == 0:\n"
           "        return 'Fizz'\n    if n % {b} == 0:\n        return 'Buzz'\n    return str(n)",
           lambda r: dict(zip("ab", r.sample(range(2, 10), 2))), lambda r: [r.randint(1, 200)]),
)


def reference_source(family: Family, params: dict[str, Any]) -> tuple[str, str]:
    """(function name, the reference implementation's source) of a family at `params`."""
    name = family.name.format(**params).replace("-", "minus_")
    body = family.source.format(**params)
    return name, f"def {name}({family.signature.format(**params)}:\n{body}\n"


def _reference(name: str, source: str) -> Callable[..., Any]:
    # The reference is tempax's own code (a template above), never model output: defining it here is safe.
    scope: dict[str, Any] = {}
    exec(compile(source, f"<reference {name}>", "exec"), scope)  # noqa: S102
    return scope[name]


def _draw(rng: random.Random) -> tuple[str, tuple[Family, dict[str, Any]]]:
    """The question a random family and its parameters make, and (family, parameters)."""
    family = rng.choice(FAMILIES)
    params = family.params(rng)
    name, _ = reference_source(family, params)
    signature = family.signature.format(**params)
    question = f"Write a Python function `{name}({signature}` that {family.description.format(**params)}."
    return question, (family, params)


def _problem(rng: random.Random, family: Family, params: dict[str, Any], cfg: CodeTaskConfig) -> dict[str, Any]:
    """The row of a drawn problem: its reference and `tests_per_problem` tests with the reference's answers."""
    name, source = reference_source(family, params)
    fn = _reference(name, source)
    tests = []
    for _ in range(cfg.tests_per_problem):
        args = family.args(rng)
        tests.append({"args": args, "expected": fn(*[list(a) if isinstance(a, list) else a for a in args])})
    return {"entry_point": name, "tests": tests, "answer": source, "target": f"```python\n{source}```"}


def generate_code_problems(
    n: int, *, split: str = "train", seed: int = 0, config: CodeTaskConfig = CodeTaskConfig(),
    system_prompt: str | None = CODE_SYSTEM_PROMPT,
) -> list[dict[str, Any]]:
    """`n` distinct problems of `split` (see the module docstring); the same (n, split, seed, config) always gives
    the same rows, and a smaller `n` a prefix of a larger one (each problem's tests come from a generator seeded
    by its question, so they do not depend on `n`)."""
    rng = random.Random(f"tempax-code:{seed}:{split}")
    drawn = distinct_problems(lambda: _draw(rng), n, split=split, what="code task",
                              heldout_percent=config.heldout_percent,
                              fix="ask for fewer (task.num_train_problems, eval.num_problems)")
    return [{"prompt_messages": build_prompt_messages(question, system_prompt), "question": question,
             **_problem(random.Random(f"tempax-code-tests:{seed}:{question}"), family, params, config)}
            for question, (family, params) in drawn]
