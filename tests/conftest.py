import atexit
import os
import shutil
import tempfile

# Eight virtual CPU devices so sharding tests (FSDP, tensor parallel) run in the same process as the rest;
# unsharded code still runs on device 0. Must be set before jax is imported. XLA:CPU's concurrency-optimised
# scheduler may order one program's independent collectives differently on different virtual devices, which then
# wait for each other for ever (a Qwen3.5 step on 8 devices hung in 3 of 4 runs with it, none of 6 without it).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                                   "--xla_cpu_enable_concurrency_optimized_scheduler=false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# tempax's cache (tokenizers built from GGUF files, compiled XLA programs of `tempax` commands run by tests) goes
# to a folder of this test process, never the user's; it is removed when the process ends.
os.environ["TEMPAX_CACHE"] = tempfile.mkdtemp(prefix="tempax-test-cache-")
atexit.register(shutil.rmtree, os.environ["TEMPAX_CACHE"], ignore_errors=True)

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    # Tests that compare with transformers need torch; mark them so `-m "not needs_torch"` works anywhere.
    for item in items:
        if "torch" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.needs_torch)
