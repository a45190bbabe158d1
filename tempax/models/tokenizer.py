"""One small tokenizer interface over `transformers` tokenizers.

Sources: a local Hugging Face folder, a Hub repo id (when online), or the tokenizer embedded in a GGUF file.
A GGUF's tokenizer is built from its metadata by `tempax.models.gguf_tokenizer` (no PyTorch needed) and saved as
a Hugging Face folder under `$TEMPAX_CACHE/tokenizers/` (default `~/.cache/tempax`), keyed by the file's path,
size and modification time, so later loads skip reading the vocabulary out of the file.
Everything in tempax talks to `Tokenizer`, never to the Hugging Face object directly, so chat templates,
special ids and stop tokens are resolved in one place.

A loaded `Tokenizer` pickles as where it came from (`TokenizerSource`: the folder, Hub id or GGUF path given to
`load_tokenizer`), not as the live objects: the deferred `transformers` tokenizer and the light one hold locks,
and a Ray rollout worker or a worker process rebuilds it from the same source (through the same on-disk cache)
instead of receiving the whole vocabulary. A tokenizer whose vocabulary was grown after loading (`tempax
tokenizer extend`), or one wrapped around an object built in memory, pickles its `transformers` object.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

from tempax.errors import CheckpointError
from tempax.models import gguf_io, gguf_tokenizer
from tempax.models.light_tokenizer import DeferredTokenizer, LightTokenizer
from tempax.runtime.caches import cache_root


class _NoPyTorchNotice(logging.Filter):
    """Drops transformers' "PyTorch was not found. Models won't be available..." notice, printed when it is
    imported without PyTorch: tempax uses only its tokenizers, which need none, so every command in the plain
    environment would print it for nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("PyTorch was not found")


def import_transformers() -> Any:
    """The `transformers` module, imported without its PyTorch notice (the filter sits on its root logger, which
    the notice is logged on; every other message of it still shows)."""
    logger = logging.getLogger("transformers")
    if not any(isinstance(f, _NoPyTorchNotice) for f in logger.filters):
        logger.addFilter(_NoPyTorchNotice())
    import transformers as module

    return module


@dataclass(frozen=True)
class TokenizerSource:
    """What `load_tokenizer` was given: enough to load the same tokenizer again in another process.

    Attributes:
      source: the folder, Hub repo id or `.gguf` path.
      gguf_file: the GGUF file inside `source`, when `source` is a folder or repo of GGUF files.
      vocab_size: the vocabulary size at load time; a tokenizer that has grown since is not rebuilt from here.
    """

    source: str
    gguf_file: str | None
    vocab_size: int


def _rebuild(origin: TokenizerSource, stop_ids: tuple[int, ...]) -> "Tokenizer":
    """The unpickling side of `Tokenizer.__reduce__`: the tokenizer loaded again, with the stop ids it carried."""
    tokenizer = load_tokenizer(origin.source, gguf_file=origin.gguf_file)
    return tokenizer if tokenizer.stop_ids == stop_ids else Tokenizer(
        hf=tokenizer.hf, stop_ids=stop_ids, light=tokenizer.light, origin=tokenizer.origin)


