"""The code reward: the share of a task row's hidden tests that the completion's program passes, run in the sandbox.

    reward = CodeTestsReward(CodeRewardConfig())
    reward(prompts, completions, tests=[[{"args": [[1, 2]], "expected": 3}, ...], ...], entry_point=["add", ...])

The program is the last fenced code block of the completion (```python ... ```, or a bare ``` block); without
one the completion scores 0 and is out of format. It runs with a harness appended that calls
`entry_point(*args)` for every test's arguments and prints each return value as JSON on a marked line. The
expected values never enter the sandbox: the trainer compares the printed values with them, so a program cannot
pass a test without computing its answer (printing "all passed", exiting early, or returning an object whose
`__eq__` is always true earns nothing). The comparison is of canonical JSON, so it is type-strict: `True` is not
`1`, `6.0` is not `6`, and a tuple equals the list of its items.

Each completion's program runs under the sandbox's limits (`tempax.rewards.sandbox.SandboxConfig`); a batch runs
`workers` programs at a time. A program that times out, is killed, or writes too much scores the tests it
printed before it ended (0 for all of them with `all_tests`). `CodeTestsReward.metrics()` gives the sandbox's
counters (`sandbox/timeouts`, `sandbox/killed`, ...).
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from tempax.configlib import help_field
from tempax.errors import DataError
from tempax.rewards.sandbox import ProgramResult, Sandbox, SandboxConfig

CASE_MARKER = "#tempax-case# "
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = ("", "python", "py", "python3")


@dataclass(frozen=True)
class CodeRewardConfig:
    """The code reward (`code_tests`): how a row's hidden tests are scored, and the sandbox they run in."""

    all_tests: bool = help_field("1 when every hidden test passes, else 0; false: the fraction of tests passed.",
                                 False)
    sandbox: SandboxConfig = help_field("Limits of each program (tempax.rewards.sandbox).",
                                        default_factory=SandboxConfig)


@dataclass(frozen=True)
class CodeCheck:
    """One completion's verdict: a program was found (`format_ok`), tests passed of total, and how it ended."""

    format_ok: bool
    passed: int
    total: int
    status: str

    @property
    def all_passed(self) -> bool:
        return self.format_ok and self.total > 0 and self.passed == self.total

    @property
    def timed_out(self) -> bool:
        return self.status in ("timeout", "cpu_limit")

    def score(self, all_tests: bool) -> float:
        if all_tests:
            return float(self.all_passed)
        return self.passed / self.total if self.total else 0.0


def extract_program(completion: str) -> str | None:
    """The last fenced Python (or untagged) code block of a completion; an unclosed last block runs to the end."""
    blocks = [body for tag, body in _FENCE.findall(completion) if tag.lower() in _PYTHON_TAGS]
    return blocks[-1] if blocks and blocks[-1].strip() else None


def harnessed_program(solution: str, entry_point: str, cases: Sequence[Sequence[Any]]) -> str:
    """The solution with a harness that calls `entry_point(*args)` for each case and prints one marked JSON line
    per case: `{"case": i, "out": value}` or `{"case": i, "error": name}`."""
    if not entry_point.isidentifier():
        raise DataError(f"a code task row's entry_point must be a Python name, got {entry_point!r}")
    harness = f"""

import json as _tempax_json
for _tempax_i, _tempax_args in enumerate(_tempax_json.loads({json.dumps(json.dumps([list(c) for c in cases]))})):
    try:
        _tempax_line = _tempax_json.dumps({{"case": _tempax_i, "out": {entry_point}(*_tempax_args)}})
    except BaseException as _tempax_e:
        _tempax_line = _tempax_json.dumps({{"case": _tempax_i, "error": type(_tempax_e).__name__}})
    print({CASE_MARKER!r} + _tempax_line, flush=True)
"""
    return solution.rstrip() + "\n" + harness


def canonical(value: Any) -> str:
    """The JSON text two values are compared by (type-strict, tuples as lists, keys sorted)."""
    return json.dumps(value, sort_keys=True)


def count_passed(result: ProgramResult, expected: Sequence[Any]) -> int:
    """Tests whose marked output line (the first one of its case) equals the expected value."""
    seen: dict[int, str] = {}
    for line in result.stdout.splitlines():
        if not line.startswith(CASE_MARKER):
            continue
        try:
            record = json.loads(line[len(CASE_MARKER):])
        except json.JSONDecodeError:
            continue
        case = record.get("case") if isinstance(record, dict) else None
        if isinstance(case, int) and case not in seen and "out" in record:
            seen[case] = canonical(record["out"])
    want = [canonical(v) for v in expected]
    return sum(1 for i, w in enumerate(want) if seen.get(i) == w)


def _tests_of(tests: Any, where: str) -> tuple[list[list[Any]], list[Any]]:
    if isinstance(tests, str):
        tests = json.loads(tests)
    if not isinstance(tests, list) or not all(isinstance(t, Mapping) and "args" in t and "expected" in t
                                              for t in tests):
        raise DataError(f"{where}: the 'tests' column must be a list of {{'args': [...], 'expected': value}}")
    return [list(t["args"]) for t in tests], [t["expected"] for t in tests]


def check_programs(sandbox: Sandbox, completions: Sequence[str], tests: Sequence[Any],
                   entry_points: Sequence[str]) -> list[CodeCheck]:
    """Runs each completion's program against its row's tests (in parallel) and returns the verdicts."""
    programs: list[str] = []
    where: list[int] = []
    parsed = [_tests_of(t, f"code task row {i}") for i, t in enumerate(tests)]
    for i, completion in enumerate(completions):
        solution = extract_program(completion)
        if solution is not None:
            programs.append(harnessed_program(solution, str(entry_points[i]), parsed[i][0]))
            where.append(i)
    results = dict(zip(where, sandbox.run_many(programs)))
    checks = []
    for i in range(len(completions)):
        total = len(parsed[i][1])
        if i not in results:
            checks.append(CodeCheck(False, 0, total, "no_program"))
            continue
        result = results[i]
        checks.append(CodeCheck(True, count_passed(result, parsed[i][1]), total, result.status))
    return checks


_shared: Sandbox | None = None
_shared_lock = threading.Lock()


def shared_sandbox() -> Sandbox:
    """The process-wide sandbox with the default limits that evaluation scores code rows in (made on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Sandbox(SandboxConfig())
        return _shared


class CodeTestsReward:
    """The `code_tests` reward function (see the module docstring); it refuses to be built where the sandbox
    cannot isolate programs as configured (`SandboxUnavailable`), and says once what it cannot promise."""

    __name__ = "code_tests"

    def __init__(self, config: CodeRewardConfig = CodeRewardConfig()) -> None:
        self.config = config
        self.sandbox = Sandbox(config.sandbox)
        self.sandbox.run("pass")  # raises SandboxUnavailable now, before training, and prints what is missing

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], *, tests: Sequence[Any] | None = None,
                 entry_point: Sequence[str] | None = None, **columns: Any) -> list[float]:
        del prompts, columns
        if tests is None or entry_point is None:
            raise DataError("the code_tests reward needs the task's 'tests' and 'entry_point' columns (task.name=code)")
        checks = check_programs(self.sandbox, completions, tests, entry_point)
        return [c.score(self.config.all_tests) for c in checks]

    def metrics(self) -> dict[str, float]:
        return self.sandbox.counters.metrics()
