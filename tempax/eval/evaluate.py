"""Generation-based evaluation on a verifiable task: format accuracy, answer accuracy and pass@k.

    result = evaluate(model, tokenizer, rows, EvalOptions(max_new_tokens=256, group_size=4, ks=(1, 4)))
    print(result.summary_line())

Rows are task rows (`tempax.data.tasks`: `prompt_messages` and `answer`). Each prompt is rendered with the chat
template and answered

  * greedily (temperature 0): the model's most likely completion, the usual "accuracy" number;
  * and/or with `group_size` sampled completions per problem (at `temperature`), for unbiased pass@k
    (`tempax.eval.metrics.pass_at_k`) and the mean sampled accuracy (= pass@1).

A completion is in format when `tempax.rewards.strict_format_ok` accepts it (the exact
`<reasoning>..</reasoning><answer>..</answer>` form) and correct when the content of its last `<answer>` tag equals
the reference (`tempax.rewards.answers_match`), whether or not the rest is well formed. Each completion's check
runs under its own deadline (`EvalOptions.check_timeout_s`, `tempax.rewards.check_completions`), so one
pathological answer cannot hang the evaluation: it counts as wrong and unformatted, and as a timeout in the
results (`check_timeouts`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from tempax.errors import ConfigError, DataError
from tempax.eval.metrics import EvalSummary, pass_at_k_interval, summarize
from tempax.generate import SamplingConfig, generate
from tempax.parallel.process import is_writer
from tempax.progress import work_bar
from tempax.rewards.code import check_programs, shared_sandbox
from tempax.rewards.correctness import CHECK_TIMEOUT_S, check_completions


@dataclass(frozen=True)
class EvalOptions:
    """How to evaluate.

    Attributes:
      max_new_tokens: generation budget per completion.
      greedy: evaluate the greedy completion.
      group_size: sampled completions per problem (0: none); a recipe's `eval.group_size`, `--samples` of
        `tempax eval`.
      temperature, top_p: knobs of the sampled completions.
      ks: pass@k values to report (each <= group_size); pass@k needs sampled completions.
      batch_size: prompts per generation call.
      seed: sampling seed.
      check_timeout_s: deadline of one completion's format and answer check, in seconds (None: no deadline).
    """

    max_new_tokens: int = 256
    greedy: bool = True
    group_size: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    ks: tuple[int, ...] = (1,)
    batch_size: int = 64
    seed: int = 0
    check_timeout_s: float | None = CHECK_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.greedy and not self.group_size:
            raise ConfigError("nothing to evaluate: enable eval.greedy or set eval.group_size > 0 (tempax eval: drop "
                              "--no-greedy or pass --samples)")
        if self.group_size and any(k < 1 or k > self.group_size for k in self.ks):
            raise ConfigError(f"pass@k needs 1 <= k <= group_size={self.group_size}; got ks={self.ks}")
        if self.group_size and not self.temperature > 0:
            raise ConfigError(f"sampled evaluation needs temperature > 0, got {self.temperature}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.check_timeout_s is not None and not self.check_timeout_s > 0:
            raise ConfigError(f"check_timeout_s must be > 0 seconds (or None), got {self.check_timeout_s}")


@dataclass
class Scored:
    """One problem's completions and their verdicts."""

    question: str
    answer: str
    completions: list[str]
    format_ok: list[bool]
    correct: list[bool]
    lengths: list[int]
    timed_out: list[bool] = field(default_factory=list)


