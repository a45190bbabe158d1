"""Unpaired feedback rows for KTO: parsing (text and chat), labels, pairs split into rows, mismatched partners,
bad rows counted, the shared length policy, and the real HH-RLHF file converted."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tempax.data.preference import PreferenceOptions
from tempax.data.unpaired import mismatched_partners, parse_unpaired_row, split_preference_row, tokenize_unpaired_rows
from tempax.data.sources import read_rows
from tempax.errors import DataError
from tests.kit.tokenizers import tiny_chat_tokenizer

HH_TRAIN = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "hh-rlhf", "train.jsonl.gz")

ROWS = [
    {"prompt": "Name a fruit.", "completion": "An apple.", "label": True},
    {"prompt": [{"role": "user", "content": "Name a colour."}],
     "completion": [{"role": "assistant", "content": "Blue."}], "label": False},
    {"prompt": "Name a dog.", "completion": "Rex.", "label": True},
]


@pytest.fixture(scope="module")
def tok():
    return tiny_chat_tokenizer()


def trained_text(tok, example) -> str:
    tokens, mask = np.asarray(example.tokens), np.asarray(example.loss_mask, bool)
    return tok.decode(tokens[mask], skip_special_tokens=True).strip()


def test_text_and_chat_rows_parse_to_messages_and_labels():
    text, chat = parse_unpaired_row(ROWS[0]), parse_unpaired_row(ROWS[1])
    assert text.prompt == [{"role": "user", "content": "Name a fruit."}] and text.desirable is True
    assert text.completion == [{"role": "assistant", "content": "An apple."}]
    assert chat.prompt == ROWS[1]["prompt"] and chat.completion == ROWS[1]["completion"] and chat.desirable is False


def test_preference_pair_splits_into_a_desirable_and_an_undesirable_row():
    rows = split_preference_row({"prompt": "Hi?", "chosen": "Hello.", "rejected": "Go away."})
    assert [(r.completion[0]["content"], r.desirable) for r in rows] == [("Hello.", True), ("Go away.", False)]
    assert rows[0].prompt == rows[1].prompt == [{"role": "user", "content": "Hi?"}]
    assert split_preference_row({"prompt": "Hi?", "chosen": "Same.", "rejected": "Same."}) == []


def test_mismatched_partners_never_share_the_prompt():
    """Prompts a, a, b: rows 0 and 1 can only take row 2; row 2 takes 0 or 1. The pairing is seeded."""
    for seed in range(5):
        partners = mismatched_partners(["a", "a", "b"], seed=seed)
        assert partners[0] == 2 and partners[1] == 2 and partners[2] in (0, 1)
    many = [str(i // 2) for i in range(20)]  # ten converted pairs: two rows per prompt
    p = mismatched_partners(many, seed=3)
    assert all(many[j] != many[i] for i, j in enumerate(p)) and p == mismatched_partners(many, seed=3)
    with pytest.raises(DataError, match="distinct prompt"):
        mismatched_partners(["a", "a"], seed=0)


def test_examples_hold_their_completion_and_another_rows_completion(tok):
    examples, report = tokenize_unpaired_rows(ROWS, tok, PreferenceOptions(max_length=64), seed=0)
    assert report.kept == 3 and len(examples) == 3
    completions = {"An apple.", "Blue.", "Rex."}
    for ex, row in zip(examples, ROWS):
        own = trained_text(tok, ex.completion)
        other = trained_text(tok, ex.mismatched)
        assert own in completions and other in completions and own != other
        assert ex.desirable is row["label"]
        n = int(np.flatnonzero(ex.completion.loss_mask)[0])  # both sides start with the same prompt tokens
        assert list(ex.completion.tokens[:n]) == list(ex.mismatched.tokens[:n])


def test_bad_rows_are_skipped_with_reasons(tok):
    bad = [
        {"prompt": "Hi", "completion": "Yo"},                                  # no label
        {"prompt": "Hi", "completion": "Yo", "label": "yes"},                  # label not a bool
        {"prompt": "Hi", "completion": "  ", "label": True},                   # empty completion
        {"prompt": "Hi", "chosen": "Yo", "rejected": "No"},                    # a pair without convert_pairs
    ]
    examples, report = tokenize_unpaired_rows(ROWS + bad, tok, PreferenceOptions(max_length=64, max_bad_fraction=0.6))
    assert len(examples) == 3
    assert report.skipped == {"missing_field": 2, "wrong_type": 1, "empty_response": 1}
    assert any("convert_pairs" in detail for _, _, detail in report.bad_rows)
    with pytest.raises(DataError, match="malformed"):
        tokenize_unpaired_rows(ROWS + bad, tok, PreferenceOptions(max_length=64))


def test_over_long_rows_lose_prompt_tokens_from_the_left_on_both_sides(tok):
    rows = [dict(ROWS[0], prompt="word " * 40 + "Name a fruit."), ROWS[1], ROWS[2]]
    examples, report = tokenize_unpaired_rows(rows, tok, PreferenceOptions(max_length=40))
    assert report.truncated["prompt_left"] >= 1
    assert all(max(len(ex.completion), len(ex.mismatched)) <= 40 for ex in examples)


def test_hh_rlhf_pairs_convert_into_balanced_unpaired_rows(tok):
    rows = read_rows(HH_TRAIN)[:40]
    examples, report = tokenize_unpaired_rows(rows, tok, PreferenceOptions(max_length=256), convert_pairs=True)
    assert report.kept >= 38 and len(examples) == 2 * report.kept
    assert sum(ex.desirable for ex in examples) == report.kept