@dataclass
class Tokenizer:
    """Wraps a `transformers` tokenizer.

    Attributes:
      hf: the underlying `PreTrainedTokenizerBase` (for a cached GGUF tokenizer, a stand-in that loads it on first
        use: `tempax.models.light_tokenizer.DeferredTokenizer`).
      stop_ids: token ids that end a generation (eos plus chat end-of-turn tokens such as `<|im_end|>`).
      light: where set, answers encoding, decoding, special ids and plain chat templates without `transformers`
        (`tempax.models.light_tokenizer`), with the same results, until something uses `hf` itself.
      origin: where `load_tokenizer` loaded it from (None for a tokenizer built in memory); what it pickles as.
    """

    hf: Any
    stop_ids: tuple[int, ...]
    light: LightTokenizer | None = None
    origin: TokenizerSource | None = field(default=None, compare=False)
    _bos_prefix: str | None = field(default=None, init=False, compare=False, repr=False)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickles as its `origin` (see the module docstring) while the vocabulary is the one it was loaded with;
        otherwise as the `transformers` tokenizer itself (picklable once loaded; the deferred stand-in is not)."""
        if self.origin is not None and not self._grown():
            return _rebuild, (self.origin, self.stop_ids)
        hf = self.hf.resolve() if isinstance(self.hf, DeferredTokenizer) else self.hf
        return Tokenizer, (hf, self.stop_ids)

    def _grown(self) -> bool:
        """Whether tokens were added after loading; only the `transformers` tokenizer can have been changed, so a
        deferred one nothing has reached for has not."""
        if isinstance(self.hf, DeferredTokenizer) and not self.hf.resolved:
            return False
        assert self.origin is not None
        return len(self.hf) != self.origin.vocab_size

    @property
    def _fast(self) -> LightTokenizer | None:
        """`light` while nothing has reached for the `transformers` tokenizer: once something has, it may have
        changed it (tokens added), and from then on everything goes to it."""
        if self.light is None or (isinstance(self.hf, DeferredTokenizer) and self.hf.resolved):
            return None
        return self.light

    @property
    def bos_id(self) -> int | None:
        return self._fast.token_id("bos_token") if self._fast else self.hf.bos_token_id

    @property
    def eos_id(self) -> int | None:
        return self._fast.token_id("eos_token") if self._fast else self.hf.eos_token_id

    @property
    def pad_id(self) -> int:
        """The padding id; falls back to eos (then 0) for tokenizers that define none."""
        pad = self._fast.token_id("pad_token") if self._fast else self.hf.pad_token_id
        if pad is not None:
            return int(pad)
        if self.eos_id is not None:
            return int(self.eos_id)
        return 0

    @property
    def vocab_size(self) -> int:
        return self._fast.vocab_size() if self._fast else len(self.hf)

    def _bos_text(self) -> str:
        """The BOS token's text when encoding adds BOS by default (the tokenizer's `add_bos_token`), else ""."""
        if self._bos_prefix is None:
            bos = self.bos_id
            adds = bos is not None and self.encode("a")[:1] == [bos] != self.encode("a", add_special_tokens=False)[:1]
            self._bos_prefix = self.decode([bos], skip_special_tokens=False) if adds else ""
        return self._bos_prefix

    @property
    def has_chat_template(self) -> bool:
        if self._fast:
            return bool(self._fast.chat_template)
        return bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if self._fast:
            return self._fast.encode(text, add_special_tokens=add_special_tokens)
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        if self._fast and (text := self._fast.decode(ids, skip_special_tokens=skip_special_tokens)) is not None:
            return text
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
            out = self._fast.render_chat(messages, add_generation_prompt=add_generation_prompt) if self._fast else None
            if out is None:
                out = self.hf.apply_chat_template(
                    messages, add_generation_prompt=add_generation_prompt, tokenize=False
                )
        else:
            # A model that expects BOS (Gemma, Llama) gets it at the start of the plain layout as it would from
            # a template: the text is tokenised without special tokens below and by the data pipeline.
            out = self._bos_text() + "".join(f"{m['role']}: {m['content']}\n" for m in messages)
            if add_generation_prompt:
                # No trailing space: a SentencePiece or byte-level vocabulary starts the reply with a token that
                # carries the space (" Paris"), which this way lies inside the reply, is trained, and is sampled.
                out += "assistant:"
        if tokenize:
            # The template already holds any BOS it wants; do not add another.
            return self.encode(out, add_special_tokens=False)
        return out


def _stop_ids(hf: Any) -> tuple[int, ...]:
    return stop_ids_of(hf.eos_token_id, hf.pad_token_id, hf.get_vocab())


def stop_ids_of(eos: Any, pad_id: int | None, vocab: dict[str, int]) -> tuple[int, ...]:
    """The ids that end a generation: the eos id(s) and the chat end-of-turn tokens the vocabulary has."""
    ids: list[int] = []
    if isinstance(eos, int):
        ids.append(eos)
    elif isinstance(eos, (list, tuple)):
        ids.extend(int(i) for i in eos)
    # A token the tokenizer pads with (and that is not its eos) fills the end of rows; it is not a model's reply
    # ending, even when it is spelled like one (`<|endoftext|>` as the pad of a trained tokenizer).
    pad = pad_id if pad_id not in ids else None
    for name in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>"):
        if name in vocab and vocab[name] != pad:
            ids.append(int(vocab[name]))
    return tuple(dict.fromkeys(ids))


def wrap(hf: Any) -> Tokenizer:
    """Wraps an already loaded `transformers` tokenizer."""
    return Tokenizer(hf=hf, stop_ids=_stop_ids(hf))


# tokenizer_class values that AutoTokenizer turns into the generic `tokenizers`-backed class itself.
_GENERIC_FAST_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def _generic_fast_class(folder: str) -> Any:
    """The generic fast tokenizer class when a local folder names it and has no model config, else None.

    AutoTokenizer resolves such a folder to exactly that class, but its lookup imports the model-config
    machinery, which imports PyTorch wherever PyTorch is installed (resident memory and start-up time for nothing
    tempax uses: `docs/measurements/memory.md`, "Decoding"). With a config.json beside it, AutoTokenizer may pick a model-specific class instead, so that
    case stays with AutoTokenizer.
    """
    config_path = os.path.join(folder, "tokenizer_config.json")
    if not (os.path.isfile(config_path) and os.path.isfile(os.path.join(folder, "tokenizer.json"))):
        return None
    if os.path.exists(os.path.join(folder, "config.json")):
        return None
    try:
        with open(config_path) as f:
            named = json.load(f).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None  # AutoTokenizer reports what is wrong with the file
    if named not in _GENERIC_FAST_CLASSES:
        return None
    return import_transformers().PreTrainedTokenizerFast


def load_tokenizer(source: str | os.PathLike, *, gguf_file: str | None = None) -> Tokenizer:
    """Loads a tokenizer from a local folder, a Hub repo id, or a GGUF file.

    Args:
      source: a folder with tokenizer files, a Hub repo id, or a path to a `.gguf` file.
      gguf_file: when `source` is a folder or repo holding GGUF files, which one carries the tokenizer.
    """
    source = str(source)
    try:
        if source.endswith(".gguf") or (os.path.isfile(source) and gguf_io.is_gguf_file(source)):
            tokenizer = _gguf_tokenizer(source)
        elif gguf_file is not None and os.path.isdir(source):
            tokenizer = _gguf_tokenizer(os.path.join(source, gguf_file))
        elif gguf_file is not None:
            from huggingface_hub import hf_hub_download

            tokenizer = _gguf_tokenizer(hf_hub_download(source, gguf_file))
        elif (named := _generic_fast_class(source)) is not None:
            tokenizer = wrap(named.from_pretrained(source))
        else:
            tokenizer = wrap(import_transformers().AutoTokenizer.from_pretrained(source))
    except CheckpointError:
        raise
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"could not load a tokenizer from {source!r}: {e}. Pass a folder with tokenizer.json / "
            "tokenizer_config.json, a Hub repo id, or a .gguf file."
        ) from e
    origin = TokenizerSource(os.path.abspath(source) if os.path.exists(source) else source, gguf_file,
                             tokenizer.vocab_size)
    return Tokenizer(hf=tokenizer.hf, stop_ids=tokenizer.stop_ids, light=tokenizer.light, origin=origin)


# Bumped when the way a GGUF tokenizer is built changes, so entries written by older code are not reused.
_CACHE_VERSION = "3"


def gguf_tokenizer_cache_dir(path: str | os.PathLike) -> str:
    """Where the tokenizer of a GGUF file is cached; a changed or moved file gets a new folder."""
    path = os.path.abspath(os.fspath(path))
    st = os.stat(path)
    key = hashlib.sha256(f"{_CACHE_VERSION}|{path}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    stem = os.path.splitext(os.path.basename(path))[0]
    return os.path.join(cache_root(), "tokenizers", f"{stem}-{key}")


# `save_pretrained` keeps the BOS/EOS post-processor but `from_pretrained` drops the `add_bos_token` /
# `add_eos_token` flags it came from, so the cache keeps them in a file of its own and passes them back.
_FLAGS_FILE = "tempax_flags.json"


def _save_flags(hf: Any, folder: str) -> None:
    with open(os.path.join(folder, _FLAGS_FILE), "w") as f:
        json.dump({"add_bos_token": bool(hf.add_bos_token), "add_eos_token": bool(hf.add_eos_token)}, f)


def _load_cached(folder: str) -> Any:
    with open(os.path.join(folder, _FLAGS_FILE)) as f:
        flags = json.load(f)
    return import_transformers().PreTrainedTokenizerFast.from_pretrained(folder, **flags)


def _light_cached(folder: str) -> Tokenizer:
    """A cached GGUF tokenizer with the `transformers` one loaded only when something asks for it."""
    with open(os.path.join(folder, _FLAGS_FILE)) as f:
        json.load(f)  # a damaged flags file fails here, as `_load_cached` would
    light = LightTokenizer(folder)
    stop = stop_ids_of(light.token_id("eos_token"), light.token_id("pad_token"), light.vocab())
    return Tokenizer(hf=DeferredTokenizer(lambda: _load_cached(folder)), stop_ids=stop, light=light)


def _gguf_tokenizer(source: str) -> Tokenizer:
    if not os.path.isfile(source):
        raise CheckpointError(f"GGUF file not found: {source}")
    cached = gguf_tokenizer_cache_dir(source)
    if os.path.isfile(os.path.join(cached, _FLAGS_FILE)):
        try:
            return _light_cached(cached)
        except Exception:  # noqa: BLE001 - `tokenizers` raises a bare Exception for a damaged tokenizer.json
            shutil.rmtree(cached, ignore_errors=True)  # a damaged cache entry is rebuilt below
    hf = gguf_tokenizer.gguf_file_tokenizer(source)
    try:
        # Write to a sibling temp folder and rename, so a concurrent or interrupted run never sees half a cache.
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(cached))
        hf.save_pretrained(tmp)
        _save_flags(hf, tmp)  # written last: its presence marks a complete entry
        try:
            os.replace(tmp, cached)
        except OSError:  # another process won the race; its copy is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        warnings.warn(f"could not cache the tokenizer of {source} under {cached}: {e}", stacklevel=3)
    return wrap(hf)
