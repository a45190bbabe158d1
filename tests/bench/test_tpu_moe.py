"""bench/tpu_moe.py: its table record from hand-made results, and one run of both columns at the tiny size."""

import json

import pytest

from bench.results import read_records
from bench.tpu_moe import main, table_record


def result(column, train, decode, loss=5.5):
    return {"size": "tiny", "column": column, "backend": "tpu", "device": "TPU v5 lite",
            "train": {"tokens_per_s": train, "first_loss": loss, "jax": "0.10.2"},
            "decode": {"generated_tokens_per_s": decode}}


def test_each_column_against_the_plain_one_of_its_size():
    """train 300 / 200 = 1.50x, decode 90 / 120 = 0.75x; the plain row is 1.00x of itself."""
    record = table_record([result("plain", 200.0, 120.0), result("auto", 300.0, 90.0)])
    plain, own = record["rows"]
    assert plain[1:] == ["plain", 200.0, 5.5, 120.0, "1.00x / 1.00x"]
    assert own[1:] == ["tpu (the table's own)", 300.0, 5.5, 90.0, "1.50x / 0.75x"]
    assert own[0] == "tiny (4 experts top-2, hidden 64, 2 layers)"
    assert (record["cpu"], record["jax"]) == ("TPU v5 lite", "0.10.2")


@pytest.mark.slow
def test_both_columns_run_at_the_tiny_size_and_agree(tmp_path, capsys):
    """On a CPU both columns compute the expert products with ragged_dot: the same first loss."""
    assert main(["--sizes", "tiny", "--record", str(tmp_path / "tpu.jsonl")]) == 0
    (record,) = read_records(str(tmp_path))
    plain, own = record["rows"]
    assert plain[3] == own[3] and plain[1] == "plain" and own[1] == "cpu (the table's own)"
    assert len(capsys.readouterr().out.strip().splitlines()) == 2
    json.dumps(record)
