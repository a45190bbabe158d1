"""The tokenizer a GGUF file describes, built from its metadata with the `tokenizers` library (no PyTorch).

A GGUF carries no `tokenizer.json`; llama.cpp stores the vocabulary as metadata, and `gguf_tokenizer` rebuilds it
(it says how, and where it deliberately differs from `transformers`) as a `transformers.PreTrainedTokenizerFast`.
`transformers`' own GGUF path reads metadata through modules that import PyTorch; this one does not, and
tests/models/test_gguf_tokenizer.py pins it token for token to `AutoTokenizer(gguf_file=...)`.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Mapping

from tempax.errors import CheckpointError
from tempax.models.gguf_io import read_gguf_header

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_SPACE = "\u2581"

# Split patterns of byte-level vocabularies, by llama.cpp's `tokenizer.ggml.pre` name. Llama 3 groups digits in
# threes; Qwen 2 splits every digit. Any other name uses GPT-2's pattern (the ByteLevel pre-tokenizer's own).
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPLIT_PATTERNS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3"), _LLAMA3_PATTERN),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_PATTERN),
}
# SmolLM's split: every digit on its own, then GPT-2's pattern (llama.cpp's "smollm" pre-tokenizer).
DIGITS_THEN_GPT2 = ("smollm",)
_GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3")


@functools.lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> character map: printable Latin-1 bytes stand for themselves, the other 68 bytes (controls,
    space, DEL, NBSP, soft hyphen) take the characters U+0100 onwards in byte order, so every byte string is
    spelled in printable characters ("Ġ" = U+0120 is the space)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in keep}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def merges_from_scores(tokens: list[str], scores: Mapping[str, float]) -> list[tuple[str, str]]:
    """BPE merges equivalent to SentencePiece's score-greedy segmentation.

    Every way of cutting a token t into two tokens (l, r) of the vocabulary is a merge l + r -> t. SentencePiece
    merges first the pair whose joined piece scores highest, so merges are ranked by the score of t, highest first;
    ties go to the longer left piece, then the longer right piece, then file order (of t, then of l, r ids).
    """
    ids = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for token in tokens:
        if token not in scores:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                key = (-scores[token], -len(left), -len(right), ids[token], ids[left], ids[right])
                ranked.append((key, left, right))
    ranked.sort(key=lambda item: item[0])
    return [(left, right) for _, left, right in ranked]


def _field(metadata: Mapping[str, Any], key: str, default: Any = None) -> Any:
    return metadata.get(f"tokenizer.{key}", default)


def _byte_level_backend(metadata: Mapping[str, Any], tokens: list[str]) -> tuple[Any, list[str]]:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    alphabet = byte_alphabet()
    spelled = set(alphabet.values())
    # llama.cpp writes most tokens in the byte alphabet, but some converters store a token's plain text: respell it.
    vocab_tokens = [t if set(t) <= spelled else "".join(alphabet[b] for b in t.encode("utf-8")) for t in tokens]
    vocab = {t: i for i, t in enumerate(vocab_tokens)}
    merges = _field(metadata, "ggml.merges")
    if merges is not None:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    else:  # no merges listed: the vocabulary order is the merge order
        pairs = merges_from_scores(vocab_tokens, {t: -i for i, t in enumerate(vocab_tokens)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, continuing_subword_prefix="",
                                   end_of_word_suffix=""))
    pre = _field(metadata, "ggml.pre")
    pattern = SPLIT_PATTERNS.get(pre)
    if pre in DIGITS_THEN_GPT2:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    elif pattern is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    backend.decoder = decoders.ByteLevel()
    return backend, vocab_tokens


def _sentencepiece_backend(metadata: Mapping[str, Any], tokens: list[str], unk: str | None,
                           architecture: str) -> tuple[Any, list[str]]:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    gemma = architecture in _GEMMA_ARCHITECTURES
    if gemma:
        tokens = [_SPACE * len(t) if t and not t.strip(" ") else t for t in tokens]
        scores = {t: -float(i) for i, t in enumerate(tokens)}
    else:
        raw = _field(metadata, "ggml.scores")
        if raw is None:
            raise CheckpointError("the GGUF's SentencePiece vocabulary has no tokenizer.ggml.scores: the merge "
                                  "order cannot be recovered. Convert the model again with llama.cpp.")
        scores = {}
        for t, s in zip(tokens, raw):
            scores.setdefault(t, float(s))
    merges = _field(metadata, "ggml.merges")
    pairs = [tuple(m.split(" ", 1)) for m in merges] if merges is not None else merges_from_scores(tokens, scores)
    vocab = {t: i for i, t in enumerate(tokens)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=pairs, unk_token=unk if unk in vocab else None,
                                   fuse_unk=True, byte_fallback=True))
    steps = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:  # Gemma adds no prefix space and splits nothing: every space is one "▁"
        backend.normalizer = normalizers.Replace(" ", _SPACE)
    else:
        prefix = bool(_field(metadata, "ggml.add_space_prefix", True))
        backend.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=_SPACE, prepend_scheme="first" if prefix else "never", split=False)
        if prefix:
            steps.append(decoders.Strip(content=" ", left=1))
    backend.decoder = decoders.Sequence(steps)
    return backend, tokens


def gguf_tokenizer(metadata: Mapping[str, Any], *, source: str = "the GGUF file") -> Any:
    """A `transformers.PreTrainedTokenizerFast` built from a GGUF file's metadata.

    A GGUF carries no `tokenizer.json`; llama.cpp stores the vocabulary as metadata: `tokenizer.ggml.model` (which
    algorithm), `tokens`, `token_type` (1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte), `scores`, `merges`,
    `pre` (the pre-tokenizer's name), the special token ids, `add_bos_token` / `add_eos_token`, and
    `tokenizer.chat_template`. Two algorithms cover the Llama, Qwen, SmolLM2 and Gemma families:

    * `gpt2` (SmolLM2, Qwen, Llama 3): byte-level BPE. Tokens are spelled in GPT-2's byte alphabet (each byte mapped
      to one printable character), the merges are listed in the file, and text is split by a regular expression
      before merging: GPT-2's own by default, Llama 3's or Qwen 2's when `pre` names one of them, and for SmolLM's
      ("smollm") every digit alone first.
    * `llama` (Llama 1/2, Mistral, Gemma): SentencePiece BPE. Spaces become U+2581 ("▁"), characters outside the
      vocabulary fall back to `<0xNN>` byte tokens, and the file lists no merges: the merge order is the score order
      (SentencePiece merges the adjacent pair whose joined piece scores highest). Gemma's scores do not follow its
      merge order, so for Gemma architectures the token's position in the file is the score, and Gemma files spell
      whitespace-only tokens with real spaces where the model looks them up as "▁" runs.

    Control and user-defined tokens are matched whole in the text (as llama.cpp does). The result is wrapped as a
    `transformers.PreTrainedTokenizerFast`, so chat templates, special tokens and decoding work as for any Hugging
    Face tokenizer.

    We deliberately differ from `transformers` in one place: a SentencePiece file's `add_space_prefix` flag is
    honoured (transformers always prepends "▁"); files that omit the flag get the prefix, as llama.cpp does.

    Args:
      metadata: the file's key/value metadata (`tempax.models.gguf_io.read_gguf_header(path).metadata`).
      source: how errors name the file.
    """
    from tokenizers import AddedToken

    from tempax.models.tokenizer import import_transformers  # that module imports this one when it loads

    PreTrainedTokenizerFast = import_transformers().PreTrainedTokenizerFast

    kind = _field(metadata, "ggml.model")
    tokens = _field(metadata, "ggml.tokens")
    if kind is None or tokens is None:
        raise CheckpointError(f"{source} carries no tokenizer (no tokenizer.ggml.model / tokens metadata). "
                              "Pass a tokenizer folder or Hub id with --tokenizer.")
    tokens = [str(t) for t in tokens]
    types = [int(t) for t in _field(metadata, "ggml.token_type", [_NORMAL] * len(tokens))]
    architecture = str(metadata.get("general.architecture", ""))

    def token(key: str) -> str | None:
        i = _field(metadata, f"ggml.{key}")
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    if kind == "gpt2":
        backend, spelled = _byte_level_backend(metadata, tokens)
        alphabet = set(byte_alphabet().values())
        # A "control" token outside the byte alphabet is a converter's mislabel; adding it would grow the vocabulary.
        control_ok = [set(t) <= alphabet for t in tokens]
        add_bos_default = False
    elif kind == "llama":
        backend, spelled = _sentencepiece_backend(metadata, tokens, token("unknown_token_id"), architecture)
        control_ok = [True] * len(tokens)
        add_bos_default = True  # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise
    else:
        raise CheckpointError(
            f"{source}: tokenizer.ggml.model {kind!r} is not supported (supported: 'gpt2' byte-level BPE, 'llama' "
            "SentencePiece BPE). Pass a tokenizer folder or Hub id with --tokenizer."
        )
    present = set(spelled)
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                for t, kind_, ok in zip(tokens, types, control_ok) if kind_ == _CONTROL and ok])
    backend.add_tokens([AddedToken(t, normalized=False, special=False)
                        for t, kind_ in zip(tokens, types) if kind_ == _USER_DEFINED and t in present])
    specials = {name: token(key) for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                                                    ("unk_token", "unknown_token_id"),
                                                    ("pad_token", "padding_token_id"))}
    hf = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        add_bos_token=bool(_field(metadata, "ggml.add_bos_token", add_bos_default)),
        add_eos_token=bool(_field(metadata, "ggml.add_eos_token", False)),
        clean_up_tokenization_spaces=False,
        **{k: v for k, v in specials.items() if v is not None},
    )
    template = _field(metadata, "chat_template")
    if template:
        hf.chat_template = str(template)
    return hf


def gguf_file_tokenizer(path: str | os.PathLike) -> Any:
    """`gguf_tokenizer` of the file at `path`."""
    path = os.fspath(path)
    return gguf_tokenizer(read_gguf_header(path).metadata, source=path)
