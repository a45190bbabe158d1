"""The generated code task: deterministic rows, disjoint splits, hidden tests whose expected values the
reference computes, a target that passes them in the sandbox, and the task reachable from a recipe."""

from __future__ import annotations

import pytest

from tempax.data.tasks.code import FAMILIES, CodeTaskConfig, generate_code_problems, reference_source
from tempax.data.tasks.spec import TaskConfig, load_task
from tempax.errors import ConfigError
from tempax.rewards.code import CodeRewardConfig, CodeTestsReward


def test_rows_are_deterministic_prefixes_and_the_splits_are_disjoint():
    rows = generate_code_problems(40, split="train", seed=3)
    assert rows == generate_code_problems(40, split="train", seed=3)
    assert generate_code_problems(10, split="train", seed=3) == rows[:10]
    held = generate_code_problems(40, split="test", seed=3)
    assert not {r["question"] for r in rows} & {r["question"] for r in held}
    assert len({r["question"] for r in rows}) == 40
    row = rows[0]
    assert set(row) == {"prompt_messages", "question", "entry_point", "tests", "answer", "target"}
    assert len(row["tests"]) == 8 and row["prompt_messages"][-1] == {"role": "user", "content": row["question"]}
    assert f"`{row['entry_point']}(" in row["question"] and row["target"].startswith("```python\ndef ")


def test_expected_values_are_the_references_answers():
    """count_above_3 on [1, 5, 7] is 2; shift_letters_2 on 'az b' is 'cb d'; fizz_3_buzz_5 of 15 is FizzBuzz."""
    by_name = {f.name: f for f in FAMILIES}
    cases = [("count_above_{t}", {"t": 3}, [[1, 5, 7]], 2), ("shift_letters_{k}", {"k": 2}, ["az b"], "cb d"),
             ("fizz_{a}_buzz_{b}", {"a": 3, "b": 5}, [15], "FizzBuzz"),
             ("rotate_left_{n}", {"n": 4}, [[1, 2, 3]], [2, 3, 1])]
    for family, params, args, expected in cases:
        name, source = reference_source(by_name[family], params)
        scope: dict = {}
        exec(source, scope)  # noqa: S102 - tempax's own reference template
        assert scope[name](*args) == expected, (name, source)


def test_every_target_passes_its_hidden_tests_in_the_sandbox():
    rows = generate_code_problems(16, split="test")
    reward = CodeTestsReward(CodeRewardConfig(all_tests=True))
    scores = reward(["p"] * 16, [r["target"] for r in rows], tests=[r["tests"] for r in rows],
                    entry_point=[r["entry_point"] for r in rows])
    assert scores == [1.0] * 16


def test_the_task_spec_loads_it_and_bad_sizes_are_refused():
    train, held = load_task(TaskConfig(name="code", num_train_problems=12, code=CodeTaskConfig(tests_per_problem=3)),
                            eval_problems=5)
    assert len(train) == 12 and len(held) == 5 and all(len(r["tests"]) == 3 for r in train + held)
    with pytest.raises(ConfigError, match="tests_per_problem must be >= 1"):
        CodeTaskConfig(tests_per_problem=0)
    with pytest.raises(ConfigError, match="split must be one of"):
        generate_code_problems(1, split="dev")
