"""bench/serve.py's table and bench/decode.py's long-tail figure as records of the results page."""

from __future__ import annotations

import argparse
import json

from bench.decode import long_tail_record
from bench.results import read_records
from bench.serve import table_record


def level(clients: int, batching: str, tokens_per_s: float, p50: float, p95: float) -> dict:
    return {"clients": clients, "batching": batching, "tokens_per_s": tokens_per_s, "latency_p50_s": p50,
            "latency_p95_s": p95, "mean_live_rows": float(clients), "load_1min": 1.5}


def test_the_serve_table_has_each_level_against_one_client_of_its_batching(tmp_path):
    rows = [level(1, "continuous", 8.0, 4.0, 4.2), level(16, "continuous", 72.0, 6.8, 7.0),
            level(1, "static", 6.0, 5.0, 5.5), level(16, "static", 30.0, 10.0, 12.5)]
    record = table_record(rows, argparse.Namespace(max_tokens=32, max_batch=32, requests=16))
    assert record["rows"][1][:7] == [16, "continuous", 72.0, "9.00x", 6.8, 7.0, "1.75x"]
    assert record["rows"][3][3] == "5.00x" and record["rows"][3][6] == "2.50x"
    assert len(record["columns"]) == len(record["rows"][0])
    (tmp_path / "serving.jsonl").write_text(json.dumps(record) + "\n")
    assert read_records(str(tmp_path))[0]["topic"] == "serving"


def test_the_long_tail_line_becomes_a_figure():
    record = long_tail_record({"size": "small", "completions": 40, "slots": 8, "max_new_tokens_short_long": [16, 128],
                               "static_tokens_per_s": 35.1, "continuous_tokens_per_s": 70.6,
                               "continuous_vs_static": 2.01, "load_1min_before_after": [1.8, 1.9]})
    assert record["figure"].startswith("2.01x the generated tokens/s (70.6 against 35.1")
    assert record["command"] == "python bench/decode.py --long-tail small"
    assert "every tenth 128 tokens and the rest 16" in record["what"]
