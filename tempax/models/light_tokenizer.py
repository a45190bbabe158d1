"""The tokenizer of a cached GGUF tokenizer folder, served by `tokenizers` and `jinja2` alone.

`tempax generate` needs five things from a tokenizer: the chat template rendered for plain text messages, encoding,
decoding, the special ids and the vocabulary (for stop tokens). `transformers` gives them all, but importing it
costs CPU time before any of it runs (most of it checking installed package versions), which was the largest
part of a warm `tempax generate`'s time to its first token after the weights
(`docs/measurements/performance-history.md`, start-up). This backend reads the folder that
`tempax.models.tokenizer` caches for a GGUF file (a `tokenizer.json`, a `tokenizer_config.json` and the template)
and answers those five the way `transformers`' `TokenizersBackend` does, with the same `tokenizers` object
underneath; tests check them equal, text for text and id for id, on the real SmolLM2 tokenizer and the test ones.

It answers only where that equality is plain: decoding without `clean_up_tokenization_spaces`, and chat templates
without the `{% generation %}` tag, given messages whose every value is a string. Anything else (and every other
use of the tokenizer) goes to the `transformers` tokenizer, loaded on first use (`DeferredTokenizer`).
"""

from __future__ import annotations

import json
import os
import re
import threading
from datetime import datetime
from typing import Any, Callable, Sequence

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
# The named special tokens transformers passes to every chat template (its `special_tokens_map`).
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # As transformers' filter: not HTML-escaped, unlike jinja2's own `tojson`.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class LightTokenizer:
    """Encoding, decoding, special ids and plain chat templates of a saved fast-tokenizer folder (see the module
    docstring). `None` from `render_chat` or `decode` means "not answered here": ask the `transformers` one."""

    def __init__(self, folder: str):
        from tokenizers import Tokenizer as RustTokenizer

        self.backend = RustTokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        template = config.get("chat_template")
        template_file = os.path.join(folder, "chat_template.jinja")
        if template is None and os.path.isfile(template_file):
            with open(template_file, encoding="utf-8") as f:
                template = f.read()
        self.chat_template: str | None = template if isinstance(template, str) else None
        self.clean_up_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        texts = {name: _token_text(config.get(name)) for name in _SPECIAL_NAMES}
        self.special_tokens = {name: text for name, text in texts.items() if text is not None}
        self._compiled: Any = None
        self._lock = threading.Lock()

    def token_id(self, name: str) -> int | None:
        """The id of the named special token ("eos_token", ...), or None."""
        text = self.special_tokens.get(name)
        return None if text is None else self.backend.token_to_id(text)

    def vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool) -> str | None:
        if self.clean_up_spaces:
            return None
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool) -> str | None:
        if self.chat_template is None or _GENERATION_TAG.search(self.chat_template):
            return None
        if not all(isinstance(m, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in m.items())
                   for m in messages):
            return None
        plain = [dict(m) for m in messages]
        return self._template().render(messages=plain, tools=None, documents=None,
                                       add_generation_prompt=add_generation_prompt, **self.special_tokens)

    def _template(self) -> Any:
        with self._lock:
            if self._compiled is None:
                import jinja2.ext
                from jinja2.sandbox import ImmutableSandboxedEnvironment

                env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                    extensions=[jinja2.ext.loopcontrols])
                env.filters["tojson"] = _tojson
                env.globals["raise_exception"] = _raise_exception
                env.globals["strftime_now"] = _strftime_now
                self._compiled = env.from_string(self.chat_template)
            return self._compiled


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json stores it: a string, or an AddedToken dict with its content."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


class DeferredTokenizer:
    """Stands in for a `transformers` tokenizer and loads it (`load()`) on first use of any attribute, call or
    length; loading happens once, whichever thread asks first."""

    def __init__(self, load: Callable[[], Any]):
        self._load = load
        self._loaded: Any = None
        self._lock = threading.Lock()

    @property
    def resolved(self) -> bool:
        """Whether the real tokenizer has been loaded (something used it)."""
        return self._loaded is not None

    def resolve(self) -> Any:
        with self._lock:
            if self._loaded is None:
                self._loaded = self._load()
            return self._loaded

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.resolve(), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __len__(self) -> int:
        return len(self.resolve())
