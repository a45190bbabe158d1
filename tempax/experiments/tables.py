"""The tables a pipeline prints: each stage's format and answer accuracy with 95% Wilson intervals, and the paired
differences between two stages with Newcombe's interval.

Every stage of a pipeline is evaluated greedily on the same held-out problems, so two stages' outcomes are
paired by problem: a problem's difficulty is shared, and an interval for independent samples would be too wide
(`tempax.eval.metrics.paired_difference_interval`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from tempax.eval.evaluate import TaskEvaluation, render_rows
from tempax.eval.metrics import paired_difference_interval, wilson_interval

# An evaluated stage: (its row name, its evaluation on the held-out problems).
Evaluation = tuple[str, TaskEvaluation]


def outcomes(r: TaskEvaluation, which: str) -> list[bool]:
    """Per held-out problem, whether the (single, greedy) completion was in format (`format_ok`) / correct."""
    return [bool(getattr(x, which)[0]) for x in r.greedy_records]


def _percent(p: float) -> str:
    return f"{100 * p:5.1f}"


def interval_table(evaluations: Sequence[Evaluation], seconds: dict[str, float] | None = None) -> str:
    """One line per stage: format and answer accuracy of its greedy completions, each with its 95% Wilson
    interval (`tempax.eval.metrics.wilson_interval`), and the stage's training seconds where given."""
    seconds = seconds or {}
    header = ["stage", "format % [95% CI]", "answer % [95% CI]", "problems", "training s"]
    lines = [header]
    for name, r in evaluations:
        row = [name]
        for which in ("format_ok", "correct"):
            flags = outcomes(r, which)
            lo, hi = wilson_interval(sum(flags), len(flags))
            row.append(f"{_percent(sum(flags) / len(flags))} [{_percent(lo)}, {_percent(hi)}]")
        row += [str(len(r.greedy_records)), f"{seconds[name]:.0f}" if name in seconds else "-"]
        lines.append(row)
    return render_rows(lines)


def compare_lines(evaluations: Sequence[Evaluation],
                  pairs: Sequence[tuple[str, str]]) -> tuple[list[str], dict[str, Any]]:
    """Each pair's difference (first minus second), answers and format: the paired difference with Newcombe's
    interval (`tempax.eval.metrics.paired_difference_interval`: both are evaluated on the same problems, so the
    pairs' agreement narrows the interval). (printable lines, the numbers by "A minus B" and answers / format);
    a pair naming a stage that was not evaluated is left out."""
    by_name = dict(evaluations)
    lines, numbers = [], {}
    for a, b in pairs:
        if a not in by_name or b not in by_name:
            continue
        key = f"{a} minus {b}"
        numbers[key] = {}
        for which, label in (("correct", "answers"), ("format_ok", "format")):
            d = paired_difference_interval(outcomes(by_name[a], which), outcomes(by_name[b], which))
            numbers[key][label] = dataclasses.asdict(d)
            lines.append(f"{key}, {label}: {100 * d.difference:+.1f} points, 95% CI [{100 * d.low:+.1f}, "
                         f"{100 * d.high:+.1f}] (paired, Newcombe; right in both {d.both}, first only {d.only_a}, "
                         f"second only {d.only_b}, neither {d.neither})")
    return lines, numbers
