"""Where tempax keeps what one run can hand to the next: GGUF tokenizers, registered models' files, dequantised
weights, compiled programs. One root folder, so pointing `TEMPAX_CACHE` at an empty folder shows a cold start.
"""

from __future__ import annotations

import os


def cache_root() -> str:
    """tempax's cache folder: `$TEMPAX_CACHE`, default `~/.cache/tempax`."""
    return os.environ.get("TEMPAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tempax")
