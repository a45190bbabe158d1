"""Verifiable tasks: GSM8K loading (real files and malformed rows) and the generated arithmetic task."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tempax.data.tasks import arithmetic
from tempax.data.tasks import (
    GSM8K_HUB_ID,
    SYSTEM_PROMPT,
    ArithmeticConfig,
    generate_arithmetic,
    is_heldout_question,
    load_gsm8k,
    parse_final_answer,
)
from tempax.data.tasks.gsm8k import worked_solution_target
from tempax.errors import ConfigError, DataError
from tempax.rewards import answers_match, extract_answer, format_score, strict_format_ok

# The repository's copy (its recipes name it as task.source); the library itself defaults to the Hub.
GSM8K_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k"
needs_gsm8k = pytest.mark.skipif(not GSM8K_DIR.is_dir(), reason=f"GSM8K not at {GSM8K_DIR}")


# ---------------------------------------------------------------- system prompt


def test_system_prompt_cannot_be_copied_for_full_format_reward() -> None:
    """Copying the prompt, or its span from the first tag to the last, must not pass the strict check."""
    assert not strict_format_ok(SYSTEM_PROMPT)
    span = SYSTEM_PROMPT[SYSTEM_PROMPT.index("<reasoning>") : SYSTEM_PROMPT.rindex("</answer>") + len("</answer>")]
    assert not strict_format_ok(span)
    assert format_score(span) < 1.0
    for tag in ("<reasoning>", "</reasoning>", "<answer>", "</answer>"):
        assert tag in SYSTEM_PROMPT  # the format is still described exactly
    assert "..." not in SYSTEM_PROMPT


# ---------------------------------------------------------------- GSM8K


@pytest.mark.parametrize(
    "solution, expected",
    [
        ("48/2 = 24\n#### 72", "72"),
        ("so\n#### 1,080", "1080"),
        ("#### -7", "-7"),
        ("a #### 1\n#### 2", "2"),
        ("no final line", None),
        ("#### twelve", None),
        ("####", None),
    ],
)
def test_parse_final_answer(solution: str, expected: str | None) -> None:
    assert parse_final_answer(solution) == expected


@needs_gsm8k
def test_load_real_gsm8k_splits() -> None:
    """The shared copy has 7473 train and 1319 test rows (README), none malformed."""
    train, test = load_gsm8k("train", GSM8K_DIR), load_gsm8k("test", GSM8K_DIR)
    assert (len(train), len(test)) == (7473, 1319)
    assert train.skipped == [] and test.skipped == []
    first = train[0]
    assert set(first) == {"prompt_messages", "question", "answer", "target"}
    assert first["answer"] == "72"  # Natalia's clips
    assert first["target"] == ("<reasoning>\nNatalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips "
                               "altogether in April and May.\n</reasoning>\n<answer>\n72\n</answer>")
    assert not any("<<" in row["target"] or "####" in row["target"] for row in train)
    assert first["prompt_messages"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert first["prompt_messages"][1] == {"role": "user", "content": first["question"]}
    assert all("," not in row["answer"] for row in train)  # thousands separators removed (79 in train)
    assert sum(row["answer"].startswith("-") for row in train) == 3  # README: 3 negative answers


@needs_gsm8k
def test_load_gsm8k_from_a_file_and_with_limit(tmp_path: Path) -> None:
    rows = load_gsm8k(source=GSM8K_DIR / "test.jsonl", limit=5, system_prompt=None)
    assert len(rows) == 5
    assert rows[0]["prompt_messages"] == [{"role": "user", "content": rows[0]["question"]}]


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_malformed_rows_are_skipped_with_file_and_line(tmp_path: Path) -> None:
    """Lines 2-6 are malformed (missing key, no ####, bad JSON, not an object, non-string); line 7 is blank and
    ignored. 3 good rows + 5 bad: 5/8 malformed, so allow up to 100% here."""
    good = {"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}
    lines = [
        json.dumps(good),
        json.dumps({"question": "no answer key"}),
        json.dumps({"question": "Q?", "answer": "no final line"}),
        "{not json",
        json.dumps(["a", "list"]),
        json.dumps({"question": 3, "answer": "#### 3"}),
        "",
        json.dumps({"question": "How many?", "answer": "#### 1,080"}),
        json.dumps(good),
    ]
    file = _write_lines(tmp_path / "train.jsonl", lines)
    rows = load_gsm8k(source=tmp_path, max_malformed_fraction=1.0)
    assert [row["answer"] for row in rows] == ["5", "1080", "5"]
    assert [s.location for s in rows.skipped] == [f"{file}:{n}" for n in (2, 3, 4, 5, 6)]
    assert "missing key" in rows.skipped[0].reason
    assert "####" in rows.skipped[1].reason
    assert "JSON" in rows.skipped[2].reason


def test_too_many_malformed_rows_is_a_data_error(tmp_path: Path) -> None:
    file = _write_lines(tmp_path / "bad.jsonl", ['{"question": "Q?", "answer": "#### 1"}', "{oops", "{oops"])
    with pytest.raises(DataError, match=r"2 of 3 rows are malformed.*bad.jsonl:2"):
        load_gsm8k(source=file)


def test_no_source_reads_the_hub_and_an_unreachable_hub_names_the_key(monkeypatch) -> None:
    """With no source the rows come from the Hub's openai/gsm8k (config "main", the asked split), whatever folders
    sit beside the installed package; a Hub that cannot be reached is a DataError naming task.source."""
    import datasets

    calls = []

    def load_dataset(name, config, *, split):
        calls.append((name, config, split))
        return [{"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    rows = load_gsm8k("test")
    assert calls == [(GSM8K_HUB_ID, "main", "test")] and GSM8K_HUB_ID == "openai/gsm8k"
    assert [row["answer"] for row in rows] == ["5"] and rows.source == "openai/gsm8k[test]"

    def offline(name, config, *, split):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match=r"from the Hub id 'openai/gsm8k' \(ConnectionError: .*\); set task.source "
                                        r"\(--source of `tempax eval` and `tempax demo`\) to a local folder holding "
                                        r"train.jsonl"):
        load_gsm8k("train")


def test_a_relative_source_is_read_from_the_working_directory(tmp_path: Path, monkeypatch) -> None:
    """`gsm/` names <cwd>/gsm, not a folder relative to the package; a missing one says where it was looked for."""
    (tmp_path / "gsm").mkdir()
    _write_lines(tmp_path / "gsm" / "train.jsonl", [json.dumps({"question": "Q?", "answer": "#### 4"})])
    monkeypatch.chdir(tmp_path)
    assert [row["answer"] for row in load_gsm8k("train", "gsm")] == ["4"]
    with pytest.raises(DataError, match=r"GSM8K source \.\./gsm does not exist \(a relative path is read from "
                                        + re.escape(str(tmp_path)) + r"\); set task.source"):
        load_gsm8k("train", "../gsm")


def test_missing_sources_are_data_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_gsm8k(source=tmp_path / "nowhere.jsonl")
    with pytest.raises(DataError, match="no test.jsonl"):
        load_gsm8k("test", source=tmp_path)
    empty = _write_lines(tmp_path / "empty.jsonl", [])
    with pytest.raises(DataError, match="no rows"):
        load_gsm8k(source=empty)


# ---------------------------------------------------------------- arithmetic


def test_arithmetic_rows_are_consistent() -> None:
    """Every target is in the strict format, its answer verifies, and each reasoning line is true arithmetic."""
    rows = generate_arithmetic(300, seed=1)
    for row in rows:
        assert set(row) == {"prompt_messages", "question", "answer", "target"}
        assert strict_format_ok(row["target"])
        assert answers_match(extract_answer(row["target"]), row["answer"])
        assert int(row["answer"]) >= 1
        reasoning = row["target"].split("\n</reasoning>")[0].removeprefix("<reasoning>\n")
        for line in reasoning.split("\n"):
            left, right = line.split(" = ")
            a, op, b = left.split(" ")
            assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op] == int(right)
        assert row["prompt_messages"][-1] == {"role": "user", "content": row["question"]}
        assert len(row["question"]) < 140  # short prompts: prompt tokens dominate CPU RL compute


def test_arithmetic_is_deterministic() -> None:
    assert generate_arithmetic(50, seed=3) == generate_arithmetic(50, seed=3)
    assert generate_arithmetic(20, seed=3) == generate_arithmetic(50, seed=3)[:20]  # smaller n is a prefix
    assert generate_arithmetic(50, seed=3) != generate_arithmetic(50, seed=4)


def test_arithmetic_splits_are_disjoint() -> None:
    """Disjoint across splits for any seeds (hash buckets), and no duplicates within a split."""
    train = {r["question"] for seed in (0, 1) for r in generate_arithmetic(1000, split="train", seed=seed)}
    test = {r["question"] for seed in (0, 1) for r in generate_arithmetic(200, split="test", seed=seed)}
    assert not train & test
    assert len({r["question"] for r in generate_arithmetic(500, seed=0)}) == 500
    assert all(is_heldout_question(q, 10) for q in test)


def test_arithmetic_difficulty_knobs() -> None:
    """max_steps=1: one reasoning line; add-only with max_operand=9: operands in [2, 9]."""
    one_step = generate_arithmetic(100, config=ArithmeticConfig(max_steps=1))
    assert all(row["target"].count(" = ") == 1 for row in one_step)
    two_step = generate_arithmetic(200, config=ArithmeticConfig(max_steps=2))
    assert {row["target"].count(" = ") for row in two_step} == {1, 2}
    small = generate_arithmetic(50, config=ArithmeticConfig(max_operand=9, operations=("add",), max_steps=1))
    for row in small:
        left = row["target"].split("\n")[1].split(" = ")[0]
        a, op, b = left.split(" ")
        assert op == "+" and 2 <= int(a) <= 9 and 2 <= int(b) <= 9
    mul_only = generate_arithmetic(20, config=ArithmeticConfig(operations=("mul",), max_factor=5))
    assert all(" * " in row["target"] and int(row["answer"]) <= 25 for row in mul_only)


def test_arithmetic_rejects_bad_config(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="max_steps"):
        ArithmeticConfig(max_steps=3)
    with pytest.raises(ConfigError, match="operations"):
        ArithmeticConfig(operations=("div",))
    with pytest.raises(ConfigError, match="split"):
        generate_arithmetic(1, split="validation")
    # add-only, one step, operands 2..3: about 20 names * 12 objects * 2 * 2 amounts * (2 phrases + 19 friends for
    # "gets .. from") ~ 20,000 questions, ~2,000 of them held out: 5,000 cannot be found. A lower give-up bound keeps
    # the test fast (collecting the last few hundred questions first would take seconds).
    monkeypatch.setattr(arithmetic, "MAX_CONSECUTIVE_MISSES", 500)
    with pytest.raises(ConfigError, match="distinct"):
        tiny = ArithmeticConfig(max_operand=3, max_steps=1, operations=("add",))
        generate_arithmetic(5000, split="test", config=tiny)


def test_a_gsm8k_worked_solution_becomes_the_answer_formats_ideal_completion() -> None:
    """Steps before the last `####` are the reasoning, the calculator marks and blank lines go, the parsed final
    number is the answer; the strict-format reward accepts it."""
    solution = "He pays 3 * $4 = $<<3*4=12>>12.\n\nThen  12 + 1,000 = <<12+1000=1012>>1012.\n#### 1,012"
    target = worked_solution_target(solution, "1012")
    assert target == ("<reasoning>\nHe pays 3 * $4 = $12.\nThen 12 + 1,000 = 1012.\n</reasoning>\n<answer>\n1012\n"
                      "</answer>")
    assert strict_format_ok(target) and extract_answer(target) == "1012"
