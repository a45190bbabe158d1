"""A model's tool-call format: detected from its chat template, one call written in it, and calls in the common
(OpenAI / Hugging Face) layout read and written into a reply."""

from __future__ import annotations

import pytest

from tempax.models.tool_format import assistant_text, call_parts, detect_tool_format, format_call


def test_the_format_follows_the_template():
    assert detect_tool_format("{{ '<tool_call>' }}") == "hermes"
    assert detect_tool_format("<|start_header_id|>{{ role }}") == "llama3"
    assert detect_tool_format("<|im_start|>{{ role }}") == "hermes" and detect_tool_format(None) == "hermes"


def test_a_call_in_either_layout_reads_the_same():
    """OpenAI's nested layout with JSON-string arguments and Hugging Face's flat one give the same call."""
    nested = {"id": "call_0", "type": "function", "function": {"name": "price_of", "arguments": '{"item": "tea"}'}}
    assert call_parts(nested) == call_parts({"name": "price_of", "arguments": {"item": "tea"}}) == (
        "price_of", {"item": "tea"})
    for bad, reason in [([], "must be an object"), ({"arguments": {}}, '"name" string'),
                        ({"name": "f", "arguments": "[1]"}, "must be an object"),
                        ({"name": "f", "arguments": "{"}, "not JSON")]:
        with pytest.raises(ValueError, match=reason):
            call_parts(bad)


def test_a_reply_is_its_prose_then_its_calls():
    """hermes: 'Let me look.' then each call on its own lines; llama3: the calls alone, one per line."""
    calls = [{"name": "price_of", "arguments": {"item": "tea"}}, {"name": "calculator", "arguments": {"expression": "2*3"}}]
    assert assistant_text("Let me look.", calls, "hermes") == (
        'Let me look.\n<tool_call>\n{"name": "price_of", "arguments": {"item": "tea"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>')
    assert assistant_text(None, calls, "llama3") == (
        '{"name": "price_of", "parameters": {"item": "tea"}}\n{"name": "calculator", "parameters": {"expression": "2*3"}}')
    assert format_call("f", {}, "hermes") == '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
