"""Unpaired feedback (a prompt, one completion, a desirable / undesirable label) -> tokenised KTO examples.

Rows in TRL's unpaired format are read, and preference pairs when asked (each gives a desirable and an undesirable
row); `tokenize_unpaired_rows` lists what is accepted and counted. Each example also carries the prompt with
another row's completion, the mismatched pair KTO's reference point needs (`mismatched_partners`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tempax.data.formats import Example, RowError, as_turns, encode_rendered, render_chat
from tempax.data.preference import PreferenceOptions, as_response, fit_pair, parse_preference_row
from tempax.data.report import DataReport
from tempax.data.sources import Row, as_rows
from tempax.errors import DataError


@dataclass(frozen=True)
class UnpairedMessages:
    """A parsed unpaired row before tokenisation."""

    prompt: list[dict[str, Any]]
    completion: list[dict[str, Any]]
    desirable: bool


@dataclass(frozen=True)
class UnpairedExample:
    """A tokenised unpaired row and its mismatched partner; both start with the same prompt tokens.

    Attributes:
      completion: prompt x_i + completion y_i, loss mask on y_i.
      mismatched: prompt x_i + another row's completion y'_i, loss mask on y'_i (for the KL reference point).
      desirable: the label.
      source: `file:line` of the row.
    """

    completion: Example
    mismatched: Example
    desirable: bool
    source: str = ""


def parse_unpaired_row(data: dict[str, Any]) -> UnpairedMessages:
    """Validates a {prompt, completion, label} row.

    Raises:
      RowError: missing_field (naming `data.convert_pairs` when the row looks like a preference pair),
        wrong_type (a label that is not true/false), empty_content / empty_response.
    """
    missing = [key for key in ("prompt", "completion", "label") if data.get(key) is None]
    if missing:
        hint = "; preference pairs need data.convert_pairs=true" if "chosen" in data and "rejected" in data else ""
        raise RowError("missing_field", f"missing field {missing[0]!r} (row has {sorted(data)}){hint}")
    label = data["label"]
    if not isinstance(label, bool):
        raise RowError("wrong_type", f"label must be true or false, got {label!r}")
    completion = as_response(data["completion"], "completion")
    return UnpairedMessages(as_turns(data["prompt"], "user", "prompt"), completion, label)


def split_preference_row(data: dict[str, Any]) -> list[UnpairedMessages]:
    """A preference row as [(prompt, chosen, desirable), (prompt, rejected, undesirable)]; [] for identical replies.

    Raises:
      RowError: for a malformed preference row (see `tempax.data.preference.parse_preference_row`).
    """
    msgs = parse_preference_row(data)
    if msgs.chosen == msgs.rejected:
        return []
    return [UnpairedMessages(msgs.prompt, msgs.chosen, True), UnpairedMessages(msgs.prompt, msgs.rejected, False)]


def mismatched_partners(prompts: Sequence[Any], *, seed: int = 0) -> list[int]:
    """For each row the index of another row with a different prompt, chosen once and seeded.

    KTO's reference point needs, for each row i, the prompt x_i with a completion y'_i of *another* row (a mismatched
    pair; see `tempax.algorithms.preference.losses.kto_loss`). It is picked once, seeded: in a shuffled order each
    row takes the completion of the next row whose prompt differs, so a converted pair never lends its other reply.

    Args:
      prompts: one hashable key per row (rows with equal keys share a prompt).
      seed: the shuffle's seed.

    Raises:
      DataError: when fewer than two distinct prompts exist (no mismatched pair can be formed).
    """
    n = len(prompts)
    if len(set(prompts)) < 2:
        raise DataError(
            f"KTO pairs each prompt with another row's completion to estimate its KL reference point, but the "
            f"{n} usable rows have {len(set(prompts))} distinct prompt(s); use data with at least two prompts"
        )
    order = np.random.default_rng(seed).permutation(n)
    partners = [0] * n
    for k, i in enumerate(order):
        step = 1
        while prompts[order[(k + step) % n]] == prompts[i]:
            step += 1
        partners[i] = int(order[(k + step) % n])
    return partners


def _prompt_key(prompt: list[dict[str, Any]]) -> str:
    return json.dumps(prompt, sort_keys=True)


def tokenize_unpaired_rows(
    rows: Sequence[Row | dict[str, Any]],
    tokenizer: Any,
    options: PreferenceOptions = PreferenceOptions(),
    *,
    convert_pairs: bool = False,
    seed: int = 0,
    name: str | None = None,
    check: bool = True,
) -> tuple[list[UnpairedExample], DataReport]:
    """Parses, pairs with mismatched completions, tokenises and length-fits unpaired rows.

    Accepted rows:
      * unpaired:      {"prompt": str | messages, "completion": str | messages, "label": true | false}; a string
                       completion is one assistant turn, a string prompt one user turn (TRL's unpaired format, plain
                       or conversational).
      * preference pairs, when asked (`convert_pairs=True`): every row `tempax.data.preference` accepts ({prompt,
                       chosen, rejected}, two conversations, HH-RLHF dialogues) becomes two unpaired rows, (prompt,
                       chosen, true) and (prompt, rejected, false). Pairs with identical replies are dropped
                       ("identical"): they would carry contradictory labels.

    The mismatched sequence is tokenised with the example and both sides share the prompt tokens, so the
    pair-length policy of `tempax.data.preference.fit_pair` applies unchanged (over-long rows lose the same prompt
    tokens from the left on both sides; counted as truncated "prompt_left" / "response_right", or dropped with
    overlong="drop").

    Counted outcomes (`DataReport`): skipped — invalid_utf8, invalid_json, not_an_object, missing_field, wrong_type,
    empty_content, empty_response, template_error and the preference-row reasons; dropped — identical, too_long,
    no_target_after_truncation. `kept` counts rows that gave at least one example.

    Args:
      rows: `Row`s from `sources.read_rows`, or plain dicts.
      tokenizer: a `tempax.models.tokenizer.Tokenizer`.
      options: length policy and bad-row threshold (the preference pairs' options).
      convert_pairs: read the rows as preference pairs and split each into two unpaired rows.
      seed: seed of the mismatched pairing.
      name: what to call the data in the report.
      check: raise `DataError` when the malformed fraction exceeds `options.max_bad_fraction` or nothing is kept.
    """
    rows = as_rows(rows)
    report = DataReport(name=name or (rows[0].source if rows else "<empty>"))
    report.total = len(rows)
    parsed: list[tuple[str, UnpairedMessages]] = []
    rendered = []
    for row in rows:
        if row.data is None:
            report.skip(row.where, row.reason, row.error or "")
            continue
        try:
            items = split_preference_row(row.data) if convert_pairs else [parse_unpaired_row(row.data)]
            if not items:
                report.drop("identical")
                continue
            sides = [render_chat(tokenizer, m.prompt + m.completion, first_trained=len(m.prompt)) for m in items]
        except RowError as e:
            report.skip(row.where, e.reason, e.detail)
            continue
        parsed.extend((row.where, m) for m in items)
        rendered.extend(sides)
    if not parsed:
        if check:
            report.check(options.max_bad_fraction)
        return [], report
    partners = mismatched_partners([_prompt_key(m.prompt) for _, m in parsed], seed=seed)
    mismatched = [
        render_chat(tokenizer, m.prompt + parsed[j][1].completion, first_trained=len(m.prompt))
        for (_, m), j in zip(parsed, partners)
    ]
    encoded = encode_rendered(tokenizer, rendered + mismatched)
    examples: list[UnpairedExample] = []
    kept_rows: set[str] = set()
    for i, (where, m) in enumerate(parsed):
        fitted = fit_pair(encoded[i], encoded[len(parsed) + i], options, report, where)
        if fitted is not None:
            examples.append(UnpairedExample(fitted.chosen, fitted.rejected, m.desirable, where))
            kept_rows.add(where)
    report.kept = len(kept_rows)
    if check:
        report.check(options.max_bad_fraction)
    return examples, report
