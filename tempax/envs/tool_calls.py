"""Tool calls in the model's own format: finding them in a reply, writing them, and rendering tool results.

Two conventions cover the supported families, chosen from the chat template's text (`detect_tool_format`, in
`tempax.models.tool_format` beside the tokenizer, so the SFT data renders transcripts in the same format):

    hermes   Qwen2.5 / Qwen3 and ChatML models such as SmolLM2: each call is
             `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` anywhere in the reply.
    llama3   Llama 3.x JSON calls: the whole reply is `{"name": ..., "parameters": {...}}` (several separated by
             `;` or newlines), optionally opened by `<|python_tag|>`.

Parsing fails soft: a call that cannot be read becomes a `MalformedCall` with the reason, which the environment
sends back to the model as the tool result. Nothing here raises on model output, and nothing in the reply is ever
executed: a Llama "python_tag" reply that is not JSON (a code-style built-in call) is reported as malformed.

Tool results go back as `{"role": "tool", "name": ..., "content": ...}` messages through the chat template:
Qwen's template wraps them in `<tool_response>` inside a user turn, Llama 3.1's renders an `ipython` header,
and a plain ChatML template (SmolLM2's) renders a `tool` turn. `render_continuation` gives the text that new
messages add after an existing conversation, which is what a multi-turn rollout appends to its context.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from tempax.errors import TempaxError
from tempax.models.tokenizer import Tokenizer
from tempax.models.tool_format import (HERMES_CLOSE, HERMES_OPEN, PYTHON_TAG, TOOL_FORMATS, ToolFormat,
                                       detect_tool_format, format_call)

__all__ = ["HERMES_CLOSE", "HERMES_OPEN", "PYTHON_TAG", "TOOL_FORMATS", "MalformedCall", "ParsedReply", "ToolCall",
           "ToolFormat", "ToolTemplateError", "detect_tool_format", "parse_tool_calls", "render_continuation",
           "render_tool_call", "tool_message"]
# End-of-message markers a Llama reply may still carry when decoded with special tokens kept.
_LLAMA_END_MARKERS = ("<|eom_id|>", "<|eot_id|>")
_HERMES_CALL = re.compile(re.escape(HERMES_OPEN) + r"(.*?)(?:" + re.escape(HERMES_CLOSE) + r"|\Z)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: the tool's name and its JSON arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class MalformedCall:
    """A call the parser could not read: the text it saw and why (said to the model as the tool result)."""

    text: str
    reason: str


@dataclass(frozen=True)
class ParsedReply:
    """An assistant reply split into its prose (`content`, calls removed), its calls and its unreadable calls,
    in the order they appeared."""

    content: str
    calls: tuple[ToolCall, ...] = ()
    malformed: tuple[MalformedCall, ...] = ()
    order: tuple[ToolCall | MalformedCall, ...] = field(default=(), repr=False)

    @property
    def has_calls(self) -> bool:
        return bool(self.order)


class ToolTemplateError(TempaxError):
    """The chat template cannot render the tool turns an environment needs."""


def _call_from_object(obj: Any, text: str, arguments_key: str) -> ToolCall | MalformedCall:
    """A `ToolCall` from a decoded JSON value, or the reason it is not one. Arguments may also come as a JSON
    string holding an object (OpenAI's wire form), and under either key name."""
    if not isinstance(obj, dict):
        return MalformedCall(text, f"a tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return MalformedCall(text, 'a tool call needs a "name" string')
    other_key = "parameters" if arguments_key == "arguments" else "arguments"
    args = obj.get(arguments_key, obj.get(other_key, {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return MalformedCall(text, f'"{arguments_key}" of {name!r} is a string that is not JSON')
    if not isinstance(args, dict):
        return MalformedCall(text, f'"{arguments_key}" of {name!r} must be a JSON object')
    return ToolCall(name, args)


def _decode(body: str) -> tuple[Any, str | None]:
    try:
        return json.loads(body), None
    except json.JSONDecodeError as e:
        return None, f"invalid JSON ({e.msg} at character {e.pos})"


def _parse_hermes(text: str) -> ParsedReply:
    order: list[ToolCall | MalformedCall] = []
    for match in _HERMES_CALL.finditer(text):
        body = match.group(1).strip()
        obj, problem = _decode(body)
        order.append(MalformedCall(body, problem) if problem else _call_from_object(obj, body, "arguments"))
    content = _HERMES_CALL.sub("", text).strip()
    return _reply(content, order)


def _parse_llama3(text: str) -> ParsedReply:
    body = text.strip()
    for marker in _LLAMA_END_MARKERS:
        body = body.removesuffix(marker).rstrip()
    tagged = body.startswith(PYTHON_TAG)
    body = body.removeprefix(PYTHON_TAG).strip()
    if not body.startswith("{"):
        if tagged:  # a code-style built-in call: reported, never run
            return _reply("", [MalformedCall(body, "only JSON tool calls are supported after <|python_tag|>")])
        return ParsedReply(content=text.strip())
    decoder = json.JSONDecoder()
    order: list[ToolCall | MalformedCall] = []
    pos = 0
    while pos < len(body):
        try:
            obj, end = decoder.raw_decode(body, pos)
        except json.JSONDecodeError as e:
            order.append(MalformedCall(body[pos:], f"invalid JSON ({e.msg} at character {e.pos - pos})"))
            break
        order.append(_call_from_object(obj, body[pos:end], "parameters"))
        pos = end
        while pos < len(body) and body[pos] in " \t\r\n;":
            pos += 1
    return _reply("", order)


def _reply(content: str, order: list[ToolCall | MalformedCall]) -> ParsedReply:
    return ParsedReply(
        content=content,
        calls=tuple(c for c in order if isinstance(c, ToolCall)),
        malformed=tuple(c for c in order if isinstance(c, MalformedCall)),
        order=tuple(order),
    )


def parse_tool_calls(text: str, tool_format: ToolFormat) -> ParsedReply:
    """Splits an assistant reply into prose and tool calls in `tool_format`; never raises on the reply's text.
    A Hermes call left open at the end of the reply (generation stopped on the close tag) is read to the end."""
    if tool_format == "hermes":
        return _parse_hermes(text)
    if tool_format == "llama3":
        return _parse_llama3(text)
    raise ValueError(f"unknown tool format {tool_format!r}; choose one of {TOOL_FORMATS}")


def render_tool_call(call: ToolCall, tool_format: ToolFormat) -> str:
    """The text a model writes for `call` in `tool_format` (for demonstrations in an SFT warm-start)."""
    return format_call(call.name, call.arguments, tool_format)


def tool_message(name: str, content: str) -> dict[str, str]:
    """The chat message carrying one tool result (`tool` role; each template renders it its own way)."""
    return {"role": "tool", "name": name, "content": content}


def render_continuation(
    tokenizer: Tokenizer, history: Sequence[dict[str, Any]], new_messages: Sequence[dict[str, Any]]
) -> str:
    """The text `new_messages` add after `history`, ending with the prompt for the next assistant turn.

    Computed as render(history + new, generation prompt) minus render(history): it needs a template that renders
    earlier turns the same whatever follows them. One that does not (or that rejects a `tool` turn) raises
    `ToolTemplateError`, since appending only the new text would then feed the model a different conversation.
    """
    try:
        before = str(tokenizer.apply_chat_template(list(history)))
        after = str(tokenizer.apply_chat_template(list(history) + list(new_messages), add_generation_prompt=True))
    except Exception as e:  # jinja raises its own errors (e.g. "roles must alternate") from inside the template
        roles = sorted({m["role"] for m in new_messages})
        raise ToolTemplateError(
            f"the chat template cannot render {roles} turns after this conversation ({type(e).__name__}: {e}); "
            "use a model whose template accepts a tool role (Qwen, Llama 3.x, ChatML) or set a chat template"
        ) from None
    if not after.startswith(before):
        raise ToolTemplateError(
            "the chat template renders earlier turns differently once tool turns follow them, so a conversation "
            "cannot be continued by appending; use a template that keeps earlier turns as they were"
        )
    return after[len(before):]
