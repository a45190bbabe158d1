"""Every shipped recipe parses, builds its config and optimizer, names existing data, names its command in its
`command:` key, and says how to run it in its opening comment."""

from __future__ import annotations

import glob
import os

import pytest

from tempax.algorithms.registry import algorithms
from tempax.algorithms.validate import check_recipe
from tempax.configlib import recipe_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = sorted(glob.glob(os.path.join(ROOT, "recipes", "**", "*.yaml"), recursive=True))


def test_there_are_recipes():
    names = {os.path.basename(p) for p in RECIPES}
    assert {"sft_lora_smollm2.yaml", "sft_qlora_smollm2.yaml", "sft_full_tiny.yaml"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=[os.path.relpath(p, ROOT) for p in RECIPES])
def test_recipe_parses_and_builds(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # recipes name data relative to the repository root
    rel = os.path.relpath(path, ROOT)
    with open(path) as f:
        head = f.readline()
    assert head.startswith("#"), f"{rel} must open with a comment saying what it does"
    command = recipe_command(path)
    assert command is not None, f"{rel}: name the command that runs it in a top-level key, e.g. `command: sft`"
    with open(path) as f:
        assert f"tempax {command} --config {rel}" in f.read(), f"{rel}: its comment must give the command that runs it"
    assert command in algorithms(), f"{rel}: `tempax {command}` is not a training command"
    _, cfg, _ = check_recipe(rel)
    assert cfg.train.steps >= 1
