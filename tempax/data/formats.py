"""Rows -> token ids and a loss mask, through the tokenizer's chat template.

Three row formats are read, picked per row or forced: chat messages (tool-calling transcripts too),
prompt/completion and plain text (`render_row` says how each is rendered and trained). `FormatOptions` says which
tokens are trained and what an overlong example becomes; `render_chat` finds each trained reply for any template.
Bad rows are skipped and counted in the `DataReport` by reason (`tokenize_rows` lists them).

Token convention: `Example.loss_mask[i]` is true when token i is a training *target* (predicted from tokens[:i]).
`packing.py` shifts this into next-token `targets` / `loss_mask` arrays.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tempax.data.kinds import row_kind
from tempax.data.report import DataReport
from tempax.data.sources import Row, as_rows, read_rows
from tempax.errors import ConfigError
from tempax.models.tool_format import assistant_text, call_parts, detect_tool_format

FORMATS = ("auto", "messages", "prompt_completion", "text")
TRAIN_ON = ("assistant", "last_assistant", "all")
OVERLONG = ("truncate", "drop", "split")

# Rendered rows are tokenised in batches: the Rust tokenizer encodes a list in one call.
_ENCODE_BATCH = 256


@dataclass(frozen=True)
class FormatOptions:
    """How rows become training examples.

    Attributes:
      format: "auto" (detect per row from its keys), "messages", "prompt_completion" or "text".
      train_on: which tokens carry loss: "assistant" (the default) every assistant turn (of the completion, for
        prompt/completion rows); "last_assistant" only the final assistant turn; "all" every token of the rendered
        conversation.
      max_length: the longest example in tokens (normally the training sequence length); None for no limit.
      overlong: what to do with an example longer than `max_length`: "truncate" keeps its first `max_length`
        tokens, "drop" removes it, "split" cuts it into consecutive `max_length` chunks (for `text` rows).
        Each case is counted in the `DataReport`.
      messages_field: the key holding the chat messages.
      max_bad_fraction: raise `DataError` when more than this fraction of rows is malformed.
    """

    format: str = "auto"
    train_on: str = "assistant"
    max_length: int | None = None
    overlong: str = "truncate"
    messages_field: str = "messages"
    max_bad_fraction: float = 0.1

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ConfigError(f"data format must be one of {FORMATS}, got {self.format!r}")
        if self.train_on not in TRAIN_ON:
            raise ConfigError(f"train_on must be one of {TRAIN_ON}, got {self.train_on!r}")
        if self.overlong not in OVERLONG:
            raise ConfigError(f"overlong must be one of {OVERLONG}, got {self.overlong!r}")
        if self.max_length is not None and self.max_length < 2:
            raise ConfigError(f"max_length must be at least 2 tokens, got {self.max_length}")
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ConfigError(f"max_bad_fraction must be in [0, 1], got {self.max_bad_fraction}")


@dataclass(frozen=True, eq=False)  # arrays have no single truth value; compare fields explicitly
class Example:
    """One tokenised training example.

    Attributes:
      tokens: int32 [length] token ids.
      loss_mask: bool [length]; true where the token is a training target (predicted from the tokens before it);
        `packing.py` shifts this into next-token `targets` / `loss_mask` arrays.
      source: `file:line` of the row it came from.
    """

    tokens: np.ndarray  # [length]
    loss_mask: np.ndarray  # [length]
    source: str = field(default="", compare=False)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_targets(self) -> int:
        """Trained tokens that have a predecessor (token 0 is never predicted)."""
        return int(self.loss_mask[1:].sum())


class RowError(Exception):
    """A malformed row: `reason` is a short counter key, `detail` a human sentence."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


# ---------------------------------------------------------------------------------------------- row validation


def parse_messages(value: Any, what: str = "messages") -> list[dict[str, Any]]:
    """Checks a list of chat messages: each a dict with a string `role` and a non-empty string `content`.

    Raises:
      RowError: "wrong_type", "empty_content" or "missing_field".
    """
    if not isinstance(value, list):
        raise RowError("wrong_type", f"{what} must be a list of messages, got {type(value).__name__}")
    if not value:
        raise RowError("empty_content", f"{what} is an empty list")
    out = []
    for j, m in enumerate(value):
        if not isinstance(m, dict):
            raise RowError("wrong_type", f"{what}[{j}] must be an object, got {type(m).__name__}")
        if m.get("tool_calls"):
            out.append(_tool_call_message(m, f"{what}[{j}]"))
            continue
        if "role" not in m or "content" not in m:
            raise RowError("missing_field", f"{what}[{j}] needs 'role' and 'content'")
        if not isinstance(m["role"], str) or not isinstance(m["content"], str):
            raise RowError("wrong_type", f"{what}[{j}] role and content must be strings")
        if not m["content"].strip():
            raise RowError("empty_content", f"{what}[{j}] ({m['role']}) has empty content")
        out.append(dict(m))
    return out


