"""The supervised data set-up (`tempax.data.sft.build_data`): what it says about a file it cannot train on."""

from __future__ import annotations

import json

import pytest

from tempax.data.sft import SFTDataConfig, build_data
from tempax.errors import ConfigError, DataError
from tests.kit.tokenizers import tiny_chat_tokenizer

HH_PAIR = {"chosen": "\n\nHuman: What is 2+2?\n\nAssistant: 4.", "rejected": "\n\nHuman: What is 2+2?\n\nAssistant: 5."}


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_data_has_no_default_path():
    """No default data set ships with the library: a config that names none says which key to set."""
    assert SFTDataConfig().path is None
    with pytest.raises(ConfigError, match=r"^data.path is required: .*\(data.path=\.\.\.\)$"):
        build_data(SFTDataConfig(), tiny_chat_tokenizer(), batch_size=2, seq_len=64)


def test_a_file_of_preference_pairs_points_to_dpo_not_to_the_threshold(tmp_path):
    """Every row an HH-RLHF preference pair: the message names `tempax dpo` / `tempax reward-model`, which train on
    pairs, instead of advising a larger data.max_bad_fraction (which would only leave no row to train on)."""
    path = _write(tmp_path / "pairs.jsonl", [HH_PAIR] * 6)
    with pytest.raises(DataError) as info:
        build_data(SFTDataConfig(path=path), tiny_chat_tokenizer(), batch_size=2, seq_len=64)
    message = str(info.value)
    assert "6 of 6 rows are malformed" in message and f"{path}:1: wrong_kind" in message
    assert message.endswith("Most rows are wrong_kind: a preference pair (chosen/rejected), which supervised "
                            "training does not read; train on pairs with `tempax dpo` or `tempax reward-model`.")
    assert "raise data.max_bad_fraction" not in message


def test_question_answer_rows_point_to_text_fields(tmp_path):
    path = _write(tmp_path / "qa.jsonl", [{"question": "What is 2+2?", "answer": "#### 4"}] * 4)
    with pytest.raises(DataError, match=r"Most rows are wrong_kind: .*set data.text_fields=\[question, answer\]\.$"):
        build_data(SFTDataConfig(path=path), tiny_chat_tokenizer(), batch_size=2, seq_len=64)
    data = build_data(SFTDataConfig(path=path, text_fields=("question", "answer")), tiny_chat_tokenizer(),
                      batch_size=2, seq_len=64)
    assert data.report.kept == 4
