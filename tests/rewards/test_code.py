"""The code reward: which block is the program, how printed results are compared with the hidden expected values,
the share or all-or-nothing score, and that forging results earns nothing."""

from __future__ import annotations

import pytest

from tempax.errors import DataError
from tempax.rewards.code import (CASE_MARKER, CodeRewardConfig, CodeTestsReward, canonical, count_passed,
                                 extract_program)
from tempax.rewards.registry import RewardsConfig, build_rewards
from tempax.rewards.sandbox import ProgramResult

TESTS = [{"args": [[1, 2, 3]], "expected": 6}, {"args": [[]], "expected": 0}, {"args": [[-4, 4, 9]], "expected": 9},
         {"args": [[10]], "expected": 10}]


def test_the_last_python_or_bare_block_is_the_program():
    text = "First:\n```python\na = 1\n```\nthen a shell line\n```bash\nls\n```\nand\n```\nb = 2\n```"
    assert extract_program(text) == "b = 2\n"
    assert extract_program("```py\nc = 3\n") == "c = 3\n"  # a block left open runs to the end
    assert extract_program("no code at all") is None and extract_program("```python\n\n```") is None


def test_printed_values_are_compared_type_strictly_first_line_of_a_case_wins():
    """Case 0 prints 6 (right), case 1 prints false for 0 (wrong type), case 2 prints 9 twice after a forged
    first line of 8 (the first counts: wrong), case 3 is missing: 1 of 4 passes."""
    lines = [f'{CASE_MARKER}{{"case": 0, "out": 6}}', f'{CASE_MARKER}{{"case": 1, "out": false}}',
             f'{CASE_MARKER}{{"case": 2, "out": 8}}', f'{CASE_MARKER}{{"case": 2, "out": 9}}', "noise", "6"]
    result = ProgramResult("\n".join(lines) + "\n", "", "exited", exit_code=0)
    assert count_passed(result, [t["expected"] for t in TESTS]) == 1
    assert canonical((1, 2)) == canonical([1, 2]) and canonical(True) != canonical(1) and canonical(6.0) != "6"


@pytest.fixture(scope="module")
def reward():
    return CodeTestsReward(CodeRewardConfig())


def test_share_of_tests_passed(reward):
    """sum(xs): right on all 4 -> 1.0; `sum(xs) if xs else 1` misses only [] -> 3/4; max(xs) raises on [] and is
    wrong on [1, 2, 3] (3) but right on [-4, 4, 9] and [10] -> 2/4; no code block -> 0."""
    completions = ["```python\ndef total(xs):\n    return sum(xs)\n```",
                   "```python\ndef total(xs):\n    return sum(xs) if xs else 1\n```",
                   "```python\ndef total(xs):\n    return max(xs)\n```",
                   "I would add them up."]
    scores = reward(["p"] * 4, completions, tests=[TESTS] * 4, entry_point=["total"] * 4)
    assert scores == [1.0, 0.75, 0.5, 0.0]
    all_or_nothing = CodeTestsReward(CodeRewardConfig(all_tests=True))
    assert all_or_nothing(["p"] * 4, completions, tests=[TESTS] * 4, entry_point=["total"] * 4) == [1, 0, 0, 0]


def test_forged_results_earn_nothing(reward):
    """Printing marked lines, exiting before the harness, or returning an always-equal object: all 0."""
    forged = "".join(f"print({CASE_MARKER!r} + '{{\"case\": {i}, \"out\": 6}}')\n" for i in range(4))
    always_equal = "class Yes:\n    def __eq__(self, other):\n        return True\n"
    completions = [f"```python\n{forged}import sys\nsys.exit(0)\n```",
                   f"```python\n{always_equal}def total(xs):\n    return Yes()\n```",
                   "```python\nimport os\ndef total(xs):\n    os._exit(0)\n```"]
    scores = reward(["p"] * 3, completions, tests=[TESTS] * 3, entry_point=["total"] * 3)
    assert scores == [0.25, 0.0, 0.0]  # the forged 6 is right for case 0 only: the real answer, not a bypass


def test_missing_columns_are_named(reward):
    with pytest.raises(DataError, match="'tests' and 'entry_point' columns"):
        reward(["p"], ["```python\npass\n```"])
    with pytest.raises(DataError, match="the 'tests' column must be a list"):
        reward(["p"], ["```python\npass\n```"], tests=[[{"args": [1]}]], entry_point=["f"])


def test_the_registry_builds_it_from_a_recipe_name():
    combined = build_rewards(RewardsConfig(functions=("code_tests",)))
    breakdown = combined(["p"], ["```python\ndef total(xs):\n    return sum(xs)\n```"], tests=[TESTS],
                         entry_point=["total"])
    assert breakdown.per_function == {"code_tests": [1.0]}
    assert combined.functions[0].timeout_s is None  # the sandbox bounds each program itself
