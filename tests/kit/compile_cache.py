"""Persistent XLA compilation caches for tests.

The session keeps one (tests/conftest.py): each `Trainer` jits its own step, so a test that trains, kills and
resumes a run compiles the same step several times, and many tests build the same tiny models' programs; with the
cache on, every compile after the first is a cache hit (about 10 s -> 1 s each for the tiny GRPO step on the 2-core
machine). `persistent_compile_cache` points a block at a folder of its own (one kept across sessions, say);
`no_persistent_compile_cache` turns the cache off for code that behaves differently with it on.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import jax
from jax.experimental.compilation_cache import compilation_cache

_KEYS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
         "jax_persistent_cache_min_entry_size_bytes")


@contextlib.contextmanager
def _cache_settings(values: dict) -> Iterator[None]:
    """JAX's cache settings `values` while the block runs; the settings before are restored afterwards."""
    before = {k: getattr(jax.config, k) for k in _KEYS}
    for k, v in values.items():
        jax.config.update(k, v)
    compilation_cache.reset_cache()  # the cache is set up once per process; make it read the new settings
    try:
        yield
    finally:
        for k, v in before.items():
            jax.config.update(k, v)
        compilation_cache.reset_cache()


def persistent_compile_cache(directory: str) -> contextlib.AbstractContextManager[None]:
    """Caches every compiled executable in `directory` while the block runs."""
    return _cache_settings({"jax_compilation_cache_dir": str(directory),
                            "jax_persistent_cache_min_compile_time_secs": 0.0,
                            "jax_persistent_cache_min_entry_size_bytes": 0})


def no_persistent_compile_cache() -> contextlib.AbstractContextManager[None]:
    """JAX's persistent cache off while the block runs (the test session turns it on: tests/conftest.py), for
    code whose behaviour depends on it being off."""
    return _cache_settings({"jax_compilation_cache_dir": None})
