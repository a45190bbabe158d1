"""bench/learning.py's reading of run files and its table, from hand-made run dirs (no training)."""

import json

from bench.learning import ROWS, Outcome, main, read_counts, read_outcome, run_dir_of, table, table_record


def row(name):
    return next(r for r in ROWS if r.name == name)


def write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def test_every_algorithm_has_a_row():
    names = " ".join(r.name for r in ROWS)
    for algorithm in ("SFT", "DPO", "KTO", "reward model", "PPO", "GRPO", "RFT", "distillation"):
        assert algorithm in names, algorithm
    for name in ("DPO", "KTO", "reward model"):  # >= 200 held-out pairs for a preference accuracy
        assert "data.max_eval_rows=200" in row(name).args, name


def test_reads_generation_and_pair_runs_and_judges_the_gain(tmp_path):
    """GRPO: answers 26.0% -> 40.0% of 200 = 52 -> 80. DPO: accuracy (a tie) -> 0.59375 of 64 pairs = 38.

    GRPO, Wilson (z^2 = 3.8415, 1 + z^2/n = 1.019207): 80/200 -> centre (0.4 + 0.0096) / 1.0192 = 0.40189, half
    1.92303 * sqrt(0.0012 + 0.000024) = 0.06728, [0.33461, 0.46917]; 52/200 -> [0.20414, 0.32491]. Newcombe:
    low = 0.14 - sqrt(0.06539^2 + 0.06491^2) = 0.14 - 0.09214 = +4.8 points, high = 0.14 + sqrt(0.06917^2 +
    0.05586^2) = 0.14 + 0.08891 = +22.9: above 0, 'beyond'. DPO's 38/64 against chance: Wilson [0.4715, 0.7054]
    spans 0.5, so +9.4 [-2.9, +20.5]: 'inside'."""
    grpo = tmp_path / run_dir_of(row("GRPO (GSM8K)"), "")
    write(grpo / "eval.json", {"before": {"greedy": {"num_problems": 200, "answer_accuracy": 0.26}},
                               "after": {"greedy": {"num_problems": 200, "answer_accuracy": 0.40}}})
    write(tmp_path / "GRPO_(GSM8K).budget.json", {"wall_s": 100.4, "cpu_s": 150.2})
    dpo = tmp_path / "DPO"
    write(dpo / "eval_summary.json", {"before": {"accuracy": 0.5}, "after": {"accuracy": 0.59375}, "eval_pairs": 64})
    write(tmp_path / "DPO.budget.json", {"wall_s": 50.0, "cpu_s": 60.0})
    assert read_counts(row("GRPO (GSM8K)"), str(grpo)) == ((52, 200), (80, 200))
    assert read_counts(row("DPO"), str(dpo)) == ((32, 64), (38, 64))
    outcomes = [read_outcome(row("GRPO (GSM8K)"), str(tmp_path)), read_outcome(row("DPO"), str(tmp_path)),
                Outcome(row("KTO"), 10.0, 12.0, error="exit status 2 (see x.log)"),
                read_outcome(row("SFT"), str(tmp_path))]
    text = table(outcomes, "Intel Xeon, 2 cores")
    lines = text.splitlines()
    assert "Intel Xeon, 2 cores" in lines[0] and lines[2].startswith("| algorithm |")
    assert "| GRPO (GSM8K) |" in lines[4] and "| 100 / 150 |" in lines[4] and "26.0% [" in lines[4]
    assert "+14.0 [+4.8, +22.9] (beyond its interval)" in lines[4]
    assert "| DPO |" in lines[5] and "a tie (50.0% [" in lines[5]
    assert "+9.4 [-2.9, +20.5] (inside its interval) against chance" in lines[5]
    assert "failed: exit status 2" in lines[6]
    assert lines[7].startswith("| SFT |") and "| not run" in lines[7]  # never filled in


