"""User-facing errors.

Every problem a user can cause (a missing file, a wrong config key, a malformed row, a model that does not
fit) is raised as a `TempaxError` whose message names the thing and the fix. The CLI prints these messages
without a traceback; anything else is a bug in tempax and keeps its traceback.
"""

from __future__ import annotations


class TempaxError(Exception):
    """An error caused by input the user can fix; the message says what and how."""


class ConfigError(TempaxError):
    """A recipe or override names an unknown key or holds a value of the wrong type."""


class CheckpointError(TempaxError):
    """A checkpoint folder or file is missing, truncated or does not match its config."""


class DataError(TempaxError):
    """A dataset file is missing or too many of its rows are malformed."""


class GenerationError(TempaxError):
    """A generation request cannot be served (empty prompt, prompt longer than the cache, bad sampling knob)."""


class DeviceOutOfMemory(TempaxError):
    """The accelerator ran out of memory compiling or running a program (XLA's RESOURCE_EXHAUSTED); the message
    says what needed how much and which settings would fit."""


def is_device_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is XLA's out-of-memory error (at compile or at run time), told by its status code so that
    this module needs no JAX."""
    return type(error).__name__ in ("XlaRuntimeError", "JaxRuntimeError") and "RESOURCE_EXHAUSTED" in str(error)


def device_out_of_memory(error: BaseException, *, what: str = "a program", fix: str = "") -> DeviceOutOfMemory:
    """A `DeviceOutOfMemory` for XLA's `error`: its first line (what needed how much), and `fix`."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    default = ("use a smaller batch or micro-batch (train.micro_batch_size), train.remat=full, LoRA/QLoRA, "
               "train.memory=offload_optimizer, or more devices")
    return DeviceOutOfMemory(f"the device ran out of memory running {what} ({first}); {fix or default}")
