"""What kind of row a dataset holds, and the strings inside a row that are its content.

Cleaning, statistics and `tempax recommend` look at rows before any tokenizer does, so they need one answer to
"what is this row?" and "which strings in it are text to clean?". The kinds:

  messages           {"messages": [{"role", "content"}, ...]}                       chat demonstrations
  prompt_completion  {"prompt": str | messages, "completion": str | messages}
  preference         {"chosen", "rejected"} (+ optional "prompt"): str or messages  preference pairs (HH-RLHF too)
  qa                 {"question" | "problem", "answer" | "solution"}: strings       prompts with reference answers
  text               {"text": str}                                                   raw text

Only content strings are touched (message `content`, prompt, completion, chosen, rejected, question, answer,
text); roles and provenance fields (`source`, `id`, ...) are left as they are.
"""

from __future__ import annotations

from typing import Any, Callable

from tempax.errors import DataError

KINDS = ("messages", "prompt_completion", "preference", "qa", "text")

_QUESTION_KEYS = ("question", "problem")
_ANSWER_KEYS = ("answer", "solution")


def row_kind(data: dict[str, Any]) -> str | None:
    """The kind of a parsed row (see the module docstring), or None when its keys match none of them."""
    if "messages" in data:
        return "messages"
    if "chosen" in data and "rejected" in data:
        return "preference"
    if "prompt" in data and "completion" in data:
        return "prompt_completion"
    if "text" in data:
        return "text"
    if any(k in data for k in _QUESTION_KEYS) and any(k in data for k in _ANSWER_KEYS):
        return "qa"
    return None


def content_keys(data: dict[str, Any], kind: str) -> tuple[str, ...]:
    """Top-level keys holding content (a string or a list of messages) for a row of `kind`."""
    if kind == "messages":
        return ("messages",)
    if kind == "preference":
        return tuple(k for k in ("prompt", "chosen", "rejected") if k in data)
    if kind == "prompt_completion":
        return ("prompt", "completion")
    if kind == "text":
        return ("text",)
    return tuple(k for k in _QUESTION_KEYS + _ANSWER_KEYS if k in data)


def _strings_of(value: Any) -> list[str] | None:
    """The content strings of one field: a string, or the `content` of each message; None for a wrong type."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in value):
        return [m["content"] for m in value]
    return None


def content_strings(data: dict[str, Any], kind: str) -> list[str] | None:
    """Every content string of the row, in order; None when a content field has the wrong type."""
    out: list[str] = []
    for key in content_keys(data, kind):
        strings = _strings_of(data.get(key))
        if strings is None:
            return None
        out.extend(strings)
    return out


def map_content(data: dict[str, Any], kind: str, fn: Callable[[str], str]) -> dict[str, Any]:
    """A copy of the row with `fn` applied to every content string (the input row is not changed)."""
    out = dict(data)
    for key in content_keys(data, kind):
        value = data[key]
        if isinstance(value, str):
            out[key] = fn(value)
        else:
            out[key] = [{**m, "content": fn(m["content"])} for m in value]
    return out


def turn_count(data: dict[str, Any], kind: str) -> int:
    """Turns in the dialogue: messages, or prompt + completion turns; HH-RLHF strings count their markers."""
    def turns(value: Any) -> int:
        if isinstance(value, list):
            return len(value)
        if isinstance(value, str) and kind == "preference":
            return max(value.count("\n\nHuman:") + value.count("\n\nAssistant:"), 1)
        return 1

    if kind == "messages":
        return turns(data.get("messages"))
    if kind == "preference":
        return turns(data.get("prompt")) * ("prompt" in data) + turns(data.get("chosen"))
    if kind == "prompt_completion":
        return turns(data.get("prompt")) + turns(data.get("completion"))
    if kind == "qa":
        return 2
    return 1


def mixed_kinds_error(where: str, kind: str, first_kind: str, first_where: str) -> DataError:
    """The error for a row whose kind differs from the file's first row: one file holds one row format."""
    return DataError(
        f"{where}: a {kind} row in a file of {first_kind} rows (the first was {first_where}); one file must hold "
        "one row format. Split the file by format (e.g. chat rows with 'messages', preference rows with "
        "'chosen'/'rejected') and use each part separately."
    )
