"""tempax.progress: a bar only where someone watches, the same calls either way."""

from __future__ import annotations

import io

import pytest

from tempax.progress import work_bar


def test_off_a_terminal_no_bar_is_drawn_and_the_calls_still_work(monkeypatch):
    """pytest captures stderr, so it is no terminal: enabled=None draws nothing; enabled=False never draws."""
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    for enabled in (None, False):
        with work_bar(3, "scoring test.jsonl", unit="seq", enabled=enabled) as bar:
            bar.update()
            bar.update(2)
        bar.close()
    assert stderr.getvalue() == ""


def test_enabled_draws_a_labelled_bar_counting_units(monkeypatch):
    tqdm = pytest.importorskip("tqdm")
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    with work_bar(4, "eval gsm8k greedy", unit="problem", enabled=True) as bar:
        assert isinstance(bar, tqdm.tqdm) and bar.total == 4 and bar.desc == "eval gsm8k greedy"
        bar.update(4)
        assert bar.n == 4
    assert "eval gsm8k greedy" in stderr.getvalue()
