"""Run identity: a run dir is one training run, and its `config.yaml` says how it was trained: the command (its
`command:` key, as a recipe names it) and the config in effect. A resume compares the new config with it
(`check_resume`: bookkeeping may change, the trajectory may not unless allowed, and every accepted difference is
recorded), and one process at a time holds a run dir (`hold_run_dir`).

    changes = check_resume(saved_dict, to_dict(cfg), step=3, allow=cfg.train.allow_config_change)
    record_changes(run_dir, changes, step=3)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

from tempax.errors import ConfigError
from tempax.train.storage import write_atomic
from tempax.configlib import COMMAND_KEY, dump_yaml, read_yaml, to_dict, upgrade_keys

CONFIG_FILE = "config.yaml"
CHANGES_FILE = "config_changes.jsonl"
LOCK_FILE = ".tempax-run.lock"  # holds "pid host" of the process running the run dir, under an flock

# Dotted keys (or prefixes ending in ".") whose change leaves every optimizer step's result as it was (held-out
# evaluation settings among them; data.eval_fraction is not: it moves rows between the splits).
BOOKKEEPING = (
    "train.log_every", "train.eval_every", "train.eval_batches", "train.eval_at_start", "train.run_dir",
    "train.tensorboard", "train.report_to", "train.run_name", "train.progress_bar", "train.check_memory",
    "train.micro_batch_size", "train.auto_micro_batch", "train.remat", "train.memory", "train.checkpoint.",
    "train.mesh.", "eval.", "task.eval_split", "data.eval_path", "data.eval_split", "data.max_eval_rows",
    "grpo.show_completion_every", "grpo.log_entropy",
)
# The class attribute where a config class names keys (or prefixes ending in ".") of BOOKKEEPING that change its
# trajectory all the same.
TRAJECTORY_KEYS = "TRAJECTORY_KEYS"
RUN_LENGTH = "train.steps"
ALLOW_KEY = "train.allow_config_change"


@dataclass(frozen=True)
class Change:
    """One differing config key: dotted `key`, `old` (saved) and `new` values; `trajectory` when it changes what
    the remaining steps compute."""

    key: str
    old: Any
    new: Any
    trajectory: bool

    def __str__(self) -> str:
        return f"{self.key}: {_show(self.old)} -> {_show(self.new)}"


def _show(value: Any) -> str:
    return "(absent)" if value is _ABSENT else json.dumps(value)


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


_ABSENT = _Absent()


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and scalars are leaves; an empty mapping is a leaf ({})."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = list(value) if isinstance(value, tuple) else value
    return out


def _matches(key: str, keys: Sequence[str]) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in keys)


def is_bookkeeping(key: str, trajectory_keys: Sequence[str] = ()) -> bool:
    """Whether a change of `key` leaves every step's result as it was: it is in BOOKKEEPING and not among the
    config's own `trajectory_keys`."""
    return _matches(key, BOOKKEEPING) and not _matches(key, trajectory_keys)


def config_changes(saved: Mapping[str, Any], new: Mapping[str, Any], *,
                   trajectory_keys: Sequence[str] = ()) -> list[Change]:
    """The differences between a saved and a new config (nested plain dicts), sorted by key; `trajectory_keys`
    are the config class's `TRAJECTORY_KEYS`."""
    a, b = flatten(saved), flatten(new)
    out = []
    for key in sorted(set(a) | set(b)):
        if key == ALLOW_KEY:  # the permission itself is not part of how the run trains
            continue
        old, cur = a.get(key, _ABSENT), b.get(key, _ABSENT)
        if old == cur or (isinstance(old, (int, float)) and isinstance(cur, (int, float)) and float(old) == float(cur)):
            continue
        out.append(Change(key, old, cur, trajectory=not (is_bookkeeping(key, trajectory_keys) or key == RUN_LENGTH)))
    return out


def check_resume(saved: Mapping[str, Any], new: Mapping[str, Any], *, step: int, allow: bool,
                 run_dir: str = "this run dir", trajectory_keys: Sequence[str] = ()) -> list[Change]:
    """The changes a resume at `step` would apply; raises `ConfigError` listing the trajectory-changing ones unless
    `allow`.

    Differences fall in two kinds. Bookkeeping cannot change the numbers (logging and evaluation cadence,
    checkpoint cadence, progress bar, memory checks, the mesh, micro-batching and remat, which the invariance tests
    show leave every step equal), and `train.steps` may change (running a run longer or shorter is the point of
    resuming; with a decaying schedule the note says that its remaining learning rates follow the new length).
    Everything else (the command, the optimizer, the data, the model, seq_len, the batch, the algorithm's settings)
    changes the trajectory, and resuming with it is refused unless the new config sets
    `train.allow_config_change=true`. A config class whose run does read one of the bookkeeping keys into its
    training steps names it in `TRAJECTORY_KEYS` (PPO: its held-out prompts size the rollout rows). Either way
    nothing is silent: `record_changes` appends each accepted difference to `<run_dir>/config_changes.jsonl`
    before `config.yaml` is replaced, both through a temporary file and a rename, so a full disk never leaves
    either half-written."""
    changes = config_changes(saved, new, trajectory_keys=trajectory_keys)
    changing = [c for c in changes if c.trajectory]
    if changing and not allow:
        lines = "\n".join(f"  {c}" for c in changing)
        raise ConfigError(
            f"{run_dir} was trained to step {step} with another config; resuming would change how the remaining "
            f"steps are computed:\n{lines}\nEither start a new run (set train.run_dir to a new folder), or continue "
            "this one with the change recorded in its config_changes.jsonl: add train.allow_config_change=true."
        )
    return changes


