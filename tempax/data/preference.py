"""Preference pairs (prompt, chosen, rejected) -> stacked fixed-shape batches for DPO-family and reward models.

Rows with an explicit prompt, two full conversations, or Anthropic HH-RLHF dialogue strings are read
(`parse_preference_row`); each side is rendered through the chat template and trained on its response only.
Batches are stacked, not interleaved ([2B, T]: chosen rows, then rejected rows; `collate_pairs`), so one forward
pass scores both sides of every pair. Overlong pairs keep equal prompts (`fit_pair`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tempax.data.formats import Example, RowError, as_turns, encode_rendered, parse_messages, render_chat
from tempax.data.loader import BatchLoader
from tempax.data.packing import collate_rows
from tempax.data.report import DataReport
from tempax.data.sources import Row, as_rows, read_rows
from tempax.errors import ConfigError, DataError

_HH_TURN = re.compile(r"(?:^|\n\n)(Human|Assistant):")


@dataclass(frozen=True)
class PreferenceOptions:
    """How preference rows become pairs.

    Attributes:
      max_length: the longest side in tokens (normally the sequence length); None for no limit.
      overlong: "truncate" (prompt from the left, then responses from the right) or "drop".
      max_bad_fraction: raise `DataError` when more than this fraction of rows is malformed.
    """

    max_length: int | None = None
    overlong: str = "truncate"
    max_bad_fraction: float = 0.1

    def __post_init__(self) -> None:
        if self.overlong not in ("truncate", "drop"):
            raise ConfigError(f"preference overlong must be 'truncate' or 'drop', got {self.overlong!r}")
        if self.max_length is not None and self.max_length < 2:
            raise ConfigError(f"max_length must be at least 2 tokens, got {self.max_length}")
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ConfigError(f"max_bad_fraction must be in [0, 1], got {self.max_bad_fraction}")


@dataclass(frozen=True)
class PreferencePair:
    """A tokenised pair; both sides start with the same prompt tokens."""

    chosen: Example
    rejected: Example
    source: str = ""


@dataclass(frozen=True)
class PreferenceMessages:
    """A parsed pair before tokenisation."""

    prompt: list[dict[str, Any]]
    chosen: list[dict[str, Any]]
    rejected: list[dict[str, Any]]


# ---------------------------------------------------------------------------------------------- parsing


def parse_hh_dialogue(text: str) -> list[dict[str, str]]:
    """Splits an HH-RLHF dialogue string into chat messages (Human -> user, Assistant -> assistant).

    Turn text is stripped of surrounding whitespace; an empty turn keeps content "" so the caller can count it.

    Raises:
      RowError: "wrong_format" when text comes before the first turn marker or there is no marker at all.
    """
    parts = _HH_TURN.split(text)
    if len(parts) < 3:
        raise RowError("wrong_format", "no '\\n\\nHuman:' / '\\n\\nAssistant:' turn markers")
    if parts[0].strip():
        raise RowError("wrong_format", "text before the first 'Human:' / 'Assistant:' marker")
    return [
        {"role": "user" if parts[k] == "Human" else "assistant", "content": parts[k + 1].strip()}
        for k in range(1, len(parts), 2)
    ]


def _split_shared_prompt(
    chosen: list[dict[str, Any]], rejected: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The longest shared prefix of turns, backed off so both responses start with an assistant turn."""
    for side in (chosen, rejected):
        if not any(m["role"] == "assistant" for m in side):
            raise RowError("no_assistant_turn", "a dialogue has no assistant turn")
    k = 0
    while k < min(len(chosen), len(rejected)) and chosen[k] == rejected[k]:
        k += 1

    def starts_reply(i: int) -> bool:
        return (
            i < len(chosen)
            and i < len(rejected)
            and chosen[i]["role"] == "assistant"
            and rejected[i]["role"] == "assistant"
        )

    while k > 0 and not starts_reply(k):
        k -= 1
    if k == 0:
        raise RowError("no_shared_prompt", "chosen and rejected share no prompt before an assistant turn")
    return chosen[:k], chosen[k:], rejected[k:]


def as_response(value: Any, what: str) -> list[dict[str, Any]]:
    """A reply (string: one assistant turn, or messages); an empty one is reason "empty_response"."""
    try:
        return as_turns(value, "assistant", what)
    except RowError as e:
        if e.reason == "empty_content":
            raise RowError("empty_response", e.detail) from None
        raise


