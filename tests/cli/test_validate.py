"""`tempax validate RECIPE`: a valid recipe exits 0 and says so, a refused one exits 2 with the check's message
(the checks themselves: tests/algorithms/test_validate.py)."""

from __future__ import annotations

import os

from tempax.cli.main import main
from tests.algorithms.test_validate import _grpo_recipe


def test_validate_exits_0_or_2_with_the_reason(tmp_path, capsys):
    assert main(["validate", _grpo_recipe(tmp_path, ["format", "correctness"])]) == 0
    assert "is a valid `tempax grpo` recipe" in capsys.readouterr().out
    assert main(["validate", _grpo_recipe(tmp_path, ["formatt"])]) == 2
    assert "did you mean 'format'" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "run")  # validation writes nothing