def describe_changes(changes: list[Change], *, step: int, new: Mapping[str, Any] | None = None) -> list[str]:
    """One line per accepted change, for the console."""
    lines = []
    for c in changes:
        note = ""
        if c.key == RUN_LENGTH and new is not None:
            schedule = flatten(new).get("train.optimizer.schedule")
            if schedule not in (None, "constant"):
                note = f" (the {schedule} schedule's remaining learning rates follow the new length)"
        kind = ("changes the trajectory, allowed by train.allow_config_change" if c.trajectory
                else "run length" if c.key == RUN_LENGTH else "bookkeeping")
        lines.append(f"config change after step {step}: {c}{note} [{kind}]")
    return lines


def record_changes(run_dir: str, changes: list[Change], *, step: int) -> str | None:
    """Appends one record {"step", "time", "changes": [{"key", "old", "new", "trajectory"}]} to
    `<run_dir>/config_changes.jsonl`; returns its path (None when there was nothing to record)."""
    if not changes:
        return None
    path = os.path.join(run_dir, CHANGES_FILE)
    record = {
        "step": step, "time": round(time.time(), 3),
        "changes": [{"key": c.key, "old": None if c.old is _ABSENT else c.old,
                     "new": None if c.new is _ABSENT else c.new, "trajectory": c.trajectory} for c in changes],
    }
    before = open(path).read() if os.path.isfile(path) else ""
    if before and not before.endswith("\n"):
        before = before[: before.rfind("\n") + 1]  # a line cut short by an older tempax's interrupted append
    write_atomic(path, before + json.dumps(record) + "\n")
    return path


def checkpoint_steps(run_dir: str) -> list[int]:
    """The step folders under `<run_dir>/checkpoints` (finished or not), without opening Orbax."""
    folder = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(folder):
        return []
    return sorted(int(n) for n in os.listdir(folder) if n.isdigit())


def save_run_config(run_dir: str, cfg: Any, *, command: str, say: Any = None) -> list[Change]:
    """Writes `<run_dir>/config.yaml` for a run of `command` about to start, the one place it is written: the
    config as a recipe of its command (`command:` first), which `tempax COMMAND --config` continues.

    A run dir with checkpoints is a resume: the new config is checked against the saved one (`check_resume`, which
    refuses trajectory-changing differences unless `cfg.train.allow_config_change`; another command is one),
    accepted changes are said and appended to config_changes.jsonl, then config.yaml holds the config now in
    effect. Returns the changes.

    The saved config is read with the renamed keys of the config's class under their new names
    (`tempax.configlib.upgrade_keys`): a key that was renamed since the run started is the same setting, not a
    change. A config.yaml written before it named its command is taken to be of `command`.
    """
    path = os.path.join(run_dir, CONFIG_FILE)
    steps = checkpoint_steps(run_dir) if getattr(cfg.train.checkpoint, "resume", True) else []
    changes: list[Change] = []
    if steps and os.path.isfile(path):
        saved = dict(read_yaml(path) or {})
        saved_command = saved.pop(COMMAND_KEY, command)
        saved, _ = upgrade_keys(type(cfg), saved)
        new = to_dict(cfg)
        changes = check_resume({COMMAND_KEY: saved_command, **saved}, {COMMAND_KEY: command, **new},
                               step=steps[-1], allow=cfg.train.allow_config_change, run_dir=run_dir,
                               trajectory_keys=getattr(type(cfg), TRAJECTORY_KEYS, ()))
        for line in describe_changes(changes, step=steps[-1], new=new):
            (say or print)(line)
        record_changes(run_dir, changes, step=steps[-1])
    make_run_dir(run_dir)
    write_atomic(path, dump_yaml(cfg, command=command))
    return changes


class RunDirBusy(ConfigError):
    """Another process is running in this run dir (it holds the run lock)."""


