"""What CPU this process runs on, in the terms that decide XLA:CPU's speed: vendor, model and the vector / matrix
extensions (AVX-512, AVX512-BF16, AMX). Benchmarks record it beside every figure because a speed ratio belongs
to its CPU (the same step's ratio to PyTorch differs by CPU class: `docs/results.md`), and process set-up chooses
per-CPU XLA flags from it.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import platform
from collections.abc import Mapping

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


# Google's PCI vendor id, under which TPU chips are listed (what JAX's own TPU start-up looks for); the device files
# of NVIDIA's driver (bare metal, containers, WSL2) and AMD's kernel driver for GPUs.
_GOOGLE_PCI_VENDOR = "0x1ae0"
_GPU_DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def accelerator_attached(env: Mapping[str, str] | None = None, sys_root: str = "/") -> str | None:
    """"tpu" or "gpu" when JAX will find one, None when it will run on the CPU; decided before JAX starts (no import
    of JAX), for settings that only suit XLA:CPU. `JAX_PLATFORMS` in `env` (default os.environ) decides when set
    ("cpu" alone: None); otherwise a TPU chip on the PCI bus, or a GPU driver's device file. `sys_root` lets tests
    point at a made-up filesystem."""
    env = os.environ if env is None else env
    platforms = [p.strip().lower() for p in env.get("JAX_PLATFORMS", "").split(",") if p.strip()]
    if platforms:
        chosen = [p for p in platforms if p != "cpu"]
        if not chosen:
            return None
        return "tpu" if chosen[0] == "tpu" else "gpu"
    for vendor in glob.glob(os.path.join(sys_root, "sys/bus/pci/devices/*/vendor")):
        try:
            with open(vendor) as f:
                if f.read().strip() == _GOOGLE_PCI_VENDOR:
                    return "tpu"
        except OSError:
            continue
    if any(os.path.exists(os.path.join(sys_root, path.lstrip("/"))) for path in _GPU_DEVICE_FILES):
        return "gpu"
    return None
