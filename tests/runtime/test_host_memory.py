"""tempax.runtime.host_memory: giving glibc's free heap back to the OS."""

from __future__ import annotations

import os
import platform
import sys

import pytest

from tempax.runtime.host_memory import release_free_heap


def test_release_free_heap_trims_where_glibc_is_the_c_library():
    assert release_free_heap() is (platform.libc_ver()[0] == "glibc")


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_release_free_heap_returns_freed_heap_pages():
    """64 MiB of 64 KiB malloc blocks, touched and freed, each between two blocks still in use (so none merges
    into the heap's top, which free() would trim itself): free() keeps those pages resident; release_free_heap
    (malloc_trim) gives back at least half of them."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    blocks = [libc.malloc(64 * 1024) for _ in range(2048)]
    for b in blocks:
        ctypes.memset(b, 1, 64 * 1024)
    freed, pins = blocks[0::2], blocks[1::2]
    for b in freed:
        libc.free(b)
    before = rss()
    assert release_free_heap()
    assert before - rss() >= 32 * 2**20
    for b in pins:
        libc.free(b)
