"""tempax.errors: the user-facing error types and XLA's out-of-memory error told apart from other failures."""

from __future__ import annotations

from tempax.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    DeviceOutOfMemory,
    GenerationError,
    TempaxError,
    device_out_of_memory,
    is_device_out_of_memory,
)


class XlaRuntimeError(Exception):
    """Stands in for jaxlib's error of the same name: the check reads the type's name, not jaxlib's class."""


class JaxRuntimeError(Exception):
    """The name newer jaxlib releases give the same error."""


def test_every_user_error_is_a_tempax_error():
    """The CLI prints a TempaxError's message without a traceback (exit 2); anything else keeps its traceback."""
    for cls in (ConfigError, CheckpointError, DataError, GenerationError, DeviceOutOfMemory):
        assert issubclass(cls, TempaxError)
    assert not issubclass(TempaxError, RuntimeError)


def test_out_of_memory_is_told_by_type_name_and_status():
    oom = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 3.50GiB."
    assert is_device_out_of_memory(XlaRuntimeError(oom))
    assert is_device_out_of_memory(JaxRuntimeError(oom))
    assert not is_device_out_of_memory(XlaRuntimeError("INVALID_ARGUMENT: shapes differ"))
    assert not is_device_out_of_memory(MemoryError(oom))  # the host's MemoryError is not the device's


def test_the_out_of_memory_message_names_what_and_the_fix():
    """The first line of XLA's message (what needed how much), then the given fix or the default list."""
    error = XlaRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 3.50GiB\nlong XLA dump...")
    named = device_out_of_memory(error, what="the training step", fix="lower train.batch_size")
    assert str(named) == ("the device ran out of memory running the training step (RESOURCE_EXHAUSTED: Out of memory "
                          "allocating 3.50GiB); lower train.batch_size")
    default = str(device_out_of_memory(error))
    assert default.startswith("the device ran out of memory running a program (") and "train.remat=full" in default
    assert str(device_out_of_memory(XlaRuntimeError(""))).startswith(
        "the device ran out of memory running a program (XlaRuntimeError)")
