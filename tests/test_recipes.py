"""Every shipped recipe parses, builds its config and optimizer, names existing data, and says how to run it."""

from __future__ import annotations

import glob
import os

import pytest

from tempax.algorithms.registry import ALGORITHMS
from tempax.cli.validate import check_recipe, recipe_command

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
    assert command is not None, f"{rel}: its opening comment must give the command, e.g. tempax sft --config {rel}"
    with open(path) as f:
        assert f"--config {rel}" in f.read(), f"{rel}: the run command must name the recipe's own path"
    assert command in ALGORITHMS, f"{rel}: `tempax {command}` is not a training command"
    _, cfg, _ = check_recipe(rel)
    assert cfg.train.steps >= 1
