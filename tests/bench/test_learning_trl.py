"""bench/learning_trl.py: its table from hand-made outcomes; TRL's side of the KTO row on a tiny model (tempax's
tokens, order, mismatched rows and initial adapters in, the trained adapter read back by tempax); and (slow) the
--tiny smoke run of the DPO and KTO rows through both libraries."""

from __future__ import annotations

import json
import os

import pytest

from bench.learning_trl import (ROWS, TINY_OVERRIDES, load_row_config, main, pair_outcomes, prepare_trl, row_slug,
                                selected, table, table_record, train_trl, write_base)
from tests.algorithms.preference.test_dpo import synthetic_rows, write_jsonl


def row(name):
    return next(r for r in ROWS if r.name == name)


def test_rows_not_built_or_not_run_print_not_run_and_a_paired_difference_is_judged(tmp_path):
    """KTO on 10 held-out pairs: tempax right on pairs 0-6 (7/10), TRL on pairs 0-3 and 7 (5/10): the paired
    difference 0.7 - 0.5 = +20.0 points; 3 pairs only tempax gets, 1 only TRL, so Newcombe's paired interval
    (tempax.eval.metrics) spans 0 ('inside'). Budgets come from the budget files; DPO has no files: not run."""
    kto = tmp_path / row_slug(row("KTO"))
    kto.mkdir()
    (kto / "outcomes.json").write_text(json.dumps({
        "before": [False] * 10, "tempax": [True] * 7 + [False] * 3,
        "trl": [True] * 4 + [False] * 3 + [True] + [False] * 2,
        "train_loss": {"tempax": [0.5, 0.49], "trl": [0.5, 0.4899]}}))
    (kto / "tempax.budget.json").write_text(json.dumps({"wall_s": 30.2, "cpu_s": 41.0, "exit": 0}))
    (kto / "trl.budget.json").write_text(json.dumps({"wall_s": 70.6, "cpu_s": 90.4, "exit": 0}))
    lines = table(ROWS, str(tmp_path), "Some CPU, 2 cores").splitlines()
    assert "Some CPU, 2 cores" in lines[0] and "trl " in lines[0] and "torch " in lines[0]
    by_name = {line.split(" | ")[0][2:]: line for line in lines[4:]}
    assert set(by_name) == {r.name for r in ROWS}
    line = by_name["KTO"]
    assert "tempax: a tie -> 70.0% [" in line and "TRL: a tie -> 50.0% [" in line
    assert "+20.0 [" in line and "(inside its interval), paired" in line
    assert "| 30 / 41 | 71 / 90 | 0.4900 / 0.4899 |" in line
    assert "| not run |" in by_name["DPO"]
    for name in ("SFT", "reward model", "GRPO, arithmetic"):
        assert "not run (the TRL side" in by_name[name]
    assert [r.name for r in selected(None)] == ["DPO", "KTO"] and [r.name for r in selected("kto")] == ["KTO"]
    record = table_record(ROWS, str(tmp_path), "Some CPU, 2 cores", "python bench/learning_trl.py --peer trl")
    assert record["columns"][0] == "row" and len(record["columns"]) == 7
    assert [r[0] for r in record["rows"]] == ["KTO"] and record["rows"][0][4:6] == ["30 / 41", "71 / 90"]
    assert record["cpu"] == "Some CPU, 2 cores" and record["topic"] == "learning"


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("learning_trl")
    return {"base": write_base(str(d / "base"), tiny=True),
            "train": write_jsonl(str(d / "pairs.jsonl"), synthetic_rows(8, seed=0)),
            "test": write_jsonl(str(d / "test.jsonl"), synthetic_rows(6, seed=1)), "dir": d}


