"""Keeps a long test process clear of the kernel's limit on memory mappings (`vm.max_map_count`).

Each program XLA:CPU compiles holds a few memory mappings of its own (its machine code, constants and data) for as
long as JAX's caches keep the executable, and they keep the programs a process compiled. A pytest-xdist worker runs
about half of the default suite in one process, eager model code compiles a program per operation and shape, and
the mappings add up to the limit: LLVM's memory manager then fails ("LLVM compilation error: Cannot allocate
memory") and XLA:CPU goes on to a segmentation fault inside the next compile. `release_if_crowded`, called by
tests/conftest.py between tests, drops JAX's caches once the mappings pass a share of the limit; the programs
the following tests need compile again."""

from __future__ import annotations

import gc
import sys

# Shares of the limit past which the caches are dropped. Between modules: a module's fixtures are gone by then,
# and a module warms up what it shares between its tests itself (some tests check that nothing compiles after a
# warm-up). Within a module, checked every `CHECK_EVERY` tests, only close to the limit: recompiling a warm-up
# beats a crash.
BETWEEN_MODULES = 0.25
WITHIN_A_MODULE = 0.75
CHECK_EVERY = 8


def map_limit() -> int | None:
    """The kernel's limit on one process's memory mappings, or None where there is no such setting to read."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def mapped_regions() -> int | None:
    """This process's memory mappings now, or None where /proc cannot tell."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return None


def release_if_crowded(limit: int | None, share: float) -> bool:
    """Drops JAX's caches (every compiled program with them) when this process's mappings are past `share` of
    `limit`; True when it did. Nothing happens before JAX is imported: the test session must not start it."""
    jax = sys.modules.get("jax")
    if jax is None or limit is None:
        return False
    regions = mapped_regions()
    if regions is None or regions < share * limit:
        return False
    jax.clear_caches()
    gc.collect()  # executables held by objects in reference cycles go with them
    return True
