"""Answer correctness: is the content of the last `<answer>` tag equal to the reference answer?

Two checks, either of which accepts:

1. Numeric: when the answer content holds exactly one number (after dropping `$`, thousands commas and trailing
   units or periods: "$1,080.00 dollars." is 1080), it is compared exactly (as a `Decimal`) with the reference.
   This covers nearly every completion on integer-answer tasks and takes microseconds.
2. math-verify (`math_verify.parse` + `math_verify.verify`) for everything else (fractions, unevaluated
   expressions such as `70+2`, LaTeX). We deliberately do more than call it: its plain-text extraction picks the
   *last* number of "5 or 71", and it treats `5 = 71` as the right-hand side, so a hedging answer would be
   rewarded. We therefore accept a math-verify match only if the expression it parsed accounts for every number
   in the answer and is a plain numeric expression (not an equation, inequality, set or logical or/and).

Time: math-verify's own timeouts use `signal.alarm`, which raises in threads other than the main one, so we switch
them off. A short answer can still take sympy forever (`9^9^9^9` is a power tower it tries to evaluate), so every
check of model output runs under a deadline per completion in worker processes (`tempax.rewards.bounded`): the
reward is marked `per_completion` for `SafeReward`, and evaluation calls `check_completions`. A check past its
deadline scores 0 and is counted. Answers longer than `MAX_ANSWER_CHARS` are wrong outright.
"""

from __future__ import annotations

import logging
import re
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple, Sequence

from tempax.rewards.bounded import shared_pool
from tempax.rewards.combine import per_completion
from tempax.rewards.formatting import extract_answer, strict_format_ok

MAX_ANSWER_CHARS = 256
CHECK_TIMEOUT_S = 5.0  # default deadline of one completion's check in evaluation

# A number: optional minus, digits with optional thousands groups, optional decimals. The look-behind stops the
# minus of "5-3" (a subtraction) and digits inside a longer number from starting a new match.
_NUMBER = re.compile(r"(?<![\d.])-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|(?<![\d.])-?\.\d+")
# Relational or logical notation in math-verify's parsed string means it did not read one numeric value.
_NOT_A_VALUE = re.compile(r"[=<>;]|\\(?:l|g)eq?\b|\\neq?\b|\\lor|\\land|\\vee|\\wedge|\\pm|\\mp|\\\\|\bor\b|\band\b")


class _DropTimeoutWarning(logging.Filter):
    """math-verify warns once that its timeout is off; our per-completion deadline replaces it: the warning is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutWarning())


def _clean(text: str) -> str:
    """Unify spellings that change how numbers tokenise: unicode minus, LaTeX thousands `{,}`, dollar signs."""
    return text.replace("\u2212", "-").replace("{,}", ",").replace("\\$", "").replace("$", "")


def find_numbers(text: str) -> list[Decimal]:
    """All numbers in `text` as exact decimals, thousands commas removed ("1,080" -> 1080, "-3.50" -> -3.50)."""
    numbers = []
    for token in _NUMBER.findall(_clean(text)):
        try:
            numbers.append(Decimal(token.replace(",", "")))
        except InvalidOperation:
            continue
    return numbers


def reference_answer(answer: Any) -> str:
    """The reference as text: a GSM8K-style solution is cut after its last `####`; ints and floats become str."""
    text = str(answer)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    return text.strip()


def _math_verify_equal(prediction: str, reference: str) -> bool:
    """math-verify equality, accepted only when its parse covers the whole answer as one numeric value."""
    # Imported here: math-verify pulls in sympy, slow to import, which `import tempax.rewards` should not pay.
    import sympy
    from math_verify import parse, verify

    try:
        gold = parse(reference, parsing_timeout=None)
        parsed = parse(prediction, parsing_timeout=None)
        if len(parsed) < 2 or not verify(gold, parsed, timeout_seconds=None):
            return False
    except Exception:  # math-verify or sympy choking on odd text means "not verified", never a crash
        return False
    value, parsed_text = parsed[0], str(parsed[1])
    if not isinstance(value, sympy.Expr) or _NOT_A_VALUE.search(parsed_text):
        return False
    return sorted(find_numbers(parsed_text)) == sorted(find_numbers(prediction))


def answers_match(prediction: str | None, reference: Any) -> bool:
    """True when the extracted answer `prediction` equals `reference` (see the module docstring for the rules)."""
    if prediction is None:
        return False
    prediction = prediction.strip()
    if not prediction or len(prediction) > MAX_ANSWER_CHARS:
        return False
    gold_text = reference_answer(reference)
    predicted_numbers = find_numbers(prediction)
    gold_numbers = find_numbers(gold_text)
    if len(predicted_numbers) == 1 and len(gold_numbers) == 1:
        if predicted_numbers[0] == gold_numbers[0]:
            return True
        # Two different plain numbers cannot verify equal; skipping math-verify keeps wrong answers cheap.
        # A percent sign is the exception ("25%" vs 0.25), so that case still goes to math-verify.
        if "%" not in prediction:
            return False
    if not predicted_numbers:
        return False
    return _math_verify_equal(prediction, gold_text)


@per_completion
def answer_correctness_reward(
    prompts: Sequence[str], completions: Sequence[str], *, answer: Sequence[Any], **columns: Any
) -> list[float]:
    """Reward function: 1.0 when the last `<answer>` tag's content equals the `answer` column, else 0.0."""
    del prompts, columns
    if len(answer) != len(completions):
        raise ValueError(f"answer column has {len(answer)} entries for {len(completions)} completions")
    return [float(answers_match(extract_answer(c), ref)) for c, ref in zip(completions, answer)]


class CompletionCheck(NamedTuple):
    """One completion's verdicts: strict format, answer correct, and whether its check ran out of time (then both
    verdicts are False)."""

    format_ok: bool
    correct: bool
    timed_out: bool = False


def check_completion(completion: str, reference: Any) -> tuple[bool, bool]:
    """(strict format ok, answer correct) of one completion; unbounded in time (see `check_completions`)."""
    return strict_format_ok(completion), answers_match(extract_answer(completion), reference)


def check_completions(
    completions: Sequence[str], references: Sequence[Any], *, timeout_s: float | None = CHECK_TIMEOUT_S
) -> list[CompletionCheck]:
    """`check_completion` of each (completion, reference) pair, each with its own `timeout_s` deadline, in the
    worker processes of `tempax.rewards.bounded.shared_pool()` (works from any thread). A check that runs past its
    deadline, or fails, gives `CompletionCheck(False, False, timed_out)`."""
    if len(references) != len(completions):
        raise ValueError(f"{len(references)} references for {len(completions)} completions")
    calls = [((c, r), {}) for c, r in zip(completions, references)]
    out = []
    for o in shared_pool().map(check_completion, calls, timeout_s=timeout_s):
        out.append(CompletionCheck(*o.value) if o.ok else CompletionCheck(False, False, o.timed_out))
    return out