def parse_preference_row(data: dict[str, Any]) -> PreferenceMessages:
    """Validates a preference row and splits it into prompt / chosen / rejected messages.

    Accepted rows:
      * explicit prompt:  {"prompt": str | messages, "chosen": str | messages, "rejected": str | messages}; string
                          responses are one assistant turn.
      * implicit prompt:  {"chosen": messages, "rejected": messages}, two full conversations; the longest shared
                          prefix of turns is the prompt.
      * Anthropic HH-RLHF: {"chosen": str, "rejected": str}, full dialogues written as
                          "\\n\\nHuman: ...\\n\\nAssistant: ...". Both are converted to messages (Human -> user,
                          Assistant -> assistant, each turn stripped) and treated as the implicit-prompt case. For
                          nearly every pair that makes the prompt everything up to the last "\\n\\nAssistant:" and
                          the responses the two final assistant turns. Splitting on turns rather than on the last
                          marker matters for the few upstream pairs whose reply itself contains a
                          "\\n\\nAssistant:" / "\\n\\nHuman:" line: their responses become several turns
                          (counted as the note "multi_turn_response"), and only the assistant turns carry loss.

    Raises:
      RowError: for a malformed row (reasons: `tokenize_preference_rows`). Identical pairs are returned; the caller
        drops them.
    """
    for key in ("chosen", "rejected"):
        if data.get(key) is None:
            raise RowError("missing_field", f"missing field {key!r} (row has {sorted(data)})")
    chosen, rejected = data["chosen"], data["rejected"]
    if data.get("prompt") is not None:
        prompt = as_turns(data["prompt"], "user", "prompt")
        return PreferenceMessages(prompt, as_response(chosen, "chosen"), as_response(rejected, "rejected"))
    if isinstance(chosen, str) and isinstance(rejected, str):
        chosen_msgs, rejected_msgs = parse_hh_dialogue(chosen), parse_hh_dialogue(rejected)
    elif isinstance(chosen, list) and isinstance(rejected, list):
        chosen_msgs, rejected_msgs = chosen, rejected
        for what, msgs in (("chosen", chosen), ("rejected", rejected)):
            for j, m in enumerate(msgs):
                if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(
                    m.get("content"), str
                ):
                    raise RowError("wrong_type", f"{what}[{j}] must be an object with string role and content")
    else:
        raise RowError(
            "wrong_type",
            "without a 'prompt', chosen and rejected must both be dialogue strings or both message lists",
        )
    prompt, chosen_resp, rejected_resp = _split_shared_prompt(chosen_msgs, rejected_msgs)
    for what, resp in (("chosen", chosen_resp), ("rejected", rejected_resp)):
        if any(not m["content"].strip() for m in resp):
            raise RowError("empty_response", f"{what} has an empty reply")
    parse_messages(prompt, "prompt")  # empty prompt turns are malformed too
    return PreferenceMessages(prompt, chosen_resp, rejected_resp)


# ---------------------------------------------------------------------------------------------- tokenisation


def _prompt_tokens(mask: np.ndarray) -> int:
    """Tokens before the first trained one: the prompt plus the template's generation prompt."""
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else len(mask)


def fit_pair(
    chosen: tuple[np.ndarray, np.ndarray],
    rejected: tuple[np.ndarray, np.ndarray],
    options: PreferenceOptions,
    report: DataReport,
    source: str,
) -> PreferencePair | None:
    """Applies the length policy to one tokenised pair; None when it is dropped.

    Length policy: when either side is longer than `max_length`, both sides lose the same number of tokens from the
    left of the prompt (keeping at least one), so the prompts stay equal (counted as truncated "prompt_left"). If the
    responses still do not fit, they are cut on the right ("response_right"). With overlong="drop" such pairs are
    dropped ("too_long").
    """
    (ct, cm), (rt, rm) = chosen, rejected
    limit = options.max_length
    excess = 0 if limit is None else max(len(ct), len(rt)) - limit
    if excess > 0:
        if options.overlong == "drop":
            report.drop("too_long")
            return None
        # Cut the same prompt tokens from both sides so the two prompts stay identical; keep one so the first
        # response token still has a predecessor.
        cut = min(excess, min(_prompt_tokens(cm), _prompt_tokens(rm)) - 1)
        cut = max(cut, 0)
        ct, cm, rt, rm = ct[cut:], cm[cut:], rt[cut:], rm[cut:]
        if max(len(ct), len(rt)) > limit:
            ct, cm, rt, rm = ct[:limit], cm[:limit], rt[:limit], rm[:limit]
            reason = "response_right"
        else:
            reason = "prompt_left"
        if not (cm[1:].any() and rm[1:].any()):
            report.drop("no_target_after_truncation")
            return None
        report.truncate(reason)
    return PreferencePair(Example(ct, cm, source), Example(rt, rm, source), source)


