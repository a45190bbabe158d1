"""`tempax validate RECIPE`: a valid recipe exits 0 and says so, a refused one exits 2 with the check's message in
one line (the checks themselves: tests/algorithms/test_validate.py and the packages' own tests)."""

from __future__ import annotations

import os

from tempax.cli.main import main
from tests.algorithms.test_validate import _grpo_recipe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_validate_exits_0_or_2_with_the_reason(tmp_path, capsys):
    assert main(["validate", _grpo_recipe(tmp_path, ["format", "correctness"])]) == 0
    assert "is a valid `tempax grpo` recipe" in capsys.readouterr().out
    assert main(["validate", _grpo_recipe(tmp_path, ["formatt"])]) == 2
    assert "did you mean 'format'" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "run")  # validation writes nothing


def test_a_bad_tool_spec_is_one_line_from_the_command(tmp_path, monkeypatch, capsys):
    """`tempax validate RECIPE env.tools=[...]` with a function that has no type hints: exit 2 and one line."""
    from tempax.cli.main import main

    monkeypatch.chdir(ROOT)
    (tmp_path / "untyped.py").write_text('def price_of(item):\n    """Price.\n\n    Args:\n      item: name.\n    """\n')
    code = main(["validate", "recipes/grpo_price_tools.yaml", f"env.tools=[{tmp_path}/untyped.py:price_of]"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "parameter 'item' has no type hint" in err