@dataclass
class TaskEvaluation:
    """What `evaluate` measured.

    Attributes:
      greedy: summary of the greedy completions (None when not evaluated).
      sampled: summary of the sampled completions, pass@k included (None when not evaluated).
      greedy_records / sampled_records: per-problem completions and verdicts.
      seconds: wall time of the evaluation.
    """

    greedy: EvalSummary | None
    sampled: EvalSummary | None
    greedy_records: list[Scored] = field(default_factory=list)
    sampled_records: list[Scored] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def format_accuracy(self) -> float:
        return (self.greedy or self.sampled).format_accuracy  # type: ignore[union-attr]

    @property
    def answer_accuracy(self) -> float:
        return (self.greedy or self.sampled).answer_accuracy  # type: ignore[union-attr]

    @property
    def check_timeouts(self) -> dict[str, int]:
        """Completions whose check ran past its deadline (scored wrong), per mode evaluated."""
        out = {}
        if self.greedy is not None:
            out["greedy"] = sum(sum(r.timed_out) for r in self.greedy_records)
        if self.sampled is not None:
            out["sampled"] = sum(sum(r.timed_out) for r in self.sampled_records)
        return out

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        out: dict[str, float] = {}
        if self.greedy is not None:
            out.update(self.greedy.metrics(f"{prefix}greedy/"))
        if self.sampled is not None:
            out.update(self.sampled.metrics(f"{prefix}sampled/"))
        for mode, count in self.check_timeouts.items():
            out[f"{prefix}{mode}/check_timeouts"] = float(count)
        out[f"{prefix}seconds"] = self.seconds
        return out

    def summary_line(self) -> str:
        parts = []
        if self.greedy is not None:
            g = self.greedy
            parts.append(f"greedy: format {g.format_accuracy:.1%}, answer {g.answer_accuracy:.1%}")
        if self.sampled is not None:
            s = self.sampled
            ks = ", ".join(f"pass@{k} {v:.1%}" for k, v in sorted(s.pass_at_k.items()))
            parts.append(f"sampled x{s.num_samples // max(s.num_problems, 1)}: format {s.format_accuracy:.1%}, "
                         f"answer {s.answer_accuracy:.1%}" + (f", {ks}" if ks else ""))
        timeouts = sum(self.check_timeouts.values())
        if timeouts:
            parts.append(f"{timeouts} completion check{'s' if timeouts > 1 else ''} timed out (scored wrong)")
        n = (self.greedy or self.sampled).num_problems if (self.greedy or self.sampled) else 0
        return f"{n} problems; " + "; ".join(parts) + f" ({self.seconds:.0f} s)"

    def to_dict(self) -> dict[str, Any]:
        def one(s: EvalSummary | None) -> dict[str, Any] | None:
            if s is None:
                return None
            return {"num_problems": s.num_problems, "num_samples": s.num_samples,
                    "format_accuracy": s.format_accuracy, "answer_accuracy": s.answer_accuracy,
                    "mean_completion_length": s.mean_completion_length,
                    "pass_at_k": {str(k): v for k, v in s.pass_at_k.items()}}

        return {"greedy": one(self.greedy), "sampled": one(self.sampled), "seconds": self.seconds,
                "check_timeouts": self.check_timeouts}

    def records(self) -> dict[str, list[dict[str, Any]]]:
        """Every problem's completions and verdicts, per decoding mode, as JSON-able data."""
        return {"greedy": [dataclasses.asdict(r) for r in self.greedy_records],
                "sampled": [dataclasses.asdict(r) for r in self.sampled_records]}

    def by_mode(self, temperature: float) -> list[tuple[str, "TaskEvaluation"]]:
        """One (label, evaluation) per decoding mode evaluated, greedy first, for `format_table`; the sampled
        row's label names its `temperature`."""
        rows = []
        if self.greedy is not None:
            rows.append(("greedy", dataclasses.replace(self, sampled=None)))
        if self.sampled is not None:
            rows.append((f"sampled (T={temperature})", dataclasses.replace(self, greedy=None)))
        return rows


def score_completions(
    completions: Sequence[str], answer: Any, *, timeout_s: float | None = CHECK_TIMEOUT_S
) -> tuple[list[bool], list[bool], list[bool]]:
    """(strict format ok, answer correct, check timed out) for each completion of one problem, each completion's
    check under its own `timeout_s` deadline."""
    checks = check_completions(completions, [answer] * len(completions), timeout_s=timeout_s)
    return [c.format_ok for c in checks], [c.correct for c in checks], [c.timed_out for c in checks]


def score_row(
    completions: Sequence[str], row: dict[str, Any], *, timeout_s: float | None = CHECK_TIMEOUT_S
) -> tuple[list[bool], list[bool], list[bool]]:
    """`score_completions` for one task row. A code task row (`tests` and `entry_point` columns) is scored by
    running each completion's program against its hidden tests in the sandbox instead: in format when it holds
    a code block, correct when every test passes, timed out when the program hit a time limit
    (`tempax.rewards.code`)."""
    if "tests" in row and "entry_point" in row:
        n = len(completions)
        checks = check_programs(shared_sandbox(), completions, [row["tests"]] * n, [row["entry_point"]] * n)
        return [c.format_ok for c in checks], [c.all_passed for c in checks], [c.timed_out for c in checks]
    return score_completions(completions, row["answer"], timeout_s=timeout_s)


def _prompt_ids(tokenizer: Any, rows: Sequence[dict[str, Any]]) -> list[list[int]]:
    out = []
    for i, row in enumerate(rows):
        if "prompt_messages" not in row or "answer" not in row:
            raise DataError(f"evaluation row {i} needs 'prompt_messages' and 'answer' (keys: {sorted(row)})")
        text = tokenizer.apply_chat_template(row["prompt_messages"], add_generation_prompt=True)
        out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