def test_reads_loss_score_and_compare_runs(tmp_path):
    """SFT: held-out loss 2.0 -> 1.8 (first and last eval record) = -0.200. Distillation: CE 13.9 -> 6.7, the
    CE-only baseline run ends at 7.0: -0.300 against it. PPO: gain 0.1 +- 0.04 s.e. -> 0.1 -+ 1.96 * 0.04 =
    [+0.022, +0.178], 2.5 s.e., beyond. Compare (10 problems): warm-start 2 right, (b) GRPO 4, (a) 6, (c) RFT 7;
    RFT gains 7/10 - 2/10 = +50.0 points over the warm-start and 7/10 - 6/10 = +10.0 over (a); GRPO 4/10 - 6/10
    = -20.0 against (a); (d) GRPO after (a) 9/10: +30.0 over (a), +50.0 over (b)."""
    sft = tmp_path / "SFT"
    sft.mkdir()
    (sft / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"step": 0, "eval/loss": 2.0}, {"step": 1, "loss": 2.1}, {"step": 10, "eval/loss": 1.9},
        {"step": 20, "eval/loss": 1.8})) + "\n")
    for folder, ce in (("distillation", 6.7), ("distillation_baseline", 7.0)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "metrics.jsonl").write_text(
            json.dumps({"step": 0, "eval/ce_loss": 13.9}) + "\n" + json.dumps({"step": 30, "eval/ce_loss": ce}) + "\n")
    write(tmp_path / "PPO" / "eval.json", {
        "before": {"score_mean": 2.0, "score_sem": 0.07, "kl_mean": 0.0, "num_prompts": 200.0},
        "after": {"score_mean": 2.1, "score_sem": 0.07, "kl_mean": 2.5, "num_prompts": 200.0},
        "comparison": {"score_gain": 0.1, "score_gain_sem": 0.04, "after_better_frac": 0.6}})
    compare = tmp_path / run_dir_of(row("GRPO and RFT, scarce demonstrations"), "")
    compare.mkdir()

    def right(k):
        return [True] * k + [False] * (10 - k)

    records = [{"stage": "after SFT", "correct": right(2)},
               {"stage": "(b) GRPO", "correct": right(4), "trained_seconds": {"sft": 30.0, "grpo": 300.0},
                "trained_cpu_seconds": {"sft": 20.0, "grpo": 120.0}},
               {"stage": "(a) SFT again on the N", "correct": right(6)},
               {"stage": "(d) GRPO after (a)", "correct": right(9),
                "trained_seconds": {"grpo": 300.0, "grpo after sft": 290.0},
                "trained_cpu_seconds": {"grpo": 120.0, "grpo after sft": 119.0}},
               {"stage": "(c) RFT", "correct": right(7), "trained_seconds": {"grpo": 300.0, "rft": 280.0},
                "trained_cpu_seconds": {"grpo": 120.0, "rft": 121.0}}]
    (compare / "outcomes.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    outcomes = [read_outcome(r, str(tmp_path)) for r in ROWS]
    lines = {o.row.name: o.lines for o in outcomes}
    (sft_line,) = lines["SFT"]
    assert "2.000 -> 1.800" in sft_line.metric and sft_line.gain.startswith("-0.200")
    (distill,) = lines["distillation"]
    assert "13.900 -> 6.700" in distill.metric and distill.gain.startswith("-0.300 against the baseline")
    assert distill.baseline.endswith(": 7.000")
    (ppo,) = lines["PPO"]
    assert ppo.gain == "+0.100 [+0.022, +0.178] (beyond its interval; 2.5 s.e.)" and "KL to the reference 2.50" in ppo.metric
    grpo, rft, after = lines["GRPO and RFT, scarce demonstrations"]
    assert grpo.algorithm == "GRPO, scarce demonstrations" and grpo.budget == "300 / 120"
    assert "20.0% [" in grpo.metric and "-> 40.0% [" in grpo.metric and "difference -20.0 [" in grpo.baseline
    assert rft.budget == "280 / 121" and rft.gain.startswith("+50.0 [") and rft.gain.endswith(", paired")
    assert "60.0% [" in rft.baseline and "difference +10.0 [" in rft.baseline
    assert after.algorithm == "GRPO after the best SFT" and after.budget == "290 / 119"
    assert after.metric.startswith("answer accuracy: 60.0% [") and "-> 90.0% [" in after.metric
    assert after.gain.startswith("+30.0 [") and after.gain.endswith(", paired, against (a)")
    assert "40.0% [" in after.baseline and "difference +50.0 [" in after.baseline
    record = table_record(outcomes, "Some CPU, 2 cores", "python bench/learning.py --only demo")
    assert [r[0] for r in record["rows"]] == ["SFT", "PPO", "GRPO, scarce demonstrations",
                                              "RFT, scarce demonstrations", "GRPO after the best SFT", "distillation"]
    assert record["topic"] == "learning" and len(record["columns"]) == len(record["rows"][0])
    assert [o.row.name for o in outcomes if not o.lines] == ["DPO", "KTO", "reward model", "GRPO (GSM8K)"]


def test_table_mode_lists_every_row(tmp_path, capsys):
    assert main(["--table", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 4 + len(ROWS) and all("| not run" in line for line in printed[4:])


def test_the_long_row_runs_only_when_named_and_the_page_holds_the_table(tmp_path, capsys):
    from bench.learning import selected

    default = selected(None)
    assert [r for r in ROWS if r.long] and all(not r.long for r in default)
    assert [r.command for r in selected("grpo")] == ["grpo"]
    page = tmp_path / "docs" / "learning-table.md"
    main(["--table", str(tmp_path), "--page", str(page)])
    printed = capsys.readouterr().out.strip()
    written = page.read_text()
    assert printed in written and "`python bench/learning.py`" in written
    assert "not run by default (200 GRPO steps" in printed


def test_kto_is_judged_against_chance_and_against_dpo_on_the_same_pairs(tmp_path):
    """KTO 120/200 against DPO 150/200: Newcombe's independent interval of 0.60 - 0.75 is [-23.8, -5.8] points
    (below); against chance, Wilson of 120/200 is [0.5308, 0.6654]: +10.0 [+3.1, +16.5] (beyond)."""
    for name, accuracy in (("DPO", 0.75), ("KTO", 0.60)):
        write(tmp_path / name / "eval_summary.json", {"before": {"accuracy": 0.46}, "after": {"accuracy": accuracy},
                                                      "eval_pairs": 200})
    line = read_outcome(row("KTO"), str(tmp_path)).lines[0]
    assert "+10.0 [+3.1, +16.5] (beyond its interval) against chance" == line.gain
    assert line.baseline.endswith("DPO 75.0% [68.6, 80.5] of 200; difference -15.0 [-23.8, -5.8] (below its interval)")


def test_a_preference_row_also_names_the_untrained_models_own_ranking(tmp_path):
    """DPO 121/199 after; the untrained model's mean log-prob ranks 119/199 right: the difference +1.0 point,
    Newcombe's interval spans 0 ('inside')."""
    write(tmp_path / "DPO" / "eval_summary.json", {"before": {"accuracy": 0.4573, "mean_logp_accuracy": 119 / 199},
                                                   "after": {"accuracy": 121 / 199}, "eval_pairs": 199})
    line = read_outcome(row("DPO"), str(tmp_path)).lines[0]
    assert "own ranking (higher mean log-prob on the chosen reply) 59.8% [" in line.baseline
    assert line.baseline.endswith("difference +1.0 [-8.5, +10.5] (inside its interval)")


def test_after_sft_runs_become_one_row_each(tmp_path):
    """Two `demo --compare rl_after_sft=true` runs on 10 problems: (a) 6 right in both; (d) 7 and 5 right, so
    +10.0 and -10.0 points, paired; the lever is read from the run's config ("as (b)" when it had none)."""
    from bench.learning import after_sft_record

    def right(k):
        return [True] * k + [False] * (10 - k)

    runs = []
    for name, overrides, d in (("r1", None, 7), ("r2", ["grpo.dynamic_sampling=true"], 5)):
        run = tmp_path / name
        run.mkdir()
        (run / "outcomes.jsonl").write_text("\n".join(json.dumps(r) for r in (
            {"stage": "(a) SFT again on the N", "correct": right(6)},
            {"stage": "(d) GRPO after (a)", "correct": right(d)})) + "\n")
        write(run / "results.json", {"config": {"after_sft_overrides": overrides}, "comparison": {"budget": {
            "budget_seconds": 200.0, "stages": {"(d) GRPO after (a)": {"steps": 11, "cpu_seconds": 205.0}},
            "validation": {"kept_step": 16, "kept_score": 0.57, "problems": 100}}}})
        runs.append(str(run))
    record = after_sft_record(runs, "Some CPU, 2 cores")
    first, second = record["rows"]
    assert first[0] == "as (b)" and second[0] == "grpo.dynamic_sampling=true"
    assert first[3].startswith("+10.0 [") and second[3].startswith("-10.0 [")
    assert first[1].startswith("60.0% [") and first[4] == "11 steps, 205 s CPU (budget 200)"
    assert first[5] == "step 16 (57.0% of 100)" and len(record["columns"]) == len(first)
