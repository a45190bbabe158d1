"""tempax/__init__.py: the public names `tempax.load`, `tempax.train` and friends, imported on first use."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_train_stays_callable_after_the_training_package_is_imported():
    """Every run imports the package `tempax.train` (the loop), which Python binds as the attribute `tempax.train`:
    a second `tempax.train(...)` in a notebook found a module there. In a fresh interpreter: the function first;
    after `import tempax.train.loop` the package, still callable (the call reaches the algorithm registry's
    `train`, replaced here by a recorder), and still the package (its submodules as attributes)."""
    script = """
import tempax
assert type(tempax.train).__name__ == "function"
import tempax.train.loop
from tempax.algorithms import registry
registry.train = lambda *args, **kwargs: print("called", args, sorted(kwargs))
tempax.train("sft", "recipe.yaml", ["train.steps=1"], log=None)
print("loop", tempax.train.loop.Trainer.__name__)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["called ('sft', 'recipe.yaml', ['train.steps=1']) ['log']", "loop Trainer"]