def make_run_dir(run_dir: str) -> None:
    """Creates `run_dir` (and its parents); a path that exists but is not a folder is one clear `ConfigError`."""
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise ConfigError(f"train.run_dir={run_dir} is an existing file, not a folder; set train.run_dir to a "
                          "folder (a new one starts a new run)")
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"train.run_dir={run_dir} cannot be created: {e.strerror}; set train.run_dir to a folder "
                          "you can write") from None


_held: dict[str, list[Any]] = {}  # real path of a run dir -> [open lock file, depth] for the locks this process holds


def _holder(path: str) -> str:
    try:
        with open(path) as f:
            pid, _, host = f.read().strip().partition(" ")
    except OSError:
        return "another process"
    return f"process {pid} on {host}" if pid else "another process"


def acquire_run_dir(run_dir: str) -> None:
    """Takes the run lock of `run_dir` for this process (creating the folder), or raises `RunDirBusy` at once.

    Re-entrant: a second call in the same process only counts; each needs its `release_run_dir`."""
    make_run_dir(run_dir)
    key = os.path.realpath(run_dir)
    if key in _held:
        _held[key][1] += 1
        return
    path = os.path.join(run_dir, LOCK_FILE)
    f = open(path, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise RunDirBusy(
            f"{run_dir} is in use by {_holder(path)}, which is training in it; wait for it to finish (or stop it), "
            "or set train.run_dir to another folder"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()} {socket.gethostname()}\n")
    f.flush()
    _held[key] = [f, 1]


def release_run_dir(run_dir: str, *, every: bool = False) -> None:
    """Gives back one `acquire_run_dir` of this process (all of them with `every`); the last one unlocks."""
    key = os.path.realpath(run_dir)
    held = _held.get(key)
    if held is None:
        return
    held[1] = 0 if every else held[1] - 1
    if held[1] == 0:
        del _held[key]
        held[0].close()  # closing the descriptor drops the flock


@contextlib.contextmanager
def hold_run_dir(run_dir: str) -> Iterator[None]:
    """The run lock of `run_dir` while the block runs: an exclusive OS lock (`fcntl.flock`) on
    `<run_dir>/.tempax-run.lock` for the life of the run. The kernel drops it when the process ends, however it
    ends (kill -9 included), so a lock is never stale; a second process on the same run dir gets `RunDirBusy`
    naming the holder's PID and host at once, before anything is loaded. Within one process the lock is
    re-entrant (a command and the `start_run` inside it share it). Reading a run dir (`tempax export`,
    `tempax eval`, `tempax plot`) takes no lock."""
    acquire_run_dir(run_dir)
    try:
        yield
    finally:
        release_run_dir(run_dir)


def _has_training_record(run_dir: str) -> bool:
    metrics = os.path.join(run_dir, "metrics.jsonl")
    return bool(checkpoint_steps(run_dir)) or (os.path.isfile(metrics) and os.path.getsize(metrics) > 0)


@contextlib.contextmanager
def clean_failed_start(run_dir: str) -> Iterator[None]:
    """Wraps a run's start so that a failure leaves the run dir as it found it.

    When the block raises and the run dir holds no record of training (no metrics row, no checkpoint), what this
    start wrote there (config.yaml, data_report.json, the tokenizer...) is removed, and the folder itself when this
    start created it. When it holds an earlier run and no newer checkpoint was written, config.yaml and
    config_changes.jsonl get their earlier contents back (the checkpoints were made with that config, and `export`
    rebuilds the model from it). The error then propagates.
    """
    existed = os.path.isdir(run_dir)
    before = set(os.listdir(run_dir)) if existed else set()
    latest = max(checkpoint_steps(run_dir), default=None)
    records = {}
    for name in (CONFIG_FILE, CHANGES_FILE):
        path = os.path.join(run_dir, name)
        records[name] = open(path, "rb").read() if os.path.isfile(path) else None
    try:
        yield
    except RunDirBusy:
        raise  # the run dir belongs to another process: touch nothing of it
    except BaseException:
        import jax  # here, not at the top: this module is imported by the command line before JAX is needed

        if jax.distributed.is_initialized() and jax.process_index() != 0:
            raise  # in a multi-process run only process 0 writes (and so cleans) the run dir
        if os.path.isdir(run_dir) and not _has_training_record(run_dir):
            for name in set(os.listdir(run_dir)) - before:
                path = os.path.join(run_dir, name)
                shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
            if not existed and not os.listdir(run_dir):
                os.rmdir(run_dir)
        elif latest is not None and max(checkpoint_steps(run_dir), default=-1) <= latest:
            for name, content in records.items():
                path = os.path.join(run_dir, name)
                if content is None:
                    if os.path.isfile(path):
                        os.remove(path)
                else:
                    write_atomic(path, content)
        raise
