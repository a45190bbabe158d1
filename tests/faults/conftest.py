"""The fault suite's count: each test records the fault class and injection point it survived, and the session
ends with one summary line (quoted in the README with the command that prints it):

    .venv/bin/python -m pytest -q -p no:xdist tests/faults
"""

from __future__ import annotations

import glob
import os
import re

import pytest

_SURVIVED: list[tuple[str, str]] = []
_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A test of bad input: it expects a TempaxError subclass (or exit status 2) from the code it calls.
_BAD_INPUT = re.compile(
    r"pytest\.raises\(\s*\(?\s*(?:\w+\.)?(?:TempaxError|ConfigError|DataError|CheckpointError|GenerationError|"
    r"CheckpointMismatch|DamagedCheckpoint|RunDirBusy|StorageError|CheckpointSaveFailed|TrainingDiverged)\b"
    r"|==\s*2\b.*(?:returncode|main\()|(?:returncode|main\(.*\))\s*==\s*2\b"
)


@pytest.fixture
def survived():
    """`survived(fault_class, injection_point)`: call once the resumed run matched the uninterrupted one."""
    return lambda fault, point: _SURVIVED.append((fault, point))


_CONTAINED: list[str] = []


@pytest.fixture
def contained():
    """`contained(attack)`: call once a program attacking the sandbox was contained, scored 0 and counted."""
    return _CONTAINED.append


def bad_input_cases() -> int:
    """Assertions in tests/ that bad input is refused (a TempaxError or an exit status 2)."""
    count = 0
    for path in glob.glob(os.path.join(_TESTS, "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as f:
            count += sum(1 for line in f if _BAD_INPUT.search(line))
    return count


def pytest_terminal_summary(terminalreporter):
    if _CONTAINED:
        terminalreporter.write_line(f"sandbox attacks: {len(_CONTAINED)} tried, each contained, scored 0 and "
                                    f"counted ({', '.join(_CONTAINED)})")
    if not _SURVIVED:
        return
    classes = sorted({f for f, _ in _SURVIVED})
    terminalreporter.write_line(
        f"fault suite: {len(classes)} fault classes x {len(set(_SURVIVED))} injection points survived "
        f"({', '.join(classes)}); {bad_input_cases()} bad-input cases tried across tests/"
    )
