"""Process setup that has to happen before JAX starts (`setup_process`): XLA:CPU's memory-minimising scheduler,
the per-CPU XLA flags, glibc's malloc told to keep a training step's memory between steps (huge pages opt-in), and
the environment of the compilation and dequantised-weight caches. Each setting's reason is given where it is
defined; what each bought, per CPU class: `docs/measurements/performance-history.md`; how to change them:
`docs/running-commands.md`, "Settings of the process" (`TEMPAX_REEXEC=0` turns all of it off).
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from typing import Any

from tempax.runtime.host import accelerator_attached, cpu_info, cpu_line
from tempax.runtime.caches import cache_root

# Transparent huge pages (`madvise(MADV_HUGEPAGE)`) on what malloc maps, so memory faults in 2 MiB at a time;
# opt-in (`TEMPAX_HUGE_PAGES=1`). It was the training default before the kept heap, which faults nothing after the
# first step; on a host whose kernel compacts memory to find each huge page it costs more kernel time than it saves.
HUGETLB_TUNABLE = "glibc.malloc.hugetlb=1"
# The kept heap. XLA:CPU allocates a training step's temporaries (gigabytes, one block) afresh on every execution;
# glibc serves a block that size with mmap and unmaps it when the step ends, so every step faults every page in
# again, 4 KiB at a time, and the kernel zeroes each one. One heap (`arena_max=1`: XLA's worker threads would
# otherwise each get an arena, and a thread arena maps a large block whatever `mmap_max` says), never mmap
# (`mmap_max=0`), never trim the heap's top (`trim_threshold`): from the second step on the step's memory is
# already mapped. The process keeps its high-water mark, which for a training job is its peak anyway. Not by default
# where an accelerator runs the step: its temporaries are on the device, and one arena serialises the TPU
# compiler's many threads (the 1B LoRA step compiled three times slower with it on a v5e host: docs/results.md).
KEEP_HEAP_TUNABLES = (
    "glibc.malloc.arena_max=1", "glibc.malloc.mmap_max=0", "glibc.malloc.trim_threshold=1099511627776",
)
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
# XLA:CPU orders a step's operations for concurrency, which keeps far more activations alive at once; this orders
# them to minimise live memory, which lowers a training step's peak without a measurable loss of speed on a few
# cores.
SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
ONEDNN_FLAG = "--xla_cpu_use_onednn=true"


def _append(value: str, item: str, sep: str) -> str:
    return f"{value}{sep}{item}" if value else item


def glibc_linux() -> bool:
    """True on Linux with glibc, whose malloc reads `GLIBC_TUNABLES`."""
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def huge_pages_available() -> bool:
    """True on Linux/glibc when transparent huge pages are given on request (`madvise`), the one setting in
    which the malloc tunable changes anything ("always" already gives them; "never" can't)."""
    if not glibc_linux():
        return False
    try:
        with open(THP_SETTING) as f:
            return "[madvise]" in f.read()
    except OSError:
        return False


def cpu_xla_flags(cpu: Mapping[str, Any]) -> list[str]:
    """The XLA:CPU flags chosen for `cpu` (a `tempax.runtime.host.cpu_info()` record: vendor and flags): oneDNN's
    products on Intel CPUs with AVX-512, nothing elsewhere (AMD's default products are as fast; oneDNN capped to
    AVX2 is slower than them). Measured per CPU class in `docs/measurements/performance-history.md`."""
    if cpu.get("vendor") == "GenuineIntel" and "avx512f" in cpu.get("flags", ()):
        return [ONEDNN_FLAG]
    return []


def tuned_env(env: dict[str, str], cpu: Mapping[str, Any] | None = None, job: str | None = None) -> dict[str, str]:
    """`env` with the settings added where they change something and the user has not chosen otherwise; `cpu`
    (default: this machine's `cpu_info()`) decides the per-CPU XLA flags; `job` "train" keeps the heap on the CPU
    unless `TEMPAX_KEEP_HEAP=0` (any other job, or with an accelerator attached: only with `TEMPAX_KEEP_HEAP=1`);
    huge pages only with `TEMPAX_HUGE_PAGES=1`. A tunable or flag the user named keeps the user's value. glibc reads its tunables only
    when a process starts, which is why `setup_process` re-executes the command once with them set."""
    if env.get("TEMPAX_REEXEC", "1") == "0":
        return dict(env)
    out = dict(env)
    tunables = env.get("GLIBC_TUNABLES", "")
    named = {item.partition("=")[0] for item in tunables.split(":") if item}
    wanted: list[str] = []
    keep_by_default = job == "train" and accelerator_attached(env) is None
    if env.get("TEMPAX_KEEP_HEAP", "1" if keep_by_default else "0") == "1" and glibc_linux():
        wanted += KEEP_HEAP_TUNABLES
    if env.get("TEMPAX_HUGE_PAGES", "0") == "1" and huge_pages_available():
        wanted.append(HUGETLB_TUNABLE)
    for tunable in wanted:
        if tunable.partition("=")[0] not in named:
            tunables = _append(tunables, tunable, ":")
    if tunables != env.get("GLIBC_TUNABLES", ""):
        out["GLIBC_TUNABLES"] = tunables
    xla_flags = env.get("XLA_FLAGS", "")
    for flag in [SCHEDULER_FLAG, *cpu_xla_flags(cpu_info() if cpu is None else cpu)]:
        if flag.partition("=")[0] not in xla_flags:  # the user named this flag: theirs wins, whatever its value
            xla_flags = _append(xla_flags, flag, " ")
    if xla_flags != env.get("XLA_FLAGS", ""):
        out["XLA_FLAGS"] = xla_flags
    return out


# Commands whose programs are stored whole (`tempax.generate.program_store`) instead of going through JAX's cache.
STORED_PROGRAM_COMMANDS = ("generate", "chat")


def compilation_cache_env(
    env: Mapping[str, str], cpu: Mapping[str, Any] | None = None, command: str | None = None
) -> dict[str, str]:
    """`env` with compiled programs kept under `$TEMPAX_CACHE/xla/<cpu fingerprint>` (`cpu`: a `cpu_info()`
    record, default this machine's). Unchanged when `TEMPAX_COMPILE_CACHE=0` or when the user named a JAX cache
    folder (`JAX_COMPILATION_CACHE_DIR`). The folder is per CPU because JAX's cache key names the backend ("cpu")
    but not the host's instruction set: a home folder shared by an AVX-512 and an AVX2 machine must not hand one
    the other's machine code.

    `command` "generate" or "chat" (`STORED_PROGRAM_COMMANDS`) stores its prefill and decode programs whole, one
    pair per prompt-length bucket (`TEMPAX_PROGRAMS_DIR`, the `programs/` folder), which also skips their tracing
    and lowering; what else those commands compile is a handful of tiny programs (tens of ms together, measured
    with `JAX_LOG_COMPILES=1` on a two-turn chat), left uncached. Every other command uses JAX's persistent
    cache, for every program however fast it compiled (JAX's default, `jax_persistent_cache_min_compile_time_secs`,
    keeps only the slow ones; the many small ones add up on a few cores); a large training step gains little from
    it with the pinned jaxlib, whose loader looks up each YNNPACK fusion by a walk over the whole module (the
    figures: `docs/measurements/performance-history.md`). Never both in one process: a program compiled where JAX
    has loaded executables from its cache can serialise incompletely (XLA:CPU then fails with "Function ... not
    found" when the stored copy runs)."""
    out = dict(env)
    if env.get("TEMPAX_COMPILE_CACHE", "1") == "0" or env.get("JAX_COMPILATION_CACHE_DIR"):
        return out
    fingerprint = str((cpu_info() if cpu is None else cpu).get("fingerprint", "unknown"))
    folder = os.path.join(env.get("TEMPAX_CACHE") or cache_root(), "xla", fingerprint)
    if command in STORED_PROGRAM_COMMANDS:
        out.setdefault("TEMPAX_PROGRAMS_DIR", os.path.join(folder, "programs"))
        return out
    out["JAX_COMPILATION_CACHE_DIR"] = folder
    out.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    return out


def weight_cache_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the dequantised-weight cache (`tempax.models.weight_cache`) at `$TEMPAX_CACHE/weights`, unless
    `TEMPAX_WEIGHT_CACHE=0` or a `TEMPAX_WEIGHTS_DIR` is already named."""
    out = dict(env)
    if env.get("TEMPAX_WEIGHT_CACHE", "1") != "0":
        out.setdefault("TEMPAX_WEIGHTS_DIR", os.path.join(env.get("TEMPAX_CACHE") or cache_root(), "weights"))
    return out


def setup_process(job: str | None = None) -> None:
    """Apply `tuned_env` to this process (`job`: "train" for a training process, see `tuned_env`). Call it first
    thing in a program's entry point, before JAX starts.

    XLA reads its flags when JAX first starts a backend, so they are set in place; glibc reads its tunables only
    at process start, so when those change the process re-executes itself (this call then does not return).
    """
    env = tuned_env(dict(os.environ), job=job)
    if "XLA_FLAGS" in env:
        os.environ["XLA_FLAGS"] = env["XLA_FLAGS"]
    if env.get("GLIBC_TUNABLES") != os.environ.get("GLIBC_TUNABLES"):
        argv = list(getattr(sys, "orig_argv", [])) or [sys.executable, *sys.argv]
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execve(sys.executable, argv, env)
        except OSError:  # e.g. a frozen interpreter that can't be re-run: carry on with glibc's defaults
            pass


def settings_in_effect() -> dict[str, object]:
    """The settings as this process has them, and the CPU, for a benchmark to record beside its figures."""
    return {"glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""), "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "cpu": cpu_line(), "cpu_flags": cpu_info()["flags"]}


# Set by `tempax launch` for each process it starts: its index (0 prints as a single process would).
LAUNCH_RANK_ENV = "TEMPAX_LAUNCH_RANK"


def launch_rank() -> int:
    """This process's index under `tempax launch` (0 outside it)."""
    value = os.environ.get(LAUNCH_RANK_ENV, "")
    return int(value) if value.isdigit() else 0


def error_stream() -> Any:
    """Where a command's error message goes: stderr, or under `tempax launch` the stream that still reaches it."""
    return _KEPT_STDERR or sys.stderr


_KEPT_STDERR: Any = None


def quiet_unless_first_process() -> None:
    """Under `tempax launch`, every process runs the same code and would print every message once each; process 0
    prints as usual, and the others print only their warnings, errors and tracebacks (which can differ between
    processes). Their ordinary output (stdout and plain stderr prints) is dropped, and the launcher prefixes what
    remains with the process's rank."""
    global _KEPT_STDERR
    if launch_rank() == 0 or _KEPT_STDERR is not None:
        return
    import logging
    import traceback
    import warnings

    kept = _KEPT_STDERR = sys.stderr
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115

    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        kept.write(warnings.formatwarning(message, category, filename, lineno, line))
        kept.flush()

    warnings.showwarning = show
    handler = logging.StreamHandler(kept)
    handler.setLevel(logging.WARNING)
    logging.getLogger().addHandler(handler)
    sys.excepthook = lambda kind, value, tb: traceback.print_exception(kind, value, tb, file=kept)
