"""The `<reasoning>` / `<answer>` output format: a strict check, a shaped reward and answer extraction.

The format a policy is asked to produce (and that the SFT warm-start targets) is exactly

    <reasoning>
    ...working...
    </reasoning>
    <answer>
    ...final answer...
    </answer>

The full reward needs exactly this form (`strict_format_ok`, which says why); partial forms earn capped partial
credit (`format_score`). These are pure functions of text; nothing is executed.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from tempax.rewards.combine import per_completion

REASONING_OPEN = "<reasoning>"
REASONING_CLOSE = "</reasoning>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
TAGS = (REASONING_OPEN, REASONING_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

# Partial credit per tag; 4 * 0.2 = 0.8 < 1.0 keeps every non-strict completion strictly below the strict form.
TAG_CREDIT = 0.2
STRICT_CREDIT = 1.0

# Any spelling of the two tag names (case, inner spaces), used to count tags so variants cannot smuggle in nesting.
_ANY_TAG = re.compile(r"<\s*/?\s*(reasoning|answer)\s*>", re.IGNORECASE)
_STRICT = re.compile(
    r"\A\s*<reasoning>\n(?P<reasoning>.*?)\n</reasoning>\n<answer>\n(?P<answer>.*?)\n</answer>\s*\Z",
    re.DOTALL,
)
# An <answer> ... </answer> pair with no other answer tag (any spelling) in between.
_ANSWER_SPAN = re.compile(r"<answer>((?:(?!<\s*/?\s*answer\s*>).)*?)</answer>", re.DOTALL | re.IGNORECASE)

# Placeholder contents a model could copy from an instruction: bracketed names like `<number>` or `[answer]`,
# and a few words that mean "put something here". Content made only of dots, dashes and similar marks (no
# letter or digit) is also a placeholder.
_PLACEHOLDER_WORDS = frozenset(
    {
        "answer", "your answer", "your answer here", "final answer", "the answer", "the final answer",
        "number", "the number", "final number", "the final number", "reasoning", "your reasoning",
        "working", "your working", "steps", "step by step", "placeholder", "todo", "tbd", "n/a", "none",
        "insert answer", "insert answer here", "answer here", "reasoning here", "etc",
    }
)
_BRACKETED = re.compile(r"\A[<\[{(][^<>\[\]{}()]*[>\]})]\Z")


def _normalise_newlines(text: str) -> str:
    return text.replace("\r\n", "\n")


def is_placeholder(content: str) -> bool:
    """True when `content` is empty or a stand-in (`...`, `…`, `<number>`, `[answer]`, `your answer here`)."""
    stripped = content.strip()
    if not stripped:
        return True
    if not any(ch.isalnum() for ch in stripped):
        return True
    if _BRACKETED.match(stripped):
        return True
    return stripped.strip(" .:!*_`'\"").lower() in _PLACEHOLDER_WORDS


def strict_format_ok(text: str) -> bool:
    """True only for the exact `<reasoning>\\n..\\n</reasoning>\\n<answer>\\n..\\n</answer>` form.

    Surrounding whitespace is allowed; each tag must occur exactly once (no nesting, no second block) and both
    contents must be non-empty and not placeholders.

    Why strict: in a measured GRPO run a loose, search-anywhere format check was gamed by copying the system
    prompt's placeholder text and by nesting tags (`docs/measurements/demo-calibration.md`). So the full reward
    needs the whole completion (modulo surrounding whitespace) to be this form: anchored at both ends, each of the
    four tags exactly once (counted case-insensitively, so `<Answer>` cannot hide a second tag), in order, separated
    by single newlines, with non-empty contents that are not placeholders such as `...`.
    """
    text = _normalise_newlines(text)
    if len(_ANY_TAG.findall(text)) != len(TAGS):
        return False
    match = _STRICT.match(text)
    if match is None:
        return False
    return not is_placeholder(match.group("reasoning")) and not is_placeholder(match.group("answer"))


def tags_in_order(text: str) -> int:
    """How many of the four tags occur exactly once and in the right order relative to the other such tags.

    A tag occurring zero or several times earns nothing; a unique tag earns credit only when every unique tag
    before it in the canonical order appears earlier in the text and every later one appears later.
    """
    text = _normalise_newlines(text)
    positions: dict[int, int] = {}
    for index, tag in enumerate(TAGS):
        # Count case-insensitive variants so `<ANSWER>` cannot make a duplicated tag look unique.
        name = tag.strip("</>")
        closing = tag.startswith("</")
        hits = [m for m in _ANY_TAG.finditer(text) if m.group(1).lower() == name and ("/" in m.group(0)) == closing]
        if len(hits) == 1:
            positions[index] = hits[0].start()
    credited = 0
    for index, position in positions.items():
        before_ok = all(positions[other] < position for other in positions if other < index)
        after_ok = all(positions[other] > position for other in positions if other > index)
        credited += int(before_ok and after_ok)
    return credited


def format_score(text: str) -> float:
    """`STRICT_CREDIT` for the strict form, else `TAG_CREDIT` per tag present once and in order (at most 0.8).

    Partial credit (`TAG_CREDIT` per tag present exactly once and in order) gives a gradient to a model that is far from
    the format, but is capped below the strict score so that partial forms (for instance tags copied from a one-line
    instruction) can never tie with the real thing.
    """
    if strict_format_ok(text):
        return STRICT_CREDIT
    # Rounded so 3 tags score 0.6, not 0.6000000000000001, in logs and tests.
    return round(TAG_CREDIT * tags_in_order(text), 6)


@per_completion
def format_reward(prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
    """Reward function: `format_score` of each completion (prompts and dataset columns are ignored)."""
    del prompts, columns
    return [format_score(completion) for completion in completions]


def extract_answer(text: str) -> str | None:
    """Stripped content of the last well-formed `<answer>...</answer>` pair, or None when there is none.

    Well-formed means no other answer tag sits between the pair, so `<answer>1<answer>2</answer>` gives "2".
    """
    spans = _ANSWER_SPAN.findall(_normalise_newlines(text))
    if not spans:
        return None
    return spans[-1].strip()
