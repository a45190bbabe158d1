"""The process's C heap: handing the pages glibc's malloc keeps free back to the OS.

XLA:CPU allocates buffers (model construction, compilation, a step's temporaries) with malloc, and glibc keeps
freed blocks below its mmap threshold (which rises as large blocks are freed) in the heap instead of unmapping
them, so they stay in the resident set and the next program's buffers land on top of them. Loops that
alternate programs (a generation request, a reference pass, a train step) call `release_free_heap` between
them. Process tuning rather than a feature of any layer, so it sits in the runtime layer beneath them all
(generation, training and the RL sources call it). Also what the machine has free (`available_memory`) and
what this process holds (`resident_memory`), read by the training memory plan and the decode engine's cache
check before they allocate.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any


@functools.cache
def _libc_malloc_trim() -> Any:
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "malloc_trim", None)
    except OSError:
        return None


def release_free_heap() -> bool:
    """Hands the memory glibc's malloc holds free back to the OS (`malloc_trim(0)`); False where there is no glibc.

    Worth its few milliseconds after a model's init, a compilation or a rollout's batch: glibc otherwise keeps
    that freed heap resident (up to gigabytes after a GRPO step's first compilation;
    `docs/measurements/memory.md`).
    """
    trim = _libc_malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def available_memory() -> int | None:
    """Bytes the kernel says new allocations can take without swapping (MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def resident_memory() -> int:
    """Bytes this process holds in memory now (its resident set), 0 where unknown."""
    try:
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
