import atexit
import os
import shutil
import tempfile

# Eight virtual CPU devices so sharding tests (FSDP, tensor parallel) run in the same process as the rest;
# unsharded code still runs on device 0. Must be set before jax is imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# tempax's cache (tokenizers built from GGUF files, compiled XLA programs of `tempax` commands run by tests) goes
# to a folder of this test process, never the user's; it is removed when the process ends.
os.environ["TEMPAX_CACHE"] = tempfile.mkdtemp(prefix="tempax-test-cache-")
atexit.register(shutil.rmtree, os.environ["TEMPAX_CACHE"], ignore_errors=True)

import pytest  # noqa: E402

# One persistent XLA compilation cache for the whole session, shared by the xdist workers: many tests build the
# same tiny models' programs (a kill-and-resume test compiles its step twice, every DPO test the same loss), and
# from the second time on each is a cache hit. The controller makes the folder; the workers inherit its name
# through an environment variable of the test kit's own, so `tempax` commands that tests start in subprocesses keep
# their own caches. TEMPAX_TEST_COMPILE_CACHE=0 turns it off.
if os.environ.get("TEMPAX_TEST_COMPILE_CACHE", "1") != "0":
    if not os.environ.get("TEMPAX_TEST_XLA_CACHE"):
        os.environ["TEMPAX_TEST_XLA_CACHE"] = tempfile.mkdtemp(prefix="tempax-test-xla-")
        atexit.register(shutil.rmtree, os.environ["TEMPAX_TEST_XLA_CACHE"], ignore_errors=True)
    import jax  # noqa: E402

    jax.config.update("jax_compilation_cache_dir", os.environ["TEMPAX_TEST_XLA_CACHE"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_collection_modifyitems(config, items):
    # Tests that compare with transformers need torch; mark them so `-m "not needs_torch"` works anywhere.
    for item in items:
        if "torch" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.needs_torch)
