"""Tokenizers fitted to a corpus, and new tokens added to a model's tokenizer.

`train_bpe` trains a byte-level BPE (the GPT-2 / Llama 3 / SmolLM2 scheme: text -> UTF-8 bytes -> merges, so any
string encodes and decodes losslessly) with the Hugging Face `tokenizers` library, adds special tokens and a
ChatML chat template, and wraps it as a `transformers.PreTrainedTokenizerFast`; `save_tokenizer` writes a folder
that `transformers.AutoTokenizer` and `tempax.models.tokenizer.load_tokenizer` load.

`extend_model` adds tokens to a model's tokenizer and grows its embedding / LM head with mean-initialised rows
(`tempax.models.vocab.resize_vocab`), then saves both as one Hugging Face folder that `tempax pretrain` /
`tempax sft` take as `model.source`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

from tempax.data.kinds import content_strings, row_kind
from tempax.data.sources import iter_rows
from tempax.errors import ConfigError, DataError
from tempax.models.tokenizer import Tokenizer, import_transformers, wrap
from tempax.models.registry import load

# SmolLM2-style ChatML without a default system prompt.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Ids 0, 1, 2 in this order: pad / document end, bos (turn start), eos (end of turn).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def corpus_texts(paths: Sequence[str]) -> Iterator[str]:
    """Every content string of every row of `paths` (any row kind the data layer reads); a `.txt` file gives
    one text per paragraph (blank-line separated)."""
    for path in paths:
        if not os.path.exists(path):
            raise DataError(f"tokenizer corpus file not found: {path}; pass existing .jsonl/.json/.parquet/.txt files")
        if path.endswith(".txt"):
            try:
                with open(path, encoding="utf-8") as f:
                    for para in f.read().split("\n\n"):
                        if para.strip():
                            yield para
            except (OSError, UnicodeDecodeError) as e:
                raise DataError(f"cannot read {path}: {e}; a .txt corpus must be UTF-8 text") from e
            continue
        for row in iter_rows(path):
            kind = row_kind(row.data) if row.data is not None else None
            for s in (content_strings(row.data, kind) if kind else None) or ():
                if s:
                    yield s


def train_bpe(
    texts: Iterable[str],
    vocab_size: int,
    *,
    special_tokens: Sequence[str] = SPECIAL_TOKENS,
    chat_template: str | None = CHATML_TEMPLATE,
    min_frequency: int = 2,
) -> Tokenizer:
    """A byte-level BPE tokenizer of `vocab_size` tokens (special tokens and the 256 byte symbols included).

    The first three special tokens are pad, bos and eos (see `SPECIAL_TOKENS`). No normaliser is applied, so
    `decode(encode(text)) == text` for every string.
    """
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    PreTrainedTokenizerFast = import_transformers().PreTrainedTokenizerFast

    if len(special_tokens) < 3:
        raise ConfigError(f"special_tokens needs at least pad, bos and eos (3 tokens), got {list(special_tokens)}")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(special_tokens):
        raise ConfigError(f"vocab_size {vocab_size} is below the {len(alphabet)} byte symbols + "
                          f"{len(special_tokens)} special tokens a byte-level BPE needs")
    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(special_tokens),
        initial_alphabet=alphabet, show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    pad, bos, eos = special_tokens[:3]
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=pad, bos_token=bos, eos_token=eos,
                                 clean_up_tokenization_spaces=False)
    if chat_template is not None:
        hf.chat_template = chat_template
    return wrap(hf)


def save_tokenizer(tokenizer: Tokenizer, folder: str) -> str:
    """Writes tokenizer.json, tokenizer_config.json (with the chat template) and special_tokens_map.json."""
    os.makedirs(folder, exist_ok=True)
    tokenizer.hf.save_pretrained(folder)
    return folder


def tokens_per_char(tokenizer: Tokenizer, texts: Sequence[str]) -> float:
    """Compression: tokens / characters over `texts` (no special tokens); lower is better compression."""
    chars = sum(len(t) for t in texts)
    if not chars:
        raise DataError("no held-out text to measure compression on")
    return sum(len(tokenizer.encode(t, add_special_tokens=False)) for t in texts) / chars


def roundtrip_exact(tokenizer: Tokenizer, texts: Sequence[str]) -> tuple[int, int]:
    """(texts with decode(encode(text)) == text, texts)."""
    exact = sum(tokenizer.decode(tokenizer.encode(t, add_special_tokens=False), skip_special_tokens=False) == t
                for t in texts)
    return exact, len(texts)


def heldout_report(tokenizer: Tokenizer, texts: Sequence[str],
                   compare: Mapping[str, Tokenizer] | None = None) -> dict[str, Any]:
    """How a tokenizer does on held-out `texts`: how many round-trip exactly, and its tokens per character beside
    those of the `compare` tokenizers (name -> tokenizer), each rounded to 4 places."""
    exact, n = roundtrip_exact(tokenizer, texts)
    report: dict[str, Any] = {"heldout_texts": n, "roundtrip_exact": exact,
                              "tokens_per_char": round(tokens_per_char(tokenizer, texts), 4)}
    for name, other in (compare or {}).items():
        report[f"tokens_per_char[{name}]"] = round(tokens_per_char(other, texts), 4)
    return report


@dataclass(frozen=True)
class Extended:
    """What `extend_model` did."""

    folder: str
    added: dict[str, int]  # new token -> its id
    old_vocab: int  # embedding rows before
    new_vocab: int  # embedding rows after


def extend_model(source: str, new_tokens: Sequence[str], folder: str) -> Extended:
    """Adds `new_tokens` to the tokenizer of `source`, grows its embedding / LM head (new rows = mean of the old
    ones) and saves model + tokenizer to `folder` (a Hugging Face checkpoint `tempax.load` and transformers read).

    Tokens the tokenizer already has are not added again.

    Raises:
      ConfigError: no new token to add, or the model source has no tokenizer (a preset).
    """
    # The model modules import JAX; training a tokenizer alone does not need it.
    from tempax.models.hf_io import save_hf_checkpoint
    from tempax.models.vocab import resize_vocab

    tokens = [t for t in dict.fromkeys(new_tokens) if t]
    if not tokens:
        raise ConfigError("no tokens to add; pass them with --tokens or --tokens-file")
    model, tokenizer = load(source, progress=False)
    if tokenizer is None:
        raise ConfigError(f"{source} has no tokenizer to extend (a preset); pass a checkpoint with its tokenizer")
    vocab = tokenizer.hf.get_vocab()
    fresh = [t for t in tokens if t not in vocab]
    if not fresh:
        raise ConfigError(f"every token given is already in the tokenizer of {source}; nothing to add")
    tokenizer.hf.add_tokens(fresh)
    added = {t: int(tokenizer.hf.convert_tokens_to_ids(t)) for t in fresh}
    old = model.config.vocab_size
    # A padded embedding (more rows than tokens) may already have room for the new ids.
    new = max(old, len(tokenizer.hf))
    model = resize_vocab(model, new) if new > old else model
    save_hf_checkpoint(model, folder, tokenizer=tokenizer)
    return Extended(folder=folder, added=added, old_vocab=old, new_vocab=new)


def describe_tokenizer(tokenizer: Tokenizer) -> dict[str, Any]:
    """Vocabulary size and special ids, for reports."""
    return {"vocab_size": tokenizer.vocab_size, "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id,
            "pad_id": tokenizer.pad_id, "stop_ids": list(tokenizer.stop_ids),
            "chat_template": tokenizer.has_chat_template}
