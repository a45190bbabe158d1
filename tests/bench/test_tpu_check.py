"""bench/tpu_check.py times whole commands from outside: the marks, the timeout, and the figures it records."""

from __future__ import annotations

import json
import os
import sys

import bench.tpu_check as tpu_check


def test_timed_run_marks_the_first_line_holding_each_text_and_keeps_the_whole_output(tmp_path):
    code = "import time\nprint('loading', flush=True)\ntime.sleep(0.3)\nprint('train step 1/2', flush=True)\n"
    log = tmp_path / "case.log"
    out = tpu_check.timed_run([sys.executable, "-c", code], str(log), dict(os.environ), 60,
                              {"step1": "train step 1/", "never": "not printed"})
    assert out["status"] == 0
    assert 0.3 <= out["step1_at_s"] <= out["wall_s"]
    assert "never_at_s" not in out
    text = log.read_text()
    assert text.startswith("$ ") and "loading" in text and "train step 1/2" in text


def test_a_silent_stuck_command_is_ended_at_the_timeout_and_reported_so(tmp_path):
    out = tpu_check.timed_run([sys.executable, "-c", "import time; time.sleep(60)"], str(tmp_path / "x.log"),
                              dict(os.environ), 0.5, {})
    assert out["status"] == "timed out" and out["wall_s"] < 30


def test_steady_tokens_per_s_is_the_median_from_the_third_step(tmp_path):
    rows = [{"step": 1}, {"step": 2, "tokens_per_s": 10.0}, {"step": 3, "tokens_per_s": 100.0},
            {"step": 4, "tokens_per_s": 300.0}, {"step": 5, "tokens_per_s": 200.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert tpu_check.steady_tokens_per_s(str(tmp_path)) == 200.0
    assert tpu_check.steady_tokens_per_s(str(tmp_path / "missing")) is None


def test_a_finished_sft_case_is_summarised_and_an_unfinished_one_is_not():
    done = {"status": 0, "first_step_s": 91.6, "compile_and_step_s": 61.1, "tokens_per_s": 12341.5, "mfu": 0.3097,
            "memory": "train.memory=auto chose device: everything fits"}
    assert tpu_check.summary("sft_lora_cold", done) == ("first step 91.6 s from the process's start (61.1 s after "
                                                        "the memory plan); then 12,342 tok/s, 31.0% MFU; "
                                                        "train.memory=auto chose device")
    assert tpu_check.summary("sft_full", {"status": 2}) is None
    assert tpu_check.summary("sft_lora_cold", {"status": "timed out"}) is None


def test_cases_and_groups_name_what_exists():
    assert set(tpu_check.WHAT) == set(tpu_check.ORDER)
    assert all(set(cases) <= set(tpu_check.ORDER) for cases in tpu_check.GROUPS.values())
