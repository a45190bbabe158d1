import os

# Eight virtual CPU devices so sharding tests (FSDP, tensor parallel) run in the same process as the rest;
# unsharded code still runs on device 0. Must be set before jax is imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    # Tests that compare with transformers need torch; mark them so `-m "not needs_torch"` works anywhere.
    for item in items:
        if "torch" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.needs_torch)