@pytest.mark.needs_torch
def test_trl_kto_side_trains_on_tempaxs_rows_from_tempaxs_adapters_and_reads_back(tiny_files):
    """TRL gets 2 steps x 2 examples in tempax's order; each KL completion is the completion of that row's
    mismatched partner (another prompt's reply); with B = 0 the policy is the reference at the first step, so
    every log-ratio is 0 and TRL's first loss is 1 - sigmoid(0) = 0.5 exactly; its adapter loads into tempax
    (PEFT layout) and scores the 6 held-out pairs. With 1 warm-up step of 2, tempax's rate is the peak for both
    updates (warm-up (0 + 1) / 1, then the cosine at progress 0): TRL's updates use the same, where transformers'
    own warm-up would have given the first a rate of 0."""
    overrides = [f"model.source={tiny_files['base']}", *TINY_OVERRIDES, f"data.path={tiny_files['train']}",
                 f"data.eval_path={tiny_files['test']}", "train.optimizer.warmup_steps=1"]
    kto = row("KTO")
    cfg = load_row_config(kto, overrides)
    out = str(tiny_files["dir"] / "trl_kto")
    prepare_trl(kto, cfg, tiny_files["base"], out)
    inputs = json.loads(open(os.path.join(out, "trl_inputs.json")).read())
    assert len(inputs["rows"]) == 4 and inputs["arguments"]["per_device_train_batch_size"] == 2
    assert inputs["arguments"]["bf16"] is False  # tempax's fp32, not TRL's default bf16 autocast
    assert all(r["KL_completion_ids"] != r["completion_ids"] for r in inputs["rows"])
    train_trl(kto, tiny_files["base"], out)
    history = [r for r in json.loads(open(os.path.join(out, "log_history.json")).read()) if "loss" in r]
    losses = [r["loss"] for r in history]
    assert len(losses) == 2 and losses[0] == pytest.approx(0.5, abs=1e-7)
    peak = cfg.train.optimizer.learning_rate
    assert inputs["lr_factors"] == [pytest.approx(1.0), pytest.approx(1.0)]
    assert [r["learning_rate"] for r in history] == [pytest.approx(peak), pytest.approx(peak)]
    outcomes = pair_outcomes(cfg, tiny_files["base"], os.path.join(out, "adapters"))
    assert len(outcomes) == 6 and all(isinstance(x, bool) for x in outcomes)


@pytest.mark.slow
@pytest.mark.needs_torch
def test_tiny_smoke_run_trains_both_sides_alike_and_scores_both_with_tempax(tmp_path, capsys, monkeypatch):
    """Both libraries train 2 steps on the same tiny base, rows, order and initial adapters; tempax scores both
    adapters on the same 6 held-out pairs. The same run on both sides: the first loss is the untrained one (0.5
    for KTO, log 2 = 0.693147 for DPO) and the second agrees to 1e-4."""
    # The children train on this machine's devices, not the eight virtual ones of the test process (conftest):
    # a 4-row batch cannot be split across 8 data-parallel devices.
    monkeypatch.setenv("XLA_FLAGS", "")
    train = write_jsonl(str(tmp_path / "pairs.jsonl"), synthetic_rows(8, seed=0))
    test = write_jsonl(str(tmp_path / "test.jsonl"), synthetic_rows(6, seed=1))
    out = tmp_path / "out"
    assert main(["--tiny", "--only", "dpo,kto", "--out", str(out), "--", f"data.path={train}",
                 f"data.eval_path={test}"]) == 0
    printed = capsys.readouterr().out
    for name, first in (("DPO", 0.693147), ("KTO", 0.5)):
        folder = out / name
        logs = {p: (folder / p).read_text()[-3000:] for p in os.listdir(folder) if p.endswith(".log")}
        outcomes = json.loads((folder / "outcomes.json").read_text())
        assert "tempax" in outcomes and "trl" in outcomes, logs
        assert len(outcomes["tempax"]) == len(outcomes["trl"]) == 6
        ours, theirs = outcomes["train_loss"]["tempax"], outcomes["train_loss"]["trl"]
        assert ours[0] == pytest.approx(first, abs=1e-5) and theirs[0] == pytest.approx(first, abs=1e-5)
        assert abs(ours[1] - theirs[1]) < 1e-4, (ours, theirs)
        line = next(x for x in printed.splitlines() if x.startswith(f"| {name} |"))
        assert "paired" in line and "not run" not in line
