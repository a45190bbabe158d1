import atexit
import os
import shutil
import tempfile

from tests.kit.xla import TEST_XLA_FLAGS  # no JAX import here: the flags must be set before JAX starts

os.environ.setdefault("XLA_FLAGS", TEST_XLA_FLAGS)
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
