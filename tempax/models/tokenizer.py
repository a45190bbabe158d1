"""One small tokenizer interface over `transformers.AutoTokenizer`.

Sources: a local Hugging Face folder, a Hub repo id (when online), or the tokenizer embedded in a GGUF file.
Everything in tempax talks to `Tokenizer`, never to the Hugging Face object directly, so chat templates,
special ids and stop tokens are resolved in one place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

from tempax.errors import CheckpointError


@dataclass
class Tokenizer:
    """Wraps a `transformers` tokenizer.

    Attributes:
      hf: the underlying `PreTrainedTokenizerBase`.
      stop_ids: token ids that end a generation (eos plus chat end-of-turn tokens such as `<|im_end|>`).
    """

    hf: Any
    stop_ids: tuple[int, ...]

    @property
    def bos_id(self) -> int | None:
        return self.hf.bos_token_id

    @property
    def eos_id(self) -> int | None:
        return self.hf.eos_token_id

    @property
    def pad_id(self) -> int:
        """The padding id; falls back to eos (then 0) for tokenizers that define none."""
        if self.hf.pad_token_id is not None:
            return int(self.hf.pad_token_id)
        if self.hf.eos_token_id is not None:
            return int(self.hf.eos_token_id)
        return 0

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: list[dict[str, str]],
        *,
        add_generation_prompt: bool = False,
        tokenize: bool = False,
    ) -> str | list[int]:
        """Renders chat `messages` ([{role, content}]) with the model's template.

        Returns the text, or its token ids when `tokenize` is true. A tokenizer without a template falls back
        to a plain "role: content" layout so base models still work.
        """
        if self.has_chat_template:
            out = self.hf.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, tokenize=False
            )
        else:
            out = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
            if add_generation_prompt:
                out += "assistant: "
        if tokenize:
            # The template already holds any BOS it wants; do not add another.
            return self.encode(out, add_special_tokens=False)
        return out


def _stop_ids(hf: Any) -> tuple[int, ...]:
    ids: list[int] = []
    eos = hf.eos_token_id
    if isinstance(eos, int):
        ids.append(eos)
    elif isinstance(eos, (list, tuple)):
        ids.extend(int(i) for i in eos)
    vocab = hf.get_vocab()
    for name in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>"):
        if name in vocab:
            ids.append(int(vocab[name]))
    return tuple(dict.fromkeys(ids))


def wrap(hf: Any) -> Tokenizer:
    """Wraps an already loaded `transformers` tokenizer."""
    return Tokenizer(hf=hf, stop_ids=_stop_ids(hf))


def load_tokenizer(source: str | os.PathLike, *, gguf_file: str | None = None) -> Tokenizer:
    """Loads a tokenizer from a local folder, a Hub repo id, or a GGUF file.

    Args:
      source: a folder with tokenizer files, a Hub repo id, or a path to a `.gguf` file.
      gguf_file: when `source` is a folder or repo holding GGUF files, which one carries the tokenizer.
    """
    from transformers import AutoTokenizer

    source = str(source)
    try:
        if source.endswith(".gguf"):
            if not os.path.isfile(source):
                raise CheckpointError(f"GGUF file not found: {source}")
            folder, name = os.path.split(os.path.abspath(source))
            hf = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        elif gguf_file is not None:
            hf = AutoTokenizer.from_pretrained(source, gguf_file=gguf_file)
        else:
            hf = AutoTokenizer.from_pretrained(source)
    except CheckpointError:
        raise
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"could not load a tokenizer from {source!r}: {e}. Pass a folder with tokenizer.json / "
            "tokenizer_config.json, a Hub repo id, or a .gguf file."
        ) from e
    return wrap(hf)