def _run(
    model: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], ids: list[list[int]], config: SamplingConfig,
    batch_size: int, ks: Sequence[int], timeout_s: float | None, desc: str,
) -> tuple[EvalSummary, list[Scored]]:
    records: list[Scored] = []
    with work_bar(len(rows), desc, unit="problem", enabled=None if is_writer() else False) as bar:
        for start in range(0, len(rows), batch_size):
            chunk = ids[start:start + batch_size]
            # prompt_offset keeps each problem's random stream independent of the batching.
            result = generate(model, tokenizer, chunk, config, prompt_offset=start)
            for i, texts in enumerate(result.grouped()):
                row = rows[start + i]
                fmt, correct, timed_out = score_row(texts, row, timeout_s=timeout_s)
                lengths = [int(x) for x in result.lengths[i * result.n:(i + 1) * result.n]]
                records.append(Scored(str(row.get("question", "")), str(row["answer"]), list(texts), fmt, correct,
                                      lengths, timed_out))
            bar.update(len(chunk))
    summary = summarize([r.format_ok for r in records], [r.correct for r in records], [r.lengths for r in records],
                        ks=ks)
    return summary, records


def evaluate(
    model: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], options: EvalOptions = EvalOptions(), *,
    label: str = "eval",
) -> TaskEvaluation:
    """Generates completions for every row and scores them (see the module docstring).

    Args:
      model: a tempax `Decoder` (LoRA-wrapped or not).
      tokenizer: its tokenizer (chat template, stop tokens).
      rows: task rows with `prompt_messages` and `answer` (and optionally `question`, kept in the records).
      options: what to evaluate.
      label: what the progress bar calls this evaluation ("eval after", "eval gsm8k"); its mode follows.
    """
    if not rows:
        raise DataError("no evaluation problems given")
    t0 = time.perf_counter()
    ids = _prompt_ids(tokenizer, rows)
    greedy = sampled = None
    greedy_records: list[Scored] = []
    sampled_records: list[Scored] = []
    if options.greedy:
        config = SamplingConfig(max_new_tokens=options.max_new_tokens, temperature=0.0, n=1, logprobs=False)
        greedy, greedy_records = _run(model, tokenizer, rows, ids, config, options.batch_size, (1,),
                                      options.check_timeout_s, f"{label} greedy")
    if options.group_size:
        config = SamplingConfig(
            max_new_tokens=options.max_new_tokens, temperature=options.temperature, top_p=options.top_p,
            n=options.group_size, seed=options.seed, logprobs=False,
        )
        sampled, sampled_records = _run(model, tokenizer, rows, ids, config, options.batch_size, options.ks,
                                        options.check_timeout_s, f"{label} sampled x{options.group_size}")
    return TaskEvaluation(greedy, sampled, greedy_records, sampled_records, time.perf_counter() - t0)


def format_table(results: Sequence[tuple[str, TaskEvaluation]]) -> str:
    """A plain-text table with one line per evaluated stage (format / answer accuracy, pass@k when sampled)."""
    ks = sorted({k for _, r in results if r.sampled is not None for k in r.sampled.pass_at_k})
    header = ["stage", "format acc", "answer acc"] + [f"pass@{k}" for k in ks] + ["mean len", "problems"]
    lines = [header]
    for name, r in results:
        main = r.greedy or r.sampled
        row = [name, f"{main.format_accuracy:6.1%}", f"{main.answer_accuracy:6.1%}"]
        row += [f"{r.sampled.pass_at_k[k]:6.1%}" if r.sampled is not None and k in r.sampled.pass_at_k else "-"
                for k in ks]
        row += [f"{main.mean_completion_length:.0f}", str(main.num_problems)]
        lines.append(row)
    return render_rows(lines)


def render_rows(lines: Sequence[Sequence[str]]) -> str:
    """Plain-text table: the first row is the header (underlined), the first column left-aligned, the rest right."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = []
    for n, line in enumerate(lines):
        out.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths))))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def interval_lines(result: TaskEvaluation) -> list[str]:
    """pass@1 of the greedy completions and pass@k of the sampled ones, each with its 95% interval over problems
    (`tempax.eval.metrics.pass_at_k_interval`)."""
    lines = []
    if result.greedy is not None:
        m, low, high = pass_at_k_interval([r.correct for r in result.greedy_records], 1)
        lines.append(f"greedy pass@1 {m:.1%} (95% CI [{low:.1%}, {high:.1%}])")
    if result.sampled is not None:
        for k in sorted(result.sampled.pass_at_k):
            m, low, high = pass_at_k_interval([r.correct for r in result.sampled_records], k)
            lines.append(f"sampled pass@{k} {m:.1%} (95% CI [{low:.1%}, {high:.1%}])")
    return lines
