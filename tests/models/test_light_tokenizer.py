"""What `tempax.models.light_tokenizer` leaves to `transformers`, and its deferred stand-in. Its agreement with
`transformers` on encoding, decoding, ids and chat templates is checked in `tests/models/test_gguf_tokenizer.py`
(every cached GGUF tokenizer there is served by it)."""

from __future__ import annotations

import json
import threading

import pytest

from tempax.models.light_tokenizer import DeferredTokenizer, LightTokenizer
from tests.kit.tokenizers import tiny_chat_tokenizer


@pytest.fixture
def folder(tmp_path):
    tiny_chat_tokenizer().hf.save_pretrained(tmp_path)
    return tmp_path


def _edit_config(folder, **changes) -> None:
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_plain_messages_are_rendered_here(folder):
    light = LightTokenizer(str(folder))
    text = light.render_chat([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text == tiny_chat_tokenizer().hf.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)


def test_what_it_leaves_to_transformers(folder):
    light = LightTokenizer(str(folder))
    # Messages with non-string values (tool calls, content parts) go to transformers' own preparation.
    assert light.render_chat([{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                             add_generation_prompt=True) is None
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    _edit_config(folder, chat_template="{% generation %}{{ messages[0]['content'] }}{% endgeneration %}",
                 clean_up_tokenization_spaces=True)
    light = LightTokenizer(str(folder))
    assert light.render_chat([{"role": "user", "content": "hi"}], add_generation_prompt=False) is None
    assert light.decode([1, 2], skip_special_tokens=True) is None


def test_template_errors_are_the_templates(folder):
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    _edit_config(folder, chat_template="{{ raise_exception('only user turns') }}")
    import jinja2

    with pytest.raises(jinja2.exceptions.TemplateError, match="only user turns"):
        LightTokenizer(str(folder)).render_chat([{"role": "user", "content": "hi"}], add_generation_prompt=False)


def test_the_deferred_tokenizer_loads_once_on_first_use():
    calls = []

    class Real:
        eos_token_id = 7

        def __len__(self):
            return 11

        def __call__(self, text):
            return [len(text)]

    def load():
        calls.append(1)
        return Real()

    deferred = DeferredTokenizer(load)
    assert calls == []
    threads = [threading.Thread(target=lambda: deferred.eos_token_id) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (deferred.eos_token_id, len(deferred), deferred("abc")) == (7, 11, [3])
    assert calls == [1]
