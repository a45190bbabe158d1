"""Process setup that has to happen before JAX allocates anything: glibc's malloc on transparent huge pages.

XLA:CPU allocates a training step's activations (gigabytes) afresh on every execution, and glibc serves such
sizes with `mmap` and gives them back with `munmap` when the step ends, so every step faults every page in
again, 4 KiB at a time: measured on bench-small `sft_full` (2 cores), 10.8 million page faults and 61 s of
kernel time in a 4-minute run, 30.9 s a step. With glibc's `glibc.malloc.hugetlb=1` tunable malloc asks for
transparent huge pages (`madvise(MADV_HUGEPAGE)`) on what it maps, so the same memory faults in 2 MiB at a
time: 0.66 million faults, 35 s of kernel time, 26.3 s a step. glibc reads its tunables only when a process
starts, so the command line re-executes itself once with the tunable set.

Opt out by setting `GLIBC_TUNABLES` to anything naming `glibc.malloc.hugetlb` (e.g. `glibc.malloc.hugetlb=0`)
or `TEMPAX_REEXEC=0`.
"""

from __future__ import annotations

import os
import platform
import sys

HUGETLB_TUNABLE = "glibc.malloc.hugetlb=1"
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_page_malloc_env(env: dict[str, str]) -> dict[str, str] | None:
    """The environment to re-run this process with so glibc's malloc uses transparent huge pages, or None
    when that would change nothing: not Linux/glibc, huge pages off or already always on, the tunable
    already chosen by the user, or re-execution disabled."""
    if env.get("TEMPAX_REEXEC", "1") == "0" or not sys.platform.startswith("linux"):
        return None
    if platform.libc_ver()[0] != "glibc" or "glibc.malloc.hugetlb" in env.get("GLIBC_TUNABLES", ""):
        return None
    try:
        with open(THP_SETTING) as f:
            thp = f.read()
    except OSError:
        return None
    if "[madvise]" not in thp:  # "[always]" already gives huge pages; "[never]" can't
        return None
    tunables = env.get("GLIBC_TUNABLES", "")
    return {**env, "GLIBC_TUNABLES": f"{tunables}:{HUGETLB_TUNABLE}" if tunables else HUGETLB_TUNABLE}


def reexec_with_huge_page_malloc() -> None:
    """Replace this process by the same command with `huge_page_malloc_env`, if it changes anything.

    Call it first thing in a program's entry point, before JAX starts; it does not return when it re-executes.
    """
    env = huge_page_malloc_env(dict(os.environ))
    if env is None:
        return
    argv = list(getattr(sys, "orig_argv", [])) or [sys.executable, *sys.argv]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, argv, env)
    except OSError:  # e.g. a frozen interpreter that can't be re-run: carry on without huge pages
        return
