"""Why a row was not used, or was changed: the one vocabulary of every data report.

`tempax data stats`, `tempax data clean` and the training commands (their `DataReport`) count rows under these
names, and name each bad row by `file:line` (`tempax.data.sources.Row.where`) with its reason and a detail. The
same file gives the same totals everywhere: a row is one non-blank line of a JSON Lines file (one item of a JSON
list, one row of a parquet file or a saved dataset), and a row that is not valid JSON is one row.

Which outcome a reason is depends on the tool: an empty message is malformed for training (there is nothing to
learn from it) and a filter's drop for `tempax data clean` (`filters.drop_empty_turns`); its name is the same.
`DataReport` refuses a name that is not here, so a new reason is added here, with its sentence, first.
"""

from __future__ import annotations

# Malformed: the row cannot be read as a row of the kind the command uses. Training skips it and counts it towards
# `data.max_bad_fraction`; `tempax data clean` skips it (its `max_bad_fraction`); `tempax data stats` skips it.
MALFORMED: dict[str, str] = {
    "invalid_utf8": "the line is not UTF-8",
    "invalid_json": "the line is not JSON",
    "not_an_object": "the line is JSON but not an object",
    "unknown_format": "an object without the keys of any row kind (messages; prompt + completion; chosen + "
                      "rejected; question + answer; text)",
    "wrong_kind": "a row of a kind this command does not train on (a preference pair given to SFT); the detail "
                  "names the command that does",
    "missing_field": "a field the row's kind needs is missing",
    "wrong_type": "a field holds a value of the wrong type",
    "wrong_format": "a field's text is not laid out as expected (an HH-RLHF dialogue without its Human: / "
                    "Assistant: markers)",
    "empty_content": "a message, prompt, completion or text is empty",
    "empty_response": "a preference pair's chosen or rejected reply is empty",
    "no_assistant_turn": "no assistant message to train on",
    "no_shared_prompt": "the chosen and rejected dialogues share no prompt",
    "template_error": "the chat template refused the conversation",
    "template_mismatch": "a reply is not found verbatim in the chat template's rendering",
}

# Dropped: a well-formed row a setting removes (each names its setting where it is reported).
DROPPED: dict[str, str] = {
    "too_long": "longer than the limit: train.seq_len tokens with data.overlong=drop; filters.max_chars / "
                "filters.max_words in tempax data clean",
    "no_target": "nothing in the row is trained (no token under the loss mask)",
    "no_target_after_truncation": "cutting the row to train.seq_len left no trained token",
    "identical": "the chosen and rejected replies are the same",
    "empty_content": "a content string is empty after normalising (tempax data clean, filters.drop_empty_turns)",
    "too_short": "fewer characters or words than filters.min_chars / filters.min_words",
    "low_alpha": "too small a share of letters (filters.min_alpha_fraction)",
    "bad_chars": "too large a share of control or replacement characters (filters.max_bad_char_fraction)",
    "repetitive": "too many repeated word n-grams (filters.max_repeated_ngram_fraction)",
    "contaminated": "shares word n-grams with an evaluation set (decontaminate)",
    "exact_duplicate": "the same normalised text as an earlier kept row",
    "near_duplicate": "nearly the same text as an earlier kept row (MinHash, near_dedup.threshold)",
}

# Truncated: a kept row cut to fit train.seq_len.
TRUNCATED: dict[str, str] = {
    "too_long": "cut to its first train.seq_len tokens (data.overlong=truncate)",
    "split": "cut into consecutive train.seq_len chunks (data.overlong=split)",
    "prompt_left": "both sides of a pair lost the same tokens from the left of their shared prompt",
    "response_right": "a pair's replies were cut on the right after the prompt was cut as far as it goes",
}

# Notes: a kept row worth knowing about.
NOTES: dict[str, str] = {
    "multi_turn_response": "an HH-RLHF pair whose reply holds a Human: / Assistant: line of its own, so it is several "
                           "turns (only the assistant turns are trained)",
}

# Reasons a larger `max_bad_fraction` does not fix: the detail of such a row says what does.
NOT_A_THRESHOLD_MATTER = frozenset({"wrong_kind"})


def check(reason: str, outcome: dict[str, str]) -> str:
    """`reason`, when `outcome` (one of the tables above) holds it; else a `ValueError` (a name used before being
    defined here is a bug, not bad input)."""
    if reason not in outcome:
        raise ValueError(f"row outcome {reason!r} is not in tempax.data.reasons; add it there with its sentence")
    return reason
