"""One small tokenizer interface over `transformers.AutoTokenizer`.

Sources: a local Hugging Face folder, a Hub repo id (when online), or the tokenizer embedded in a GGUF file.
Converting a GGUF vocabulary takes `transformers` several seconds, so the converted tokenizer is saved as a
Hugging Face folder under `$TEMPAX_CACHE/tokenizers/` (default `~/.cache/tempax`), keyed by the file's path,
size and modification time; later loads read that folder in well under a second.
Everything in tempax talks to `Tokenizer`, never to the Hugging Face object directly, so chat templates,
special ids and stop tokens are resolved in one place.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import warnings
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
            hf = _gguf_tokenizer(source)
        elif gguf_file is not None and os.path.isdir(source):
            hf = _gguf_tokenizer(os.path.join(source, gguf_file))
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


def cache_root() -> str:
    """tempax's cache folder: `$TEMPAX_CACHE`, default `~/.cache/tempax`."""
    return os.environ.get("TEMPAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tempax")


def gguf_tokenizer_cache_dir(path: str | os.PathLike) -> str:
    """Where the converted tokenizer of a GGUF file is cached; a changed or moved file gets a new folder."""
    path = os.path.abspath(os.fspath(path))
    st = os.stat(path)
    key = hashlib.sha256(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    stem = os.path.splitext(os.path.basename(path))[0]
    return os.path.join(cache_root(), "tokenizers", f"{stem}-{key}")


def _gguf_tokenizer(source: str) -> Any:
    from transformers import AutoTokenizer

    if not os.path.isfile(source):
        raise CheckpointError(f"GGUF file not found: {source}")
    cached = gguf_tokenizer_cache_dir(source)
    if os.path.isfile(os.path.join(cached, "tokenizer_config.json")):
        try:
            return AutoTokenizer.from_pretrained(cached)
        except (OSError, ValueError):
            shutil.rmtree(cached, ignore_errors=True)  # a damaged cache entry is rebuilt below
    folder, name = os.path.split(os.path.abspath(source))
    hf = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    try:
        # Write to a sibling temp folder and rename, so a concurrent or interrupted run never sees half a cache.
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(cached))
        hf.save_pretrained(tmp)
        try:
            os.replace(tmp, cached)
        except OSError:  # another process won the race; its copy is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        warnings.warn(f"could not cache the tokenizer of {source} under {cached}: {e}", stacklevel=3)
    return hf
