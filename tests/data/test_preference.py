"""Preference pairs: parsing (explicit, implicit, HH-RLHF), masks, length policy, stacked batches, real files."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest

from tempax.data.packing import BATCH_KEYS
from tempax.data.preference import (
    PreferenceOptions,
    collate_pairs,
    load_preference_pairs,
    parse_hh_dialogue,
    parse_preference_row,
    preference_loader,
    tokenize_preference_rows,
)
from tempax.errors import ConfigError, DataError
from tests.kit.tokenizers import tiny_chat_tokenizer

HH_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "hh-rlhf")

DIALOGUE = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Bye\n\nAssistant:"


@pytest.fixture(scope="module")
def tok():
    return tiny_chat_tokenizer()


def masked_runs(tok, tokens, mask) -> list[str]:
    edges = np.flatnonzero(np.diff(np.r_[0, np.asarray(mask, dtype=int), 0]))
    return [tok.decode(tokens[a:b], skip_special_tokens=False) for a, b in zip(edges[::2], edges[1::2])]


def prompt_len(example) -> int:
    return int(np.flatnonzero(example.loss_mask)[0])


def test_parse_hh_dialogue():
    assert parse_hh_dialogue(DIALOGUE + " See you ") == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "See you"},
    ]


def test_hh_pair_prompt_is_everything_before_the_last_assistant_turn():
    msgs = parse_preference_row({"chosen": DIALOGUE + " See you", "rejected": DIALOGUE + " Go away"})
    assert [m["content"] for m in msgs.prompt] == ["Hi", "Hello!", "Bye"]
    assert msgs.chosen == [{"role": "assistant", "content": "See you"}]
    assert msgs.rejected == [{"role": "assistant", "content": "Go away"}]


@pytest.mark.parametrize(
    "row",
    [
        {"chosen": DIALOGUE + " See you", "rejected": DIALOGUE + " Go away"},
        {"prompt": "Bye", "chosen": "See you", "rejected": "Go away"},
        {
            "prompt": [{"role": "user", "content": "Bye"}],
            "chosen": [{"role": "assistant", "content": "See you"}],
            "rejected": [{"role": "assistant", "content": "Go away"}],
        },
        {
            "chosen": [{"role": "user", "content": "Bye"}, {"role": "assistant", "content": "See you"}],
            "rejected": [{"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Go away"}],
        },
    ],
    ids=["hh", "explicit-text", "explicit-messages", "implicit-messages"],
)
def test_each_side_trains_only_its_response_and_shares_the_prompt(tok, row):
    (pair,), rep = tokenize_preference_rows([row], tok)
    assert rep.kept == 1
    assert masked_runs(tok, pair.chosen.tokens, pair.chosen.loss_mask) == ["See you<|im_end|>"]
    assert masked_runs(tok, pair.rejected.tokens, pair.rejected.loss_mask) == ["Go away<|im_end|>"]
    p = prompt_len(pair.chosen)
    assert p == prompt_len(pair.rejected)
    assert np.array_equal(pair.chosen.tokens[:p], pair.rejected.tokens[:p])
    assert tok.decode(pair.chosen.tokens[:p], skip_special_tokens=False).endswith("<|im_start|>assistant\n")


def test_bad_pairs_are_skipped_identical_ones_dropped(tok):
    rows = [
        {"chosen": DIALOGUE + " A", "rejected": DIALOGUE + " B"},  # good
        {"chosen": DIALOGUE + " A"},  # missing_field
        {"chosen": DIALOGUE + " A", "rejected": DIALOGUE},  # empty_response
        {"chosen": "\n\nHuman: only a question", "rejected": "\n\nHuman: only a question"},  # no_assistant_turn
        {"chosen": DIALOGUE + " A", "rejected": DIALOGUE + " A"},  # identical -> dropped
        {"prompt": "q", "chosen": 3, "rejected": "b"},  # wrong_type
        {"prompt": "q", "chosen": "", "rejected": "b"},  # empty_response
        {"chosen": "preamble\n\nHuman: x\n\nAssistant: y", "rejected": "\n\nHuman: x\n\nAssistant: z"},  # wrong_format
    ]
    pairs, rep = tokenize_preference_rows(rows, tok, PreferenceOptions(max_bad_fraction=1.0))
    assert (rep.total, rep.kept, len(pairs)) == (8, 1, 1)
    assert rep.skipped == {
        "missing_field": 1,
        "empty_response": 2,
        "no_assistant_turn": 1,
        "wrong_type": 1,
        "wrong_format": 1,
    }
    assert rep.dropped == {"identical": 1}
    assert rep.bad_rows[0][0] == "<memory>:2"
    # 6 of 8 malformed is over the default 10%.
    with pytest.raises(DataError, match="6 of 8 rows are malformed"):
        tokenize_preference_rows(rows, tok)


def long_pair_row():
    prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * 4)
    return {"prompt": prompt, "chosen": "Paris.", "rejected": "The capital of France is Paris."}


def test_overlong_pairs_lose_the_same_prompt_tokens_from_the_left(tok):
    """Cutting k = max(Lc, Lr) - max_length tokens from the left of both sides keeps the prompts equal."""
    (full,), _ = tokenize_preference_rows([long_pair_row()], tok)
    lc, lr = len(full.chosen), len(full.rejected)
    k = 5
    (cut,), rep = tokenize_preference_rows([long_pair_row()], tok, PreferenceOptions(max_length=max(lc, lr) - k))
    assert rep.truncated == {"prompt_left": 1}
    assert np.array_equal(cut.chosen.tokens, full.chosen.tokens[k:])
    assert np.array_equal(cut.rejected.tokens, full.rejected.tokens[k:])
    assert np.array_equal(cut.rejected.loss_mask, full.rejected.loss_mask[k:])


def test_responses_are_cut_on_the_right_when_the_prompt_is_not_enough(tok):
    """max_length 4: the prompt keeps 1 token, then each side keeps its first 3 response tokens."""
    (full,), _ = tokenize_preference_rows([long_pair_row()], tok)
    (cut,), rep = tokenize_preference_rows([long_pair_row()], tok, PreferenceOptions(max_length=4))
    assert rep.truncated == {"response_right": 1}
    p = prompt_len(full.chosen)
    assert np.array_equal(cut.chosen.tokens, full.chosen.tokens[p - 1 : p + 3])
    assert np.array_equal(cut.rejected.tokens, full.rejected.tokens[p - 1 : p + 3])
    assert cut.chosen.loss_mask.tolist() == [False, True, True, True]


def test_drop_policy_counts_overlong_pairs(tok):
    with pytest.raises(DataError, match="no usable rows"):
        tokenize_preference_rows([long_pair_row()], tok, PreferenceOptions(max_length=8, overlong="drop"))
    _, rep = tokenize_preference_rows(
        [long_pair_row(), {"prompt": "q", "chosen": "a", "rejected": "b"}],
        tok,
        PreferenceOptions(max_length=20, overlong="drop"),
    )
    assert rep.dropped == {"too_long": 1} and rep.kept == 1
    with pytest.raises(ConfigError):
        PreferenceOptions(overlong="split")


def test_stacked_batch_layout(tok):
    """2 pairs in a batch of 3 -> [6, T]: rows 0-1 chosen, row 2 empty, rows 3-4 rejected, row 5 empty."""
    rows = [{"prompt": "q", "chosen": "a", "rejected": "b"}, {"prompt": "r", "chosen": "c", "rejected": "d"}]
    pairs, _ = tokenize_preference_rows(rows, tok)
    b = collate_pairs(pairs, seq_len=32, pad_id=tok.pad_id, batch_size=3)
    assert set(b) == set(BATCH_KEYS) and all(v.shape == (6, 32) and v.dtype == np.int32 for v in b.values())
    for i, p in enumerate(pairs):
        assert np.array_equal(b["tokens"][i, : len(p.chosen)], p.chosen.tokens)
        assert np.array_equal(b["tokens"][3 + i, : len(p.rejected)], p.rejected.tokens)
    assert b["segment_ids"].max(axis=1).tolist() == [1, 1, 0, 1, 1, 0]
    # loss_mask is the example mask shifted to next-token targets.
    assert b["loss_mask"][0, : len(pairs[0].chosen) - 1].tolist() == pairs[0].chosen.loss_mask[1:].astype(int).tolist()


def test_preference_loader_resumes_exactly(tok):
    rows = [{"prompt": f"question {i}", "chosen": f"yes {i}", "rejected": f"no {i}"} for i in range(11)]
    pairs, _ = tokenize_preference_rows(rows, tok)

    def make():
        return preference_loader(pairs, batch_size=2, seq_len=32, pad_id=tok.pad_id, seed=5)

    uninterrupted = make()
    reference = [next(uninterrupted) for _ in range(9)]
    first = make()
    for _ in range(5):
        next(first)
    resumed = make()
    resumed.restore(json.loads(json.dumps(first.state())))
    for want in reference[5:]:
        got = next(resumed)
        assert all(np.array_equal(got[k], want[k]) for k in BATCH_KEYS)
        assert got["tokens"].shape == (4, 32)


@pytest.fixture(scope="module")
def hh_train(tok):
    return load_preference_pairs(os.path.join(HH_DIR, "train.jsonl.gz"), tok)


def test_real_hh_train_counts(hh_train):
    """1807 pairs: 2 have chosen == rejected (dropped), 3 have an empty final reply on one side (skipped), and
    7 have replies containing extra turn markers (kept, noted) -> 1807 - 2 - 3 = 1802 kept."""
    pairs, rep = hh_train
    assert (rep.total, rep.kept, len(pairs)) == (1807, 1802, 1802)
    assert rep.dropped == {"identical": 2}
    assert rep.skipped == {"empty_response": 3}
    assert rep.notes == {"multi_turn_response": 7}


def test_real_hh_pairs_share_prompt_tokens_and_train_the_final_reply(tok, hh_train):
    pairs, _ = hh_train
    raw = [json.loads(line) for line in gzip.open(os.path.join(HH_DIR, "train.jsonl.gz"), "rt", encoding="utf-8")]
    by_line = {i + 1: r for i, r in enumerate(raw)}
    for pair in pairs:
        p = prompt_len(pair.chosen)
        assert p == prompt_len(pair.rejected) and np.array_equal(pair.chosen.tokens[:p], pair.rejected.tokens[:p])
    for pair in pairs[::50]:
        row = by_line[int(pair.source.rsplit(":", 1)[1])]
        reply = row["chosen"].rsplit("\n\nAssistant:", 1)[1].strip()
        assert masked_runs(tok, pair.chosen.tokens, pair.chosen.loss_mask)[-1] == reply + "<|im_end|>"


def test_real_hh_test_split_with_truncation(tok):
    pairs, rep = load_preference_pairs(HH_DIR, tok, PreferenceOptions(max_length=512), split="test")
    assert (rep.total, rep.kept) == (500, 499)
    where = os.path.join(HH_DIR, "test.jsonl.gz") + ":121"
    assert rep.bad_rows == [(where, "empty_response", "rejected has an empty reply")]
    assert rep.num_truncated > 0 and max(max(len(p.chosen), len(p.rejected)) for p in pairs) <= 512
