"""Scores (prompt, response) rows with a reward model: single rows get a score, preference pairs get both sides
scored and count towards pairwise accuracy (`tempax score` prints the result).

Rows are either {"prompt": str | messages, "response" | "completion": str | messages} or preference pairs
{"prompt"?, "chosen", "rejected"} (HH-RLHF dialogues too, `tempax.data.preference.parse_preference_row`).
Malformed rows are skipped and counted in a `DataReport` (never fatal here: the caller decides what an empty
result means). The scorer is anything with `encode(prompt, reply) -> ids` and `score_ids(batch) -> scores`
(`tempax.rewards.reward_model.RewardScorer`).
"""

from __future__ import annotations

import os
from typing import Any

from tempax.data.formats import RowError, as_turns
from tempax.data.preference import parse_preference_row
from tempax.data.report import DataReport
from tempax.data.sources import as_rows
from tempax.progress import work_bar


def _response_of(data: dict[str, Any]) -> Any:
    """The reply of a single row: its `response`, else its `completion` (None when it has neither)."""
    for key in ("response", "completion"):
        if data.get(key) is not None:
            return data[key]
    return None


def _parse_single(data: dict[str, Any]) -> tuple[Any, Any]:
    """(prompt, response) of a {prompt, response|completion} row; RowError for a malformed one."""
    if data.get("prompt") is None:
        raise RowError("missing_field", f"missing field 'prompt' (row has {sorted(data)})")
    response = _response_of(data)
    if response is None:
        raise RowError("missing_field", f"missing field 'response' or 'completion' (row has {sorted(data)})")
    prompt = as_turns(data["prompt"], "user", "prompt")
    try:
        reply = as_turns(response, "assistant", "response")
    except RowError as e:
        raise RowError("empty_response" if e.reason == "empty_content" else e.reason, e.detail) from None
    return prompt, reply


def score_rows(
    scorer: Any, rows: list[Any], *, name: str = "<input>", progress: bool | None = False
) -> tuple[list[dict[str, Any]], Any, dict[str, float]]:
    """Scores dataset rows; returns (output records, DataReport, summary).

    A row with `chosen` and `rejected` is a preference pair (both sides scored, `chosen_score` /
    `rejected_score`); otherwise it needs `prompt` and `response` (or `completion`) and gets `score`.
    `progress` is `tempax.progress.work_bar`'s `enabled` for the bar over the scored sequences.
    """
    rows = as_rows(rows)
    report = DataReport(name=name)
    report.total = len(rows)
    seqs: list[list[int]] = []
    jobs: list[tuple[dict[str, Any], str, int]] = []  # (row data, kind, index of its first sequence)
    for row in rows:
        if row.data is None:
            report.skip(row.where, row.reason, row.error or "")
            continue
        data = row.data
        try:
            if "chosen" in data or "rejected" in data:
                msgs = parse_preference_row(data)
                jobs.append((data, "pair", len(seqs)))
                seqs += [scorer.encode(msgs.prompt, msgs.chosen), scorer.encode(msgs.prompt, msgs.rejected)]
            else:
                prompt, reply = _parse_single(data)
                jobs.append((data, "single", len(seqs)))
                seqs.append(scorer.encode(prompt, reply))
        except RowError as e:
            report.skip(row.where, e.reason, e.detail)
            continue
        report.kept += 1
    scores: list[float] = []
    step = max(int(getattr(scorer, "batch_size", 1)), 1)  # one forward pass at a time, so the bar moves
    with work_bar(len(seqs), f"scoring {os.path.basename(name)}", unit="seq", enabled=progress) as bar:
        for start in range(0, len(seqs), step):
            scores += scorer.score_ids(seqs[start:start + step])
            bar.update(len(seqs[start:start + step]))
    records: list[dict[str, Any]] = []
    singles: list[float] = []
    margins: list[float] = []
    for data, kind, i in jobs:
        if kind == "pair":
            c, r = scores[i], scores[i + 1]
            margins.append(c - r)
            records.append({**data, "chosen_score": c, "rejected_score": r})
        else:
            singles.append(scores[i])
            records.append({**data, "score": scores[i]})
    summary: dict[str, float] = {}
    if singles:
        summary.update(num_scored=len(singles), mean_score=sum(singles) / len(singles))
    if margins:
        summary.update(
            num_pairs=len(margins),
            accuracy=sum(m > 0 for m in margins) / len(margins),
            mean_margin=sum(margins) / len(margins),
        )
    return records, report, summary
