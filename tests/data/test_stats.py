"""`tempax data stats` and the dataset profile behind `tempax recommend`."""

from __future__ import annotations

import json

import pytest

from tempax.data.formats import FormatOptions, tokenize_rows
from tempax.data.sources import as_rows
from tempax.data.stats import dataset_stats, default_split, length_histogram, profile_dataset
from tempax.errors import DataError
from tests.kit.tokenizers import tiny_chat_tokenizer


def _write(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


CHATS = [
    {"messages": [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi, how are you?"}]},
    {"messages": [{"role": "user", "content": "bake bread?"}, {"role": "assistant", "content": "mix flour and water"},
                  {"role": "user", "content": "then?"}, {"role": "assistant", "content": "let it rise."}]},
    {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The quick brown fox " * 8}]},
]


def test_stats_match_the_training_tokenisation(tmp_path):
    """Tokens and loss tokens are what `tokenize_rows` gives (no length limit); turns 2, 4, 2; the 3rd row is the
    only one longer than 50 tokens (28, 43, 60 tokens)."""
    tok = tiny_chat_tokenizer()
    path = _write(tmp_path / "chat.jsonl", CHATS + [{"foo": 1}])
    stats = dataset_stats(path, tok, seq_len=50)
    examples, _ = tokenize_rows(as_rows(CHATS), tok, FormatOptions())
    lengths = [len(e) for e in examples]
    assert stats.kind == "messages" and stats.rows == 4 and stats.usable_rows == 3
    assert stats.tokens == sum(lengths) and stats.loss_tokens == sum(e.num_targets for e in examples)
    assert stats.lengths.tolist() == lengths
    assert stats.share_longer(50) == pytest.approx(sum(n > 50 for n in lengths) / 3)
    assert sum(n > 50 for n in lengths) == 1
    assert stats.turns == {2: 2, 4: 1} and stats.skipped == {"unknown_format": 1}
    assert stats.bad_rows == [(f"{path}:4", "unknown_format", "keys ['foo']")]
    assert 0 < stats.loss_token_share < 1
    d = stats.to_dict()
    assert d["share_longer_than_50"] == round(1 / 3, 4) and d["length"]["max"] == max(lengths)
    assert "turns per dialogue" in stats.table()
    png = length_histogram(stats, str(tmp_path / "h.png"))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_stats_of_preference_and_qa_rows(tmp_path):
    """A preference row counts both sides; a question/answer row is counted as prompt + completion."""
    tok = tiny_chat_tokenizer()
    pref = _write(tmp_path / "pref.jsonl", [{"chosen": "\n\nHuman: hi\n\nAssistant: hello friend",
                                             "rejected": "\n\nHuman: hi\n\nAssistant: go away"}])
    s = dataset_stats(pref, tok)
    assert s.kind == "preference" and s.lengths.size == 2 and s.turns == {2: 1}
    qa = _write(tmp_path / "qa.jsonl", [{"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}])
    s = dataset_stats(qa, tok)
    pc, _ = tokenize_rows(as_rows([{"prompt": "What is 2 + 3?", "completion": "2 + 3 = 5\n#### 5"}]), tok)
    assert s.kind == "qa" and s.tokens == len(pc[0]) and s.loss_tokens == pc[0].num_targets


def test_stats_bad_input(tmp_path):
    tok = tiny_chat_tokenizer()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="empty.jsonl holds no rows"):
        dataset_stats(str(empty), tok)
    mixed = _write(tmp_path / "mixed.jsonl", CHATS[:1] + [{"chosen": "yes", "rejected": "no"}])
    with pytest.raises(DataError, match=r"mixed.jsonl:2: a preference row in a file of messages rows"):
        dataset_stats(mixed, tok)
    with pytest.raises(DataError, match=r"mixed.jsonl:2: a preference row"):
        profile_dataset(mixed, tok, sample_rows=1)  # the sample may miss row 2; the counting pass does not
    junk = _write(tmp_path / "junk.jsonl", [{"foo": 1}])
    with pytest.raises(DataError, match="none of its 1 rows could be tokenised"):
        dataset_stats(junk, tok)


def test_profile_counts_rows_and_checkable_answers(tmp_path):
    folder = tmp_path / "math"
    folder.mkdir()
    _write(folder / "train.jsonl", [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}
                                    for i in range(9)] + [{"question": "Name a colour.", "answer": "Blue."}])
    _write(folder / "test.jsonl", [{"question": "What is 1 + 1?", "answer": "#### 2"}])
    assert default_split(str(folder)) == "train" and default_split(str(folder / "train.jsonl")) is None
    p = profile_dataset(str(folder), tiny_chat_tokenizer(), sample_rows=4)
    assert p.kind == "qa" and p.rows == 10 and p.sample_rows == 4 and p.split == "train"
    assert p.checkable_fraction == pytest.approx(0.9)
    assert p.total_tokens == int(p.tokens_per_row * 10) and p.p95_tokens > 0
