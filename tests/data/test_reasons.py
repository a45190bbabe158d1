"""One vocabulary of bad-row reasons: `tempax data stats`, `tempax data clean` and training name the same row with the
same reason and `file:line`, and count the same rows."""

from __future__ import annotations

import json

import pytest

from tempax.data import reasons
from tempax.data.clean import CleanConfig, clean_file
from tempax.data.report import DataReport
from tempax.data.sft import SFTDataConfig, build_data
from tempax.data.stats import dataset_stats
from tests.kit.tokenizers import tiny_chat_tokenizer

GOOD = {"messages": [{"role": "user", "content": "What is the capital of France?"},
                     {"role": "assistant", "content": "Paris is the capital of France, on the Seine."}]}


def _mixed_file(tmp_path) -> tuple[str, dict[int, str]]:
    """30 good chats with four bad lines among them and a blank line (not a row): 34 rows. Returns the path and
    the bad lines' reasons by line number."""
    lines = [json.dumps({"messages": [GOOD["messages"][0], {"role": "assistant", "content": f"Answer number {i}: "
                                                            "Paris is the capital of France."}]})
             for i in range(30)]
    bad = {3: '{"messages": [oops', 8: '["a list, not an object"]', 15: '{"prompt_only": "hi"}',
           21: json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]})}
    for line in sorted(bad):
        lines.insert(line - 1, bad[line])
    lines.insert(25, "")  # line 26 is blank: no row, in any count
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    expected = {3: "invalid_json", 8: "not_an_object", 15: "unknown_format", 21: "empty_content"}
    return str(path), {line if line < 26 else line + 1: reason for line, reason in expected.items()}


def test_stats_clean_and_training_name_the_same_rows_the_same_way(tmp_path):
    """The report: stats said "34 rows" and `malformed`, training "4 of 33 rows" and invalid_json/unknown_format/
    empty_content, clean `malformed`/`empty_turn`. Now: 34 rows each, each bad line under one name everywhere."""
    path, expected = _mixed_file(tmp_path)
    want = {f"{path}:{line}": reason for line, reason in expected.items()}
    tokenizer = tiny_chat_tokenizer()

    stats = dataset_stats(path, tokenizer)
    assert stats.rows == 34 and stats.usable_rows == 30
    assert {where: reason for where, reason, _ in stats.bad_rows} == want

    # Training holds 10% out for evaluation: its report still covers the file's 34 rows.
    data = build_data(SFTDataConfig(path=path, eval_fraction=0.1, max_bad_fraction=0.2), tokenizer, batch_size=2,
                      seq_len=128)
    assert (data.report.total, data.report.kept, data.report.num_skipped) == (34, 30, 4)
    assert {where: reason for where, reason, _ in data.report.bad_rows} == want
    assert dict(data.report.skipped) == dict(stats.skipped)

    # Cleaning skips what cannot be read and drops the empty reply by its filter: the same four names.
    report = clean_file(path, None, CleanConfig(max_bad_fraction=0.2))
    assert report.total == 34 and report.kept == 30  # the 30 answers differ, so none is a duplicate
    named = {ex["where"]: reason for reason, items in report.examples.items() for ex in items}
    assert named == want
    assert {**report.skipped, **report.dropped} == dict(stats.skipped)


def test_every_reason_a_report_counts_is_defined_once():
    report = DataReport()
    report.skip("f.jsonl:1", "invalid_json")
    report.drop("identical")
    report.truncate("split")
    report.note("multi_turn_response")
    with pytest.raises(ValueError, match="'malformed' is not in tempax.data.reasons"):
        report.skip("f.jsonl:2", "malformed")
    with pytest.raises(ValueError, match="'empty_turn' is not in tempax.data.reasons"):
        report.drop("empty_turn")
    assert set(reasons.NOT_A_THRESHOLD_MATTER) <= set(reasons.MALFORMED)
