"""What CPU this process runs on, in the terms that decide XLA:CPU's speed: vendor, model and the vector / matrix
extensions (AVX-512, AVX512-BF16, AMX). Benchmarks record it beside every figure because a speed ratio belongs
to its CPU (the same step's ratio to PyTorch differs by CPU class: `docs/results.md`), and process set-up chooses
per-CPU XLA flags from it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform

# The flags that change which kernels XLA:CPU and PyTorch pick; the rest of /proc/cpuinfo's list is noise here.
RELEVANT_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
                  "amx_bf16", "amx_int8")


def parse_cpuinfo(text: str) -> dict[str, str | list[str]]:
    """Vendor, model name and the relevant flags from the text of a Linux /proc/cpuinfo (first processor), and a
    `fingerprint` of everything that decides which instructions XLA:CPU may emit (vendor, family, model and the
    whole flags list): machine code compiled on one fingerprint may use instructions another CPU lacks."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough: every core of one socket reports the same
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    identity = "|".join([fields.get("vendor_id", ""), fields.get("cpu family", ""), fields.get("model", ""),
                         fields.get("model name", ""), " ".join(sorted(flags))])
    return {"vendor": fields.get("vendor_id", ""), "model": fields.get("model name", ""),
            "flags": [f for f in RELEVANT_FLAGS if f in flags],
            "fingerprint": hashlib.sha256(identity.encode()).hexdigest()[:16]}


@functools.lru_cache(maxsize=1)
def cpu_info() -> dict[str, str | int | list[str]]:
    """This machine's CPU: vendor ("GenuineIntel", "AuthenticAMD", ...), model name, relevant flags, and the
    number of cores this process may use. Off Linux the model is `platform.processor()` and flags are empty."""
    info: dict[str, str | int | list[str]] = {"vendor": "", "model": platform.processor() or platform.machine(),
                                              "flags": [], "fingerprint": platform.machine() or "unknown"}
    try:
        with open("/proc/cpuinfo") as f:
            info.update(parse_cpuinfo(f.read()))
    except OSError:
        pass
    try:
        info["cores"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        info["cores"] = os.cpu_count() or 1
    return info


def cpu_class(info: dict) -> str:
    """The class of a `cpu_info()` record that decides XLA:CPU's and PyTorch's kernels: "AVX-512 + AMX",
    "AVX-512", "AVX2" or "older than AVX2" (speed ratios are reported per class)."""
    flags = set(info.get("flags", ()))
    if "avx512f" in flags:
        return "AVX-512 + AMX" if "amx_tile" in flags else "AVX-512"
    return "AVX2" if "avx2" in flags else "older than AVX2"


def cpu_line() -> str:
    """One line naming the CPU for a benchmark table: "<model> (<vendor>), <cores> cores, <AVX-512 and AMX flags>"."""
    info = cpu_info()
    flags = " ".join(f for f in info["flags"] if f.startswith(("avx512f", "avx512_bf16", "amx"))) or "no AVX-512"
    return f"{info['model']} ({info['vendor']}), {info['cores']} cores, {flags}"
