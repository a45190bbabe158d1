"""The end-to-end tier's case record and runner: a documented command, run as a user would, in a subprocess.

A `Case` names the command(s) of README.md / docs/*.md it covers, exactly as written there (the coverage test,
tests/e2e/test_coverage.py, matches the text), and the command line it runs: the documented one with the smallest
overrides that still take the same path (2 steps, a handful of rows, short generations) and every output sent
under the test's temporary folder. Placeholders in `command`:

- `{run}`: this case's run dir (a training case adds `train.run_dir={run}` itself when it names `steps`);
- `{tmp}`: this case's temporary folder;
- `{sft}`: the shared LoRA SFT run dir (tests/e2e/conftest.py `sft_run`), the RUN_DIR / SOURCE of the guides;
- `{rm}`: the shared reward-model run dir (`reward_model_run`).

Every case checks: the exit status, that no traceback was printed (stdout and stderr), the regexes of `expect`,
the files of `files`, and for a training case the done line at `steps` and the `metrics` keys in metrics.jsonl.
Another test module adds cases by defining module-level `Case`s (or lists of them) and running them with
`run_case`; the coverage test collects every `Case` of tests/e2e/test_*.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import time
from typing import Mapping, Sequence

from tests.documented_commands import ROOT
from tests.kit.xla import TEST_XLA_FLAGS

TRACEBACK = "Traceback (most recent call last)"
DONE_LINE = r"done: step {steps}, loss [-+0-9.einaf]+; run dir {run} \(curves: tempax plot {run}\)"
# The training recipes' `train:` fields that make a run small; each case adds the data/generation ones its recipe has.
SMALL_TRAIN = "train.batch_size=2 train.seq_len=64 train.eval_every=0 train.optimizer.warmup_steps=0"


@dataclasses.dataclass(frozen=True)
class Case:
    """One documented command (or several that take the same path) and the command line the tier runs for it."""

    covers: str | tuple[str, ...]
    command: str
    steps: int | None = None
    metrics: tuple[str, ...] = ("loss", "lr", "grad_norm")
    expect: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    stdin: str | None = None
    rc: int = 0
    name: str = ""

    @property
    def covered(self) -> tuple[str, ...]:
        return (self.covers,) if isinstance(self.covers, str) else tuple(self.covers)

    @property
    def id(self) -> str:
        return self.name or re.sub(r"[^A-Za-z0-9_.=-]+", "_", self.covered[0].removeprefix("tempax "))[:60]

    @property
    def placeholders(self) -> set[str]:
        return set(re.findall(r"\{(\w+)\}", self.command + " ".join(self.files)))


@dataclasses.dataclass(frozen=True)
class Result:
    rc: int
    output: str  # stdout then stderr
    wall_s: float
    cpu_s: float  # user + system seconds of the command and the processes it waited for


def tempax_argv() -> list[str]:
    """The installed `tempax` script beside this interpreter, else the module (the same entry point)."""
    script = os.path.join(os.path.dirname(sys.executable), "tempax")
    return [script] if os.path.isfile(script) else [sys.executable, "-m", "tempax.cli.main"]


def user_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a user's shell: the test process's own XLA device count (tests/conftest.py) removed, so
    the command starts XLA as `tempax` does for a user; TEMPAX_CACHE is the tier's shared cache (conftest)."""
    env = dict(os.environ)
    if env.get("XLA_FLAGS") == TEST_XLA_FLAGS:
        del env["XLA_FLAGS"]
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def run_tempax(argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdin: str | None = None,
               timeout: float = 600, cwd: str = ROOT) -> Result:
    """Runs `tempax ARGV` to its end; fails the test if it printed a traceback."""
    start, cpu = time.monotonic(), children_cpu_s()
    done = subprocess.run(tempax_argv() + list(argv), cwd=cwd, env=user_env(env), input=stdin if stdin is not None
                          else "", capture_output=True, text=True, timeout=timeout)
    result = Result(done.returncode, done.stdout + done.stderr, time.monotonic() - start, children_cpu_s() - cpu)
    assert TRACEBACK not in result.output, f"tempax {shlex.join(argv)} printed a traceback:\n{tail(result.output)}"
    return result


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tail(text: str, chars: int = 4000) -> str:
    return text[-chars:]


def fill(text: str, values: Mapping[str, object]) -> str:
    """`text` with each `{name}` of `values` replaced; other braces (a regex's `\\{`) stay as they are."""
    return re.sub(r"\{(\w+)\}", lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), text)


def case_argv(case: Case, values: Mapping[str, str]) -> list[str]:
    argv = shlex.split(fill(case.command, values))
    if case.steps is not None:
        argv += [f"train.steps={case.steps}", f"train.run_dir={values['run']}"]
    return argv


def read_metrics(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def check_training(run_dir: str, output: str, steps: int, metrics: Sequence[str]) -> list[dict]:
    """The done line at `steps`, and metrics.jsonl holding `metrics` at every step 1..steps."""
    assert re.search(fill(DONE_LINE, {"steps": steps, "run": re.escape(run_dir)}), output), tail(output)
    records = read_metrics(run_dir)
    for key in metrics:
        logged = {r["step"] for r in records if key in r}
        missing = sorted(set(range(1, steps + 1)) - logged)
        assert not missing, f"{key} missing at steps {missing} of {run_dir}/metrics.jsonl"
    return records


def run_case(case: Case, values: Mapping[str, str], record=None) -> Result:
    """Runs `case` with its placeholders filled from `values` and checks everything it promises."""
    argv = case_argv(case, values)
    result = run_tempax(argv, env={k: fill(v, values) for k, v in case.env.items()}, stdin=case.stdin)
    if record is not None:
        record(result.wall_s, result.cpu_s)
    assert result.rc == case.rc, f"tempax {shlex.join(argv)} exited {result.rc}, expected {case.rc}:\n{tail(result.output)}"
    for pattern in case.expect:
        assert re.search(fill(pattern, values), result.output), f"{pattern!r} not in the output:\n{tail(result.output)}"
    for path in case.files:
        assert os.path.exists(fill(path, values)), f"{fill(path, values)} missing after tempax {shlex.join(argv)}"
    if case.steps is not None:
        check_training(values["run"], result.output, case.steps, case.metrics)
    return result
