"""bench/compare_moe.py: its table and figure records from hand-made records, and one run at the tiny size."""

import json
import math

import pytest

from bench.compare_moe import SIZES, build_table, cells, figure_records, main

CPU = "Intel(R) Xeon(R) Processor (GenuineIntel), 2 cores, avx512f"
TORCH = "transformers 5.25.0 + torch 2.13.0+cpu"


def rec(side, workload, size="small", **fields):
    return {"side": side, "workload": workload, "size": size, "host_cpu": CPU, "load_average_before": [2.0, 2.0, 2.0],
            **({"library": TORCH} if side == "transformers" else {"library": "tempax", "jax": "0.10.2"}), **fields}


RECORDS = [
    rec("tempax", "train", tokens_per_s=300.0, peak_rss_gib=1.5), rec("transformers", "train", tokens_per_s=100.0),
    rec("tempax", "train", tokens_per_s=500.0, peak_rss_gib=1.0), rec("transformers", "train", tokens_per_s=150.0),
    rec("tempax", "decode", error="exit 1: Traceback\nValueError: bad shape"),
    rec("transformers", "decode", generated_tokens_per_s=40.0, peak_rss_gib=0.5),
]


def test_ratios_and_table_from_hand_made_records():
    """train: tempax repeats 300, 500 -> median 400; PyTorch 100, 150 -> 125; ratio 400 / 125 = 3.2.
    decode: tempax failed, so its cell shows the error's last line and the row has no ratio."""
    train, decode = cells(RECORDS)
    assert (train["tempax"]["median"], train["transformers"]["median"]) == (400.0, 125.0)
    assert train["ratio"] == pytest.approx(3.2)
    assert decode["ratio"] is None
    table = build_table(RECORDS)
    assert CPU in table and TORCH in table and "0.10.2" in table
    assert "| trained tokens/s | small | 400.0 (300.0, 500.0) | 125.0 (100.0, 150.0) | 3.20x | 1.50 / ? |" in table
    assert "| generated tokens/s | small | error: ValueError: bad shape | 40.0 (40.0) |  | ? / 0.50 |" in table
    (figure,) = figure_records(RECORDS, "python bench/compare_moe.py")
    assert figure["figure"] == ("400.0 trained tokens/s against PyTorch's 125.0 (3.20x); load average 2.00 to 2.00 "
                                "before the measurements")
    assert figure["cpu"] == CPU and figure["topic"] == "speed" and "16 experts top-2" in figure["what"]


@pytest.mark.slow
@pytest.mark.needs_torch
def test_tiny_run_measures_both_sides_of_both_workloads(tmp_path, capsys):
    """One repeat a side at the tiny size: four measurements without errors, both sides training the same model
    (the first loss of random weights near ln(vocab) = ln 256 = 5.55 on both sides), the table with two ratios and
    one figure record per workload. No figure is judged: the machine is shared."""
    out, record = tmp_path / "raw.jsonl", tmp_path / "speed.jsonl"
    assert main(["--sizes", "tiny", "--repeats", "1", "--page", "", "--out", str(out), "--record", str(record)]) == 0
    raw = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["side"], r["workload"]) for r in raw] == [("tempax", "train"), ("transformers", "train"),
                                                          ("tempax", "decode"), ("transformers", "decode")]
    assert not [r["error"] for r in raw if "error" in r]
    for r in raw:
        if r["workload"] == "train":
            assert abs(r["first_loss"] - math.log(SIZES["tiny"]["vocab"])) < 0.3, r
    table = capsys.readouterr().out
    assert table.count("x |") == 2 and raw[0]["host_cpu"] in table
    figures = [json.loads(line) for line in record.read_text().splitlines()]
    assert [f["what"].split(" (")[0] for f in figures] == ["mixture-of-experts training step",
                                                           "mixture-of-experts greedy decoding"]