def tokenize_preference_rows(
    rows: Sequence[Row | dict[str, Any]],
    tokenizer: Any,
    options: PreferenceOptions = PreferenceOptions(),
    *,
    name: str | None = None,
    check: bool = True,
) -> tuple[list[PreferencePair], DataReport]:
    """Parses, tokenises and length-fits preference rows, skipping and counting bad ones.

    Each side is rendered through the chat template as prompt + response and tokenised; its loss mask covers the
    response's assistant tokens only (with the end-of-turn token, see `formats.py`).

    Counted outcomes: skipped (malformed) — invalid_json, not_an_object, missing_field, wrong_type, wrong_format,
    empty_content, empty_response, no_assistant_turn, no_shared_prompt, template_error, template_mismatch;
    dropped — identical (same chosen and rejected response), too_long, no_target_after_truncation.

    Args:
      rows: `Row`s from `sources.read_rows`, or plain dicts.
      tokenizer: a `tempax.models.tokenizer.Tokenizer`.
      options: length policy and bad-row threshold.
      name: what to call the data in the report.
      check: raise `DataError` when the malformed fraction exceeds `options.max_bad_fraction` or nothing is kept.
    """
    rows = as_rows(rows)
    report = DataReport(name=name or (rows[0].source if rows else "<empty>"))
    report.total = len(rows)
    rendered, sources = [], []
    for row in rows:
        if row.data is None:
            report.skip(row.where, row.reason, row.error or "")
            continue
        try:
            msgs = parse_preference_row(row.data)
            if msgs.chosen == msgs.rejected:
                report.drop("identical")
                continue
            n = len(msgs.prompt)
            sides = [
                render_chat(tokenizer, msgs.prompt + resp, first_trained=n) for resp in (msgs.chosen, msgs.rejected)
            ]
        except RowError as e:
            report.skip(row.where, e.reason, e.detail)
            continue
        if len(msgs.chosen) > 1 or len(msgs.rejected) > 1:
            report.note("multi_turn_response")
        rendered.extend(sides)
        sources.append(row.where)
    encoded = encode_rendered(tokenizer, rendered)
    pairs: list[PreferencePair] = []
    for i, source in enumerate(sources):
        pair = fit_pair(encoded[2 * i], encoded[2 * i + 1], options, report, source)
        if pair is not None:
            report.kept += 1
            pairs.append(pair)
    if check:
        report.check(options.max_bad_fraction)
    return pairs, report


def load_preference_pairs(
    path: str | os.PathLike,
    tokenizer: Any,
    options: PreferenceOptions = PreferenceOptions(),
    *,
    split: str | None = None,
) -> tuple[list[PreferencePair], DataReport]:
    """`read_rows` + `tokenize_preference_rows` for a file, folder or Hub id."""
    return tokenize_preference_rows(read_rows(path, split=split), tokenizer, options, name=os.fspath(path))


# ---------------------------------------------------------------------------------------------- batching


def collate_pairs(
    pairs: Sequence[PreferencePair], *, seq_len: int, pad_id: int, batch_size: int | None = None
) -> dict[str, np.ndarray]:
    """Stacks pairs into [2B, T] arrays: rows 0..B-1 chosen, rows B..2B-1 rejected (B = batch_size or len(pairs)).

    Batch layout — stacked, not interleaved: for B pairs every array is [2B, T]; rows 0..B-1 are the chosen sides
    and rows B..2B-1 the rejected sides, so pair i is rows i and B + i and one forward pass scores both. Keys and
    per-row conventions are those of `packing.py` (`tokens`, `targets`, `loss_mask`, `positions`, `segment_ids`);
    each row holds one sequence (segment id 1), right-padded. A short final batch is padded with empty pairs (all
    segment_ids 0).
    """
    b = len(pairs) if batch_size is None else batch_size
    if len(pairs) > b:
        raise ValueError(f"{len(pairs)} pairs do not fit batch_size={b}")
    empty: list[list[Example]] = [[] for _ in range(b - len(pairs))]
    rows = [[p.chosen] for p in pairs] + empty + [[p.rejected] for p in pairs] + empty
    return collate_rows(rows, seq_len=seq_len, pad_id=pad_id)


def preference_loader(
    pairs: Sequence[PreferencePair],
    *,
    batch_size: int,
    seq_len: int,
    pad_id: int,
    seed: int = 0,
    shuffle: bool = True,
    num_epochs: int | None = None,
    drop_remainder: bool = True,
) -> BatchLoader[PreferencePair, PreferencePair]:
    """Resumable batches of `batch_size` pairs as [2 * batch_size, seq_len] arrays (see `collate_pairs`)."""
    too_long = [p.source for p in pairs if max(len(p.chosen), len(p.rejected)) > seq_len]
    if too_long:
        raise DataError(
            f"{len(too_long)} preference pairs are longer than seq_len={seq_len} (first: {too_long[0]}); "
            "tokenize with PreferenceOptions(max_length=seq_len)."
        )

    def make_units(ordered: list[PreferencePair]) -> list[PreferencePair]:
        return ordered

    def collate(units: Sequence[PreferencePair]) -> dict[str, np.ndarray]:
        return collate_pairs(units, seq_len=seq_len, pad_id=pad_id, batch_size=batch_size)

    return BatchLoader(
        pairs,
        batch_size=batch_size,
        make_units=make_units,
        collate=collate,
        seed=seed,
        shuffle=shuffle,
        num_epochs=num_epochs,
        drop_remainder=drop_remainder,
        name="preference data",
    )
