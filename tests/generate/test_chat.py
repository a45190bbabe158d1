"""The chat session: a reply stopped by Ctrl-C stays in the conversation and the session goes on (the command
around it: tests/cli/test_generate.py)."""

from __future__ import annotations

import io

from tempax.generate import SamplingConfig
from tempax.generate.chat import chat_loop
from tests.kit.tokenizers import tiny_chat_tokenizer as tokenizer_factory


def test_ctrl_c_in_a_reply_keeps_the_part_said_in_the_conversation(monkeypatch):
    """The stream is interrupted after "Hel" + "lo": the session says the reply stopped, the next turn's prompt
    holds the user turn and the partial reply "Hello", and the session goes on to /exit."""
    rendered = []

    def fake_stream(model, tokenizer, ids, config, chunk_size):
        rendered.append(tokenizer.decode(ids, skip_special_tokens=False))
        yield "Hel"
        yield "lo"
        if len(rendered) == 1:
            raise KeyboardInterrupt
        yield "!"

    monkeypatch.setattr("tempax.generate.chat.stream", fake_stream)
    out = io.StringIO()
    chat_loop(None, tokenizer_factory(), SamplingConfig(max_new_tokens=4), system=None, chunk=1,
              inp=io.StringIO("hi\nmore\n/exit\n"), out=out)
    assert out.getvalue() == ("you> assistant> Hello\n(reply stopped; Ctrl-C at the prompt or /exit quits)\n"
                              "you> assistant> Hello!\nyou> ")
    assert "<|im_start|>assistant\nHello<|im_end|>" in rendered[1] and "more" in rendered[1]