def _tool_call_message(m: dict[str, Any], what: str) -> dict[str, Any]:
    """An assistant message with `tool_calls`, checked: content may be empty or absent, each call has a name and
    object arguments (a JSON string of one is decoded)."""
    if m.get("role") != "assistant":
        raise RowError("wrong_type", f"{what}: only an assistant message may carry tool_calls, not {m.get('role')!r}")
    content = m.get("content")
    if content is not None and not isinstance(content, str):
        raise RowError("wrong_type", f"{what} content must be a string or null")
    if not isinstance(m["tool_calls"], list):
        raise RowError("wrong_type", f"{what} tool_calls must be a list")
    calls = []
    for k, call in enumerate(m["tool_calls"]):
        try:
            name, arguments = call_parts(call)
        except ValueError as e:
            raise RowError("wrong_type", f"{what} tool_calls[{k}]: {e}") from None
        calls.append({"type": "function", "function": {"name": name, "arguments": arguments}})
    return {**m, "content": content or "", "tool_calls": calls}


def with_call_text(tokenizer: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages the chat template can render: an assistant message's `tool_calls` are written into its content
    in the model's call format, unless the template renders `tool_calls` itself (`render_row`)."""
    if not any(m.get("tool_calls") for m in messages):
        return messages
    template = getattr(tokenizer.hf, "chat_template", None)
    if isinstance(template, str) and "tool_calls" in template:
        return messages
    tool_format = detect_tool_format(template if isinstance(template, str) else None)
    return [{k: v for k, v in m.items() if k != "tool_calls"} | {"content": assistant_text(
        m["content"], m["tool_calls"], tool_format)} if m.get("tool_calls") else m for m in messages]


def as_turns(value: Any, role: str, what: str) -> list[dict[str, Any]]:
    """A string becomes one `role` turn; a list is checked as messages."""
    if isinstance(value, str):
        if not value.strip():
            raise RowError("empty_content", f"{what} is empty")
        return [{"role": role, "content": value}]
    return parse_messages(value, what)


def _require(data: dict[str, Any], key: str) -> Any:
    if key not in data or data[key] is None:
        raise RowError("missing_field", f"missing field {key!r} (row has {sorted(data)})")
    return data[key]


# Rows of a kind these formats do not read (`tempax.data.kinds`), and what trains on them.
_OTHER_KINDS = {
    "preference": "a preference pair (chosen/rejected), which supervised training does not read; train on pairs "
                  "with `tempax dpo` or `tempax reward-model`",
    "qa": "a question/answer row, which supervised training reads as text: set data.text_fields=[question, answer]",
}


def detect_format(data: dict[str, Any], messages_field: str = "messages") -> str:
    if messages_field in data:
        return "messages"
    if "prompt" in data and "completion" in data:
        return "prompt_completion"
    if "text" in data:
        return "text"
    kind = row_kind(data)
    if kind in _OTHER_KINDS:
        raise RowError("wrong_kind", _OTHER_KINDS[kind])
    raise RowError(
        "unknown_format",
        f"keys {sorted(data)}; expected {messages_field!r}, 'prompt' + 'completion', or 'text'",
    )


# ---------------------------------------------------------------------------------------------- chat rendering


@dataclass
class Rendered:
    """A row rendered to text, before tokenisation (`encode_rendered` turns it into tokens and a mask)."""

    text: str
    spans: list[tuple[int, int]] | None  # trained character spans; None = train every token
    plain_text: bool = False  # a `text` row: encode with special tokens and close with eos
    source: str = ""


def _trained_turns(messages: Sequence[dict[str, Any]], train_on: str, first: int) -> list[int]:
    """Indices of the assistant turns that carry loss; `first` skips a prompt's turns."""
    idx = [i for i in range(first, len(messages)) if messages[i]["role"] == "assistant"]
    if not idx:
        raise RowError("no_assistant_turn", "no assistant message to train on")
    return idx[-1:] if train_on == "last_assistant" else idx


def _stop_strings(tokenizer: Any) -> list[str]:
    strings = [tokenizer.hf.convert_ids_to_tokens(i) for i in tokenizer.stop_ids]
    return [s for s in strings if isinstance(s, str) and s]


def _locate_reply(text: str, content: str, cursor: int, stops: Sequence[str]) -> tuple[int, int]:
    """Fallback for templates that are not prefix-stable: find the reply text and its end-of-turn marker."""
    for needle in (content, content.strip()):
        pos = text.find(needle, cursor)
        if pos >= 0:
            end = pos + len(needle)
            # Take the end-of-turn marker, allowing the whitespace some templates put before it.
            rest = text[end:]
            stripped = rest.lstrip()
            for s in stops:
                if stripped.startswith(s):
                    end += len(rest) - len(stripped) + len(s)
                    break
            return pos, end
    raise RowError(
        "template_mismatch", "an assistant reply is not found verbatim in the chat-template rendering"
    )


def _apply_template(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
    import jinja2

    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    except jinja2.TemplateError as e:
        # Templates reject conversations they cannot render (e.g. "roles must alternate"): a bad row, not a crash.
        raise RowError("template_error", f"the chat template refused this conversation: {e}") from None


def render_chat(
    tokenizer: Any, messages: list[dict[str, Any]], *, train_on: str = "assistant", first_trained: int = 0
) -> Rendered:
    """Renders messages with the chat template and finds the character span of each trained reply.

    Args:
      tokenizer: a `tempax.models.tokenizer.Tokenizer`.
      messages: validated chat messages.
      train_on: "assistant", "last_assistant" or "all".
      first_trained: turns before this index are prompt and never trained (prompt/completion and preference rows).

    How the assistant mask is found, for any template: the conversation is rendered once, and for each trained
    assistant turn i the template is rendered again for `messages[:i]` with the generation prompt and for
    `messages[:i+1]`. When both renders are prefixes of the full text (true for ChatML, Llama 3, Gemma, Mistral...),
    the characters between them are turn i's reply — including the end-of-turn token the template writes after it.
    The full text is tokenised once, with character offsets, and a token is trained when it starts inside a reply
    span. Trailing template text after the last stop token of a span (ChatML's "\\n" after `<|im_end|>`) is not
    trained: the model must learn to emit `<|im_end|>`, not what the template prints after it. Templates that are
    not prefix-stable (e.g. ones that rewrite earlier turns) fall back to locating the reply text itself.
    """
    messages = with_call_text(tokenizer, messages)
    text = _apply_template(tokenizer, messages)
    if train_on == "all":
        return Rendered(text=text, spans=None)
    stops: list[str] | None = None
    spans: list[tuple[int, int]] = []
    cursor = 0
    for i in _trained_turns(messages, train_on, first_trained):
        span = None
        if i > 0:
            before = _apply_template(tokenizer, messages[:i], add_generation_prompt=True)
            through = text if i == len(messages) - 1 else _apply_template(tokenizer, messages[: i + 1])
            if cursor <= len(before) < len(through) and text.startswith(through) and through.startswith(before):
                span = (len(before), len(through))
        if span is None:
            stops = _stop_strings(tokenizer) if stops is None else stops
            span = _locate_reply(text, messages[i]["content"], cursor, stops)
        spans.append(span)
        cursor = span[1]
    return Rendered(text=text, spans=spans)


class _Encoded:
    """Token ids of one text plus a way to map character spans to token ranges."""

    def __init__(self, ids: Sequence[int], starts: np.ndarray | None = None, encoding: Any = None):
        self.ids = ids
        self._starts = starts  # [L] start character of each token, nondecreasing
        self._encoding = encoding  # a `tokenizers.Encoding`, asked lazily (building all offsets is slow)

    def token_range(self, s: int, e: int) -> tuple[int, int]:
        """[a, b): the tokens whose first character lies in [s, e)."""
        if self._starts is None and self._encoding is not None:
            enc = self._encoding
            first, last = enc.char_to_token(s), enc.char_to_token(e - 1) if e > s else None
            if first is not None and last is not None:
                a = first if enc.token_to_chars(first)[0] >= s else first + 1
                return a, last + 1
            # Characters no token covers (some normalisers drop them): fall back to the full offsets.
            self._starts = np.array(enc.offsets, dtype=np.int64).reshape(-1, 2)[:, 0]
        assert self._starts is not None
        return int(np.searchsorted(self._starts, s)), int(np.searchsorted(self._starts, e))


def _encode_batch(tokenizer: Any, texts: list[str], add_special_tokens: bool) -> list[_Encoded]:
    backend = getattr(tokenizer.hf, "backend_tokenizer", None)
    if backend is not None:
        # The Rust tokenizer behind a fast `transformers` tokenizer gives the same ids as `encode` without the
        # per-token Python objects `__call__(return_offsets_mapping=True)` builds, which cost more than encoding.
        return [_Encoded(e.ids, encoding=e) for e in backend.encode_batch(texts, add_special_tokens=add_special_tokens)]
    enc = tokenizer.hf(texts, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    return [
        _Encoded(ids, starts=np.array(offsets, dtype=np.int64).reshape(-1, 2)[:, 0])
        for ids, offsets in zip(enc["input_ids"], enc["offset_mapping"])
    ]


def _mask_from_spans(encoded: _Encoded, spans: list[tuple[int, int]], stop_ids: set[int]) -> np.ndarray:
    ids = encoded.ids
    mask = np.zeros(len(ids), dtype=bool)
    for s, e in spans:
        a, b = encoded.token_range(s, e)
        if a >= b:
            continue
        last = b - 1
        # Stop at the end-of-turn token; the template's trailing newline after it is not the model's output.
        for j in range(b - 1, a - 1, -1):
            if ids[j] in stop_ids:
                last = j
                break
        mask[a : last + 1] = True
    return mask


def encode_rendered(tokenizer: Any, rendered: Sequence[Rendered]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Tokenises rendered rows; returns (tokens int32 [L], loss_mask bool [L]) per row."""
    stop_ids = set(int(i) for i in tokenizer.stop_ids)
    eos = tokenizer.eos_id
    out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(rendered)
    for plain in (False, True):
        idx = [i for i, r in enumerate(rendered) if r.plain_text == plain]
        for b in range(0, len(idx), _ENCODE_BATCH):
            chunk = idx[b : b + _ENCODE_BATCH]
            encoded = _encode_batch(tokenizer, [rendered[i].text for i in chunk], add_special_tokens=plain)
            for i, enc in zip(chunk, encoded):
                r = rendered[i]
                tokens = np.asarray(enc.ids, dtype=np.int32)
                if plain and eos is not None and (tokens.size == 0 or tokens[-1] != eos):
                    tokens = np.append(tokens, np.int32(eos))  # documents end with eos so packed neighbours separate
                if r.spans is None:
                    mask = np.ones(tokens.shape[0], dtype=bool)
                else:
                    mask = _mask_from_spans(enc, r.spans, stop_ids)
                out[i] = (tokens, mask)
    return out  # type: ignore[return-value]


def encode_chat(
    tokenizer: Any, messages: list[dict[str, Any]], *, train_on: str = "assistant", first_trained: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Tokenises one conversation: (tokens int32 [L], loss_mask bool [L]). See `render_chat`."""
    return encode_rendered(
        tokenizer, [render_chat(tokenizer, messages, train_on=train_on, first_trained=first_trained)]
    )[0]


def render_row(data: dict[str, Any], tokenizer: Any, options: FormatOptions) -> Rendered:
    """Validates one row and renders it; raises `RowError` for a malformed row.

    The three row formats (picked per row with `format="auto"`, or forced):
      * chat:              {"messages": [{"role": "user", "content": ...}, {"role": "assistant", ...}, ...]};
                           tool-calling transcripts in the common (OpenAI / Hugging Face) layout too: an assistant
                           message with `tool_calls` ([{"type": "function", "function": {"name", "arguments"}}],
                           content empty or prose) and `tool` messages holding the results. A template that renders
                           `tool_calls` itself (Qwen's) gets them as they are; one that does not (SmolLM2's ChatML)
                           gets each call written into the reply in the model's own call format
                           (`tempax.models.tool_format`), the text a tool rollout parses. Tool results are never
                           trained: only assistant turns are.
      * prompt/completion: {"prompt": str | messages, "completion": str | messages}; a string prompt is one user
                           turn, a string completion one assistant turn. Loss goes on the completion only.
      * text:              {"text": str} for continued pre-training; tokenised with the tokenizer's own special
                           tokens plus a closing eos, every token trained.
    """
    fmt = options.format if options.format != "auto" else detect_format(data, options.messages_field)
    if fmt == "messages":
        messages = parse_messages(_require(data, options.messages_field), options.messages_field)
        return render_chat(tokenizer, messages, train_on=options.train_on)
    if fmt == "prompt_completion":
        prompt = as_turns(_require(data, "prompt"), "user", "prompt")
        completion = as_turns(_require(data, "completion"), "assistant", "completion")
        return render_chat(tokenizer, prompt + completion, train_on=options.train_on, first_trained=len(prompt))
    text = _require(data, "text")
    if not isinstance(text, str):
        raise RowError("wrong_type", f"text must be a string, got {type(text).__name__}")
    if not text.strip():
        raise RowError("empty_content", "text is empty")
    return Rendered(text=text, spans=None, plain_text=True)


# ---------------------------------------------------------------------------------------------- length policy


def fit_length(
    tokens: np.ndarray, loss_mask: np.ndarray, options: FormatOptions, report: DataReport, source: str
) -> list[Example]:
    """Applies `max_length` / `overlong` to one tokenised row and counts what happened: truncated "too_long" /
    "split"; dropped "too_long" (overlong="drop"), "no_target_after_truncation", "no_target"."""
    n = options.max_length
    if n is None or len(tokens) <= n:
        pieces, cut = [(tokens, loss_mask)], None
    elif options.overlong == "drop":
        report.drop("too_long")
        return []
    elif options.overlong == "truncate":
        pieces, cut = [(tokens[:n], loss_mask[:n])], "too_long"
    else:
        pieces, cut = [(tokens[s : s + n], loss_mask[s : s + n]) for s in range(0, len(tokens), n)], "split"
    # A piece with no trained target (only prompt left, or a 1-token tail) would add nothing but padding.
    out = [Example(t, m, source) for t, m in pieces if m[1:].any()]
    if not out:
        report.drop("no_target" if cut is None else "no_target_after_truncation")
    elif cut is not None:
        report.truncate(cut)
    return out


def tokenize_rows(
    rows: Sequence[Row | dict[str, Any]],
    tokenizer: Any,
    options: FormatOptions = FormatOptions(),
    *,
    name: str | None = None,
    check: bool = True,
) -> tuple[list[Example], DataReport]:
    """Turns rows into examples, skipping and counting malformed ones.

    Bad rows are skipped and counted in the `DataReport` by reason (`tempax.data.reasons`): invalid_utf8,
    invalid_json, not_an_object, unknown_format, wrong_kind (a preference pair or a question/answer row: the detail
    names what reads it), missing_field, wrong_type, empty_content, no_assistant_turn, template_error (the template
    raised), template_mismatch (a reply could not be found in the rendering). Length outcomes: `fit_length`.

    Args:
      rows: `Row`s from `sources.read_rows`, or plain dicts.
      tokenizer: a `tempax.models.tokenizer.Tokenizer`.
      options: format, mask and length policy.
      name: what to call the data in the report (default: the first row's source).
      check: raise `DataError` when the malformed fraction exceeds `options.max_bad_fraction` or nothing is kept.

    Returns:
      (examples, report). Examples keep row order; a "split" row yields several.
    """
    rows = as_rows(rows)
    report = DataReport(name=name or (rows[0].source if rows else "<empty>"))
    report.total = len(rows)
    rendered: list[Rendered] = []
    for row in rows:
        if row.data is None:
            report.skip(row.where, row.reason, row.error or "")
            continue
        try:
            r = render_row(row.data, tokenizer, options)
        except RowError as e:
            report.skip(row.where, e.reason, e.detail)
            continue
        r.source = row.where
        rendered.append(r)
    examples: list[Example] = []
    for r, (tokens, mask) in zip(rendered, encode_rendered(tokenizer, rendered)):
        kept = fit_length(tokens, mask, options, report, r.source)
        if kept:
            report.kept += 1
            examples.extend(kept)
    if check:
        report.check(options.max_bad_fraction)
    return examples, report


def load_examples(
    path: str | os.PathLike,
    tokenizer: Any,
    options: FormatOptions = FormatOptions(),
    *,
    split: str | None = None,
) -> tuple[list[Example], DataReport]:
    """`read_rows` + `tokenize_rows` for a file, folder or Hub id."""
    return tokenize_rows(read_rows(path, split=split), tokenizer, options, name=os.fspath(path))
