"""bench/tpu_numerics.py's table record: the chip's columns, and transformers' bf16 beside them when measured."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from bench import tpu_numerics  # noqa: E402

ROW = {"family": "qwen3_5", "device": "TPU v5 lite", "logit_abs_max": 1.713, "bf16_vs_f32_reference": 1.4105,
       "bf16_top1_agreement": 0.76953125, "f32_highest_vs_f32_reference": 0.001, "greedy_tokens_equal": True}


def test_a_chip_run_without_transformers_keeps_the_five_columns():
    record = tpu_numerics.numerics_record([ROW], "0.10.2")
    assert record["title"].startswith("Numerics on the chip:")
    assert record["rows"] == [["qwen3_5", "77.0%", "1.41 (1.71)", "0.001", "yes"]]
    assert record["command"] == "bash scripts/tpu/run.sh python bench/tpu_numerics.py"


def test_transformers_columns_appear_when_every_line_has_them():
    theirs = {**ROW, "device": "cpu", "transformers_bf16_vs_f32_reference": 1.4241,
              "transformers_bf16_top1_agreement": 0.74609375}
    record = tpu_numerics.numerics_record([theirs], "0.10.2")
    assert record["title"].startswith("Numerics on a CPU:") and "transformers in bfloat16" in record["title"]
    assert record["columns"][-2:] == ["transformers bf16 top-1 agreement", "transformers bf16 max |diff|"]
    assert record["rows"][0][-2:] == ["74.6%", "1.42"]
    assert record["command"] == "python bench/tpu_numerics.py --record FILE"
    mixed = tpu_numerics.numerics_record([theirs, {**ROW, "device": "cpu"}], "0.10.2")
    assert len(mixed["columns"]) == 5
