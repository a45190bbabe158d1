"""Generation-based task evaluation: verdicts, greedy vs sampled, pass@k, batching and the printed table.

Most tests replace the generator with a fake that returns fixed completions, so the numbers are worked out by
hand; one test runs the real generator on the tiny model to check the plumbing end to end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import tempax.eval.evaluate as ev
from tempax.errors import ConfigError
from tempax.eval.evaluate import EvalOptions, TaskEvaluation, evaluate, format_table, score_completions
from tempax.eval.metrics import EvalSummary
from tests.kit.tokenizers import tiny_chat_tokenizer

GOOD = "<reasoning>\n2 + 3 = 5\n</reasoning>\n<answer>\n5\n</answer>"
WRONG = "<reasoning>\n2 + 3 = 6\n</reasoning>\n<answer>\n6\n</answer>"
LOOSE_RIGHT = "I think <answer>5</answer>"  # correct answer, not the strict format


def rows(n: int) -> list[dict]:
    return [{"prompt_messages": [{"role": "user", "content": f"q{i}"}], "answer": "5", "question": f"q{i}"}
            for i in range(n)]


def test_verdicts_separate_format_from_correctness():
    """Strict form + right answer: (True, True); strict form + wrong: (True, False); loose tags + right
    answer: (False, True); no tags: (False, False)."""
    fmt, correct, timed_out = score_completions([GOOD, WRONG, LOOSE_RIGHT, "5"], "5")
    assert fmt == [True, True, False, False]
    assert correct == [True, False, True, False]
    assert timed_out == [False] * 4


def test_a_hanging_answer_check_times_out_alone(monkeypatch):
    """Problem 1's greedy answer is the power tower 9^9^9^9, which sympy tries to evaluate and never finishes
    (the check hangs the evaluation without a deadline). With a 1 s deadline per completion, its check alone
    fails: neither in format nor correct, so format 2/3 and answer 2/3, and it is counted in the results."""
    tower = GOOD.replace("\n5\n</answer>", "\n9^9^9^9\n</answer>")
    monkeypatch.setattr(ev, "generate", FakeGenerate([GOOD, tower, GOOD]))
    result = evaluate(None, tiny_chat_tokenizer(), rows(3), EvalOptions(max_new_tokens=8, check_timeout_s=1.0))
    assert [r.timed_out for r in result.greedy_records] == [[False], [True], [False]]
    assert [r.correct for r in result.greedy_records] == [[True], [False], [True]]
    assert result.greedy.answer_accuracy == pytest.approx(2 / 3)
    assert result.greedy.format_accuracy == pytest.approx(2 / 3)
    assert result.check_timeouts == {"greedy": 1}
    assert result.metrics()["eval/greedy/check_timeouts"] == 1.0
    assert result.to_dict()["check_timeouts"] == {"greedy": 1}
    assert "1 completion check timed out" in result.summary_line()


@dataclass
class FakeResult:
    texts: list[str]
    lengths: np.ndarray
    n: int

    def grouped(self):
        return [self.texts[i * self.n:(i + 1) * self.n] for i in range(len(self.texts) // self.n)]


class FakeGenerate:
    """Answers problem i (global index = prompt_offset + position) from `script[i]` (greedy) or `samples[i]`."""

    def __init__(self, greedy: list[str], samples: list[list[str]] | None = None):
        self.greedy, self.samples, self.calls = greedy, samples, []

    def __call__(self, model, tokenizer, prompts, config, *, prompt_offset=0):
        self.calls.append((len(prompts), config.n, config.temperature, prompt_offset))
        idx = range(prompt_offset, prompt_offset + len(prompts))
        texts = [self.greedy[i] for i in idx] if config.n == 1 and config.temperature == 0 else \
            [t for i in idx for t in self.samples[i]]
        return FakeResult(texts, np.array([len(t) for t in texts]), config.n)


def test_greedy_and_sampled_accuracy_and_pass_at_k(monkeypatch):
    """3 problems, batch size 2 (calls of 2 + 1 prompts).
    Greedy: GOOD, WRONG, LOOSE_RIGHT -> format 2/3, answer 2/3.
    Sampled x2: [GOOD, WRONG], [WRONG, WRONG], [LOOSE_RIGHT, GOOD] -> format 5/6, answer 3/6 = 0.5;
    pass@1 = mean(1/2, 0, 1) = 0.5; pass@2 = mean(1, 0, 1) = 2/3."""
    fake = FakeGenerate([GOOD, WRONG, LOOSE_RIGHT], [[GOOD, WRONG], [WRONG, WRONG], [LOOSE_RIGHT, GOOD]])
    monkeypatch.setattr(ev, "generate", fake)
    result = evaluate(None, tiny_chat_tokenizer(), rows(3),
                      EvalOptions(max_new_tokens=8, group_size=2, ks=(1, 2), batch_size=2))
    assert result.greedy.format_accuracy == pytest.approx(2 / 3)
    assert result.greedy.answer_accuracy == pytest.approx(2 / 3)
    assert result.sampled.format_accuracy == pytest.approx(5 / 6)
    assert result.sampled.answer_accuracy == pytest.approx(0.5)
    assert result.sampled.pass_at_k == pytest.approx({1: 0.5, 2: 2 / 3})
    assert [c[0] for c in fake.calls] == [2, 1, 2, 1]  # batched by 2 prompts, greedy first
    assert [c[3] for c in fake.calls] == [0, 2, 0, 2]  # each chunk keeps its problems' random streams
    assert result.greedy_records[2].correct == [True] and result.greedy_records[2].format_ok == [False]
    m = result.metrics()
    assert m["eval/greedy/answer_accuracy"] == pytest.approx(2 / 3) and m["eval/sampled/pass@2"] == pytest.approx(2 / 3)


def test_table_has_one_line_per_stage(monkeypatch):
    monkeypatch.setattr(ev, "generate", FakeGenerate(["x", "y"]))
    base = evaluate(None, tiny_chat_tokenizer(), rows(2), EvalOptions(max_new_tokens=8))
    monkeypatch.setattr(ev, "generate", FakeGenerate([GOOD, WRONG]))
    trained = evaluate(None, tiny_chat_tokenizer(), rows(2), EvalOptions(max_new_tokens=8))
    table = format_table([("base model", base), ("after GRPO", trained)])
    lines = table.splitlines()
    assert len(lines) == 4 and "format acc" in lines[0] and "answer acc" in lines[0]
    assert "base model" in lines[2] and "0.0%" in lines[2]
    assert "after GRPO" in lines[3] and "100.0%" in lines[3] and "50.0%" in lines[3]


def test_options_are_checked():
    with pytest.raises(ConfigError, match="group_size"):
        EvalOptions(group_size=2, ks=(4,))
    with pytest.raises(ConfigError, match="nothing to evaluate"):
        EvalOptions(greedy=False)
    with pytest.raises(ConfigError, match="check_timeout_s"):
        EvalOptions(check_timeout_s=0)


def test_to_dict_round_trips_the_numbers():
    s = EvalSummary(num_problems=2, num_samples=2, format_accuracy=0.5, answer_accuracy=0.25,
                    mean_completion_length=10.0, pass_at_k={1: 0.25})
    d = TaskEvaluation(greedy=s, sampled=None).to_dict()
    assert d["greedy"]["answer_accuracy"] == 0.25 and d["greedy"]["pass_at_k"] == {"1": 0.25}
    assert d["sampled"] is None


@pytest.mark.slow
def test_real_generation_on_the_tiny_model():
    """The random tiny model answers nothing correctly; the plumbing (chat template, batching, lengths)
    works with the real generator."""
    from tests.kit.models import tiny_tempax_model

    model = tiny_tempax_model("llama", vocab_size=400, num_layers=2)
    result = evaluate(model, tiny_chat_tokenizer(), rows(3),
                      EvalOptions(max_new_tokens=4, group_size=2, ks=(1, 2), batch_size=2))
    assert result.greedy.num_problems == 3 and result.sampled.num_samples == 6
    assert result.greedy.answer_accuracy == 0.0
    assert 1 <= result.greedy.mean_completion_length <= 4


def test_each_mode_runs_under_a_bar_naming_it(monkeypatch, capsys):
    """3 problems, greedy then 2 samples each: two bars, labelled with the evaluation and its mode, counting
    the 3 problems (the wait on a 2-core machine is minutes)."""
    import tempax.progress

    monkeypatch.setattr(tempax.progress, "on_terminal", lambda: True)
    monkeypatch.setattr(ev, "generate", FakeGenerate([GOOD] * 3, [[GOOD, WRONG]] * 3))
    evaluate(None, tiny_chat_tokenizer(), rows(3), EvalOptions(max_new_tokens=8, group_size=2, ks=(1, 2)),
             label="eval after")
    err = capsys.readouterr().err
    assert "eval after greedy:   0%|" in err and "eval after sampled x2:   0%|" in err and "0/3 [" in err
