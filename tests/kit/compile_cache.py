"""A persistent XLA compilation cache for tests that build several `Trainer`s of the same shapes.

Each `Trainer` jits its own step, so a test that trains, kills and resumes a run compiles the same step several
times; with the cache on, every compile after the first is a cache hit (about 10 s -> 1 s each for the tiny GRPO
step on the 2-core machine). Only the tests that ask for it use it; the setting is restored afterwards.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import jax
from jax.experimental.compilation_cache import compilation_cache

_KEYS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
         "jax_persistent_cache_min_entry_size_bytes")


@contextlib.contextmanager
def persistent_compile_cache(directory: str) -> Iterator[None]:
    """Caches every compiled executable in `directory` while the block runs."""
    before = {k: getattr(jax.config, k) for k in _KEYS}
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()  # the cache is set up once per process; make it read the new settings
    try:
        yield
    finally:
        for k, v in before.items():
            jax.config.update(k, v)
        compilation_cache.reset_cache()
