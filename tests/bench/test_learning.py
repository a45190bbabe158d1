"""bench/learning.py's reading of run files and its table, from hand-made run dirs (no training)."""

import json

from bench.learning import ROWS, Outcome, read_counts, table


def row(name):
    return next(r for r in ROWS if r.name == name)


def test_reads_generation_and_pair_runs_and_judges_the_gain(tmp_path):
    """RFT: answers 26.0% -> 40.0% of 200 = 52 -> 80. DPO: accuracy 0.5 -> 0.625 of 64 pairs = 32 -> 40.

    RFT, Wilson (z^2 = 3.8415, 1 + z^2/n = 1.019207): 80/200 -> centre (0.4 + 0.0096) / 1.0192 = 0.40189, half
    1.92303 * sqrt(0.0012 + 0.000024) = 0.06728, [0.33461, 0.46917]; 52/200 -> [0.20414, 0.32491]. Newcombe:
    low = 0.14 - sqrt(0.06539^2 + 0.06491^2) = 0.14 - 0.09214 = +4.8 points, high = 0.14 + sqrt(0.06917^2 +
    0.05586^2) = 0.14 + 0.08891 = +22.9: above 0, 'beyond'. DPO's +12.5 points on 64 pairs: Wilson half-widths
    are ~0.12 each, so the interval spans 0: 'inside'."""
    rft = tmp_path / "RFT"
    rft.mkdir()
    (rft / "eval.json").write_text(json.dumps({
        "before": {"greedy": {"num_problems": 200, "answer_accuracy": 0.26}},
        "after": {"greedy": {"num_problems": 200, "answer_accuracy": 0.40}}}))
    dpo = tmp_path / "DPO"
    dpo.mkdir()
    (dpo / "eval_summary.json").write_text(json.dumps({"before": {"accuracy": 0.5}, "after": {"accuracy": 0.625},
                                                       "eval_pairs": 64}))
    assert read_counts(row("RFT"), str(rft)) == ((52, 200), (80, 200))
    assert read_counts(row("DPO"), str(dpo)) == ((32, 64), (40, 64))
    outcomes = [Outcome(row("RFT"), 100.0, 150.0, (52, 200), (80, 200)),
                Outcome(row("DPO"), 50.0, 60.0, (32, 64), (40, 64)),
                Outcome(row("KTO"), 10.0, 12.0, error="exit status 2 (see x.log)")]
    text = table(outcomes, "AMD EPYC, 2 cores")
    lines = text.splitlines()
    assert "AMD EPYC, 2 cores" in lines[0] and lines[2].startswith("| algorithm |")
    assert "| RFT |" in lines[4] and "26.0% [" in lines[4] and "+14.0 [+4.8, +22.9] (beyond its interval)" in lines[4]
    assert "| DPO |" in lines[5] and "(inside its interval)" in lines[5]
    assert "failed: exit status 2" in lines[6]
