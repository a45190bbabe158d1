"""tempax.rewards.formatting: the strict answer format, partial credit per tag, placeholders, answer extraction."""

from __future__ import annotations

import pytest

from tempax.rewards.formatting import (
    extract_answer,
    format_reward,
    format_score,
    is_placeholder,
    strict_format_ok,
    tags_in_order,
)
from tests.rewards.texts import GOOD, completion


# ---------------------------------------------------------------- strict format


@pytest.mark.parametrize(
    "text",
    [
        GOOD,
        "  \n" + GOOD + "\n\n",  # surrounding whitespace is allowed
        GOOD.replace("\n", "\r\n"),  # Windows newlines are the same text
        completion(reasoning="Step 1: 2 + 2 = 4\nStep 2: 4 * 3 = 12", answer="12"),  # multi-line reasoning
    ],
)
def test_strict_format_accepts(text: str) -> None:
    assert strict_format_ok(text)
    assert format_score(text) == 1.0


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "empty"),
        ("71", "no tags"),
        ("Sure! " + GOOD, "text before the block"),
        (GOOD + " Hope that helps", "text after the block"),
        ("<reasoning>23 + 48 = 71</reasoning><answer>71</answer>", "tags not on their own lines"),
        ("<reasoning>\n23 + 48 = 71\n</reasoning>\n\n<answer>\n71\n</answer>", "blank line between blocks"),
        ("<answer>\n71\n</answer>\n<reasoning>\n23 + 48 = 71\n</reasoning>", "blocks out of order"),
        (GOOD + "\n<answer>\n71\n</answer>", "duplicated answer block"),
        (completion(reasoning="x <answer>\n5\n</answer> y"), "answer nested in reasoning"),
        (completion(reasoning="x <ANSWER> y"), "case variant of a tag nested in reasoning"),
        (completion(answer="<reasoning>\n71\n</reasoning>"), "reasoning nested in answer"),
        (completion(answer="..."), "placeholder answer"),
        (completion(answer="\u2026"), "unicode ellipsis answer"),
        (completion(answer="<number>"), "bracketed placeholder answer"),
        (completion(answer="your answer here"), "placeholder words"),
        (completion(reasoning="..."), "placeholder reasoning"),
        (completion(answer="   "), "blank answer"),
        ("<reasoning>\n\n</reasoning>\n<answer>\n71\n</answer>", "empty reasoning"),
    ],
)
def test_strict_format_rejects(text: str, reason: str) -> None:
    assert not strict_format_ok(text), reason
    assert format_score(text) < 1.0, reason


def test_partial_credit_per_tag() -> None:
    """0.2 per tag that occurs exactly once and in order; never the full 1.0 without the strict form.

    - all four tags once, in order, but on one line: 4 * 0.2 = 0.8
    - only `<answer>` and `</answer>`: 2 * 0.2 = 0.4
    - answer block duplicated: both answer tags occur twice -> only the 2 reasoning tags count: 0.4
    - answer block before reasoning block: `<answer>` precedes `</reasoning>` etc.; no tag is in order: 0.0
    - placeholder answer in the strict layout: tags are fine (0.8) but the content is not
    """
    assert format_score("<reasoning>a</reasoning><answer>1</answer>") == pytest.approx(0.8)
    assert format_score("The answer: <answer>\n71\n</answer>") == pytest.approx(0.4)
    assert format_score(GOOD + "\n<answer>\n71\n</answer>") == pytest.approx(0.4)
    assert format_score("<answer>\n71\n</answer>\n<reasoning>\nx\n</reasoning>") == 0.0
    assert format_score(completion(answer="...")) == pytest.approx(0.8)
    assert format_score("no tags at all") == 0.0


def test_nested_tags_get_little_credit() -> None:
    """`<reasoning><answer>5</answer></reasoning>`: `</reasoning>` comes after both answer tags, so only
    `<reasoning>` is in order relative to the others: 1 tag -> 0.2."""
    text = "<reasoning>\n<answer>\n5\n</answer>\n</reasoning>"
    assert tags_in_order(text) == 1
    assert format_score(text) == pytest.approx(0.2)


def test_format_reward_is_a_reward_function() -> None:
    rewards = format_reward(["p1", "p2", "p3"], [GOOD, "nothing", completion(answer="...")], answer=["1", "2", "3"])
    assert rewards == [1.0, 0.0, pytest.approx(0.8)]


@pytest.mark.parametrize(
    "content", ["...", "\u2026", "", "  ", "<number>", "[answer]", "{answer}", "Answer", "N/A", "---"]
)
def test_is_placeholder(content: str) -> None:
    assert is_placeholder(content)


@pytest.mark.parametrize("content", ["71", "-3", "x = 5", "3.5 apples", "seventy-one"])
def test_is_not_placeholder(content: str) -> None:
    assert not is_placeholder(content)


# ---------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        (GOOD, "71"),
        ("<answer> 5 </answer> and later <answer>\n7\n</answer>", "7"),  # the last one wins
        ("<answer>1<answer>2</answer>", "2"),  # the unclosed first tag is not well-formed
        ("<answer>\n12\n", None),  # never closed
        ("</answer> 3 <answer>", None),  # wrong order
        ("no tags", None),
        ("<answer></answer>", ""),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected
