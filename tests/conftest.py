import atexit
import os
import shutil
import tempfile

from tests.kit.mappings import BETWEEN_MODULES, CHECK_EVERY, WITHIN_A_MODULE, map_limit, release_if_crowded
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


_MAP_LIMIT = map_limit()
_tests_since_check = 0


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    # After the test's own teardown (a module's fixtures are gone when the next test is in another module): drop
    # JAX's compiled programs before their memory mappings reach the kernel's limit (tests/kit/mappings.py).
    global _tests_since_check
    result = yield
    _tests_since_check += 1
    if nextitem is None or nextitem.path != item.path:
        _tests_since_check = 0
        release_if_crowded(_MAP_LIMIT, BETWEEN_MODULES)
    elif _tests_since_check >= CHECK_EVERY:
        _tests_since_check = 0
        release_if_crowded(_MAP_LIMIT, WITHIN_A_MODULE)
    return result
