"""Where tempax keeps what one run can hand to the next: GGUF tokenizers, registered models' files, dequantised
weights, compiled programs. One root folder, so pointing `TEMPAX_CACHE` at an empty folder shows a cold start.
"""

from __future__ import annotations

import os


def cache_root() -> str:
    """tempax's cache folder: `$TEMPAX_CACHE`, default `~/.cache/tempax`."""
    return os.environ.get("TEMPAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tempax")


def jax_cache_in_use() -> bool:
    """Whether JAX's persistent compilation cache is on in this process (the `tempax` command turns it on for
    every command but generation: `tempax.runtime.process.compilation_cache_env`)."""
    import jax  # imported here: the runtime layer loads before JAX starts, and only a running program asks this

    return bool(jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR"))
