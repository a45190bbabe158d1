"""bench/sandbox.py's records for the results page, from its three JSON lines."""

from __future__ import annotations

import json

from bench.results import read_records
from bench.sandbox import figure_records

CPU = "Some CPU, 2 cores"
LINES = [
    {"bench": "sandbox_overhead", "repeats": 8, "sandbox_s_median": 0.0933, "bare_python_s_median": 0.0567,
     "overhead_s_median": 0.0366, "cpu": CPU, "load_average": 0.4},
    {"bench": "sandbox_throughput", "programs": 32, "workers": 2, "seconds": 1.79, "programs_per_s": 17.9,
     "cpu": CPU, "load_average": 1.1},
    {"bench": "sandbox_code_task", "programs": 32, "tests_per_program": 8, "workers": 2, "seconds": 2.18,
     "programs_per_s": 14.7, "cpu": CPU, "load_average": 1.3},
]


def test_the_three_lines_become_two_figures_the_results_page_reads(tmp_path):
    records = figure_records(LINES, "python bench/sandbox.py")
    assert records[0]["figure"] == "36.6 ms (93.3 ms sandboxed vs 56.7 ms bare; load average 1.3)"
    assert records[1]["what"] == "sandbox throughput, 2 programs at once"
    assert records[1]["figure"].startswith("17.9 empty programs/s; 14.7 code-task answers/s (8 hidden tests each")
    (tmp_path / "code.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert [r["topic"] for r in read_records(str(tmp_path))] == ["code", "code"]
