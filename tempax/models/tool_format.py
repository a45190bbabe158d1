"""A model family's tool-call format: which convention its chat template implies, and how one call is written.

Two conventions cover the supported families:

    hermes   Qwen2.5 / Qwen3 and ChatML models such as SmolLM2: each call is
             `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` anywhere in the reply.
    llama3   Llama 3.x JSON calls: the whole reply is `{"name": ..., "parameters": {...}}` (several separated by
             `;` or newlines), optionally opened by `<|python_tag|>`.

This sits with the tokenizer because it is a property of the model's chat template: the environments read and
answer calls in it (`tempax.envs.tool_calls`), and the SFT data renders tool-calling transcripts in it
(`tempax.data.formats`), so a warm-start teaches exactly the text a rollout parses.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Mapping, Sequence

ToolFormat = Literal["hermes", "llama3"]
TOOL_FORMATS: tuple[str, ...] = ("hermes", "llama3")

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


def detect_tool_format(chat_template: str | None) -> ToolFormat:
    """The call convention a chat template implies: `llama3` for Llama 3.x headers (`<|start_header_id|>`) or a
    `<|python_tag|>`, else `hermes` (Qwen's `<tool_call>` tags, also the convention for plain ChatML templates
    such as SmolLM2's, which name no tool format of their own)."""
    text = chat_template or ""
    if HERMES_OPEN in text:
        return "hermes"
    if PYTHON_TAG in text or "<|start_header_id|>" in text:
        return "llama3"
    return "hermes"


def format_call(name: str, arguments: Mapping[str, Any], tool_format: ToolFormat) -> str:
    """The text a model writes to call tool `name` with `arguments` in `tool_format`."""
    if tool_format == "hermes":
        return f'{HERMES_OPEN}\n{json.dumps({"name": name, "arguments": dict(arguments)})}\n{HERMES_CLOSE}'
    if tool_format == "llama3":
        return json.dumps({"name": name, "parameters": dict(arguments)})
    raise ValueError(f"unknown tool format {tool_format!r}; choose one of {TOOL_FORMATS}")


def call_parts(entry: Any) -> tuple[str, dict[str, Any]]:
    """(name, arguments) of one call in the common tool-calling layout: OpenAI's
    `{"type": "function", "function": {"name": ..., "arguments": ...}}` or Hugging Face's flat
    `{"name": ..., "arguments": ...}`, the arguments an object or a JSON string holding one. Raises ValueError
    saying what is wrong."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"a tool call must be an object, got {type(entry).__name__}")
    body = entry.get("function", entry)
    if not isinstance(body, Mapping):
        raise ValueError('a tool call\'s "function" must be an object')
    name, arguments = body.get("name"), body.get("arguments", body.get("parameters", {}))
    if not isinstance(name, str) or not name:
        raise ValueError('a tool call needs a "name" string')
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise ValueError(f"the arguments of {name!r} are a string that is not JSON") from None
    if not isinstance(arguments, Mapping):
        raise ValueError(f"the arguments of {name!r} must be an object")
    return name, dict(arguments)


def assistant_text(content: str | None, tool_calls: Sequence[Any], tool_format: ToolFormat) -> str:
    """The reply a model writes in `tool_format` for an assistant message in the common layout: its prose, then
    each call (a Llama 3 reply that calls is the calls alone, separated by newlines, as that format has it)."""
    calls = [format_call(*call_parts(c), tool_format) for c in tool_calls]
    prose = (content or "").strip()
    if tool_format == "llama3" and calls:
        return "\n".join(calls)
    return "\n".join([prose, *calls] if prose else calls)
