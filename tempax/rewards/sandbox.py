"""Running a program the model wrote, isolated from the trainer, the machine and the network.

    sandbox = Sandbox(SandboxConfig(timeout_s=2.0))
    result = sandbox.run("print(sum(range(10)))")          # ProgramResult(stdout='45\n', exit_code=0, ...)
    results = sandbox.run_many([code_a, code_b, code_c])   # in parallel, `workers` at a time

Each program runs in a fresh process tree started by the trusted launcher (`tempax.rewards.sandbox_launcher`,
standard library only), which builds the isolation (namespaces, rlimits, an unprivileged uid, a bare environment)
before it execs the interpreter; each limit is a `SandboxConfig` field. What is isolated and what is not, limit by
limit: docs/code-execution.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

from tempax.configlib import help_field
from tempax.errors import ConfigError, TempaxError

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_launcher.py")
NAMESPACES = ("network", "mount", "pid", "ipc", "uts")
# Ways a program can end (ProgramResult.status).
STATUSES = ("exited", "timeout", "cpu_limit", "output_limit", "signal", "setup_error")
MAX_WORKERS = 32  # uids per caller process (see `_UidSlots`)


class SandboxUnavailable(TempaxError):
    """The kernel does not allow an isolation the sandbox was told to insist on (a network namespace)."""


def _keys(name: str) -> str:
    """The recipe keys of a sandbox setting: its limits sit under the python tool's and the code reward's sections."""
    return f"env.sandbox.{name} / rewards.code.sandbox.{name}"


@dataclass(frozen=True)
class SandboxConfig:
    """Limits of one program run in the sandbox (`tempax.rewards.sandbox`)."""

    timeout_s: float = help_field("Wall-clock deadline of one program, in seconds; past it the program and every "
                                  "process it started are killed (status timeout).", 5.0)
    cpu_seconds: int = help_field("CPU seconds one program may use (RLIMIT_CPU; status cpu_limit).", 5)
    memory_mb: int = help_field("Address space of each process of a program, in MiB (RLIMIT_AS); an allocation "
                                "past it fails (Python: MemoryError).", 512)
    file_size_mb: int = help_field("Largest file a program may write, in MiB (RLIMIT_FSIZE).", 8)
    workdir_mb: int = help_field("Size of the program's writable temporary folder (a tmpfs removed with it), in "
                                 "MiB.", 32)
    max_processes: int = help_field("Processes and threads the program's uid may hold at once (RLIMIT_NPROC): a "
                                    "fork bomb stops there.", 32)
    open_files: int = help_field("Open file descriptors per process (RLIMIT_NOFILE).", 64)
    max_output_bytes: int = help_field("Bytes of stdout and of stderr kept; a program writing more is killed "
                                       "(status output_limit).", 65536)
    workers: int | None = help_field("Programs run at once by run_many (null: the machine's CPUs, at most "
                                     f"{MAX_WORKERS}).", None)
    uid_base: int = help_field("First of the unprivileged uids programs run as: each running program gets its own "
                               "(uid_base + a slot of this process), so RLIMIT_NPROC counts it alone.", 200000)
    hide_paths: tuple[str, ...] = help_field("More folders shown to programs as empty (besides home, the working "
                                             "directory, the Python environment, /var/tmp, /dev/shm).", ())
    allow_network_check: bool = help_field(
        "true: refuse to start where the kernel cannot give a program its own network namespace (no network); "
        "false: run anyway, with network access, after a warning.", True)
    python: str | None = help_field("Interpreter the programs run on (null: the one this process runs on, outside "
                                    "any virtual environment).", None)

    def validate(self) -> None:
        for name in ("timeout_s", "cpu_seconds", "memory_mb", "file_size_mb", "workdir_mb", "max_processes",
                     "open_files", "max_output_bytes"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{_keys(name)} must be > 0, got {getattr(self, name)}")
        if self.workers is not None and not 1 <= self.workers <= MAX_WORKERS:
            raise ConfigError(f"{_keys('workers')} must be in 1..{MAX_WORKERS} or null, got {self.workers}")
        if self.uid_base < 1000:
            raise ConfigError(f"{_keys('uid_base')}={self.uid_base} is a system uid; use one above 1000")

    def __post_init__(self) -> None:
        self.validate()


@dataclass(frozen=True)
class ProgramResult:
    """How one program ended.

    Attributes:
      stdout, stderr: what it wrote (decoded as UTF-8, odd bytes replaced), each cut at `max_output_bytes`.
      status: "exited" (exit_code says how), "timeout" (wall-clock deadline), "cpu_limit", "output_limit",
        "signal" (killed by another signal, e.g. SIGKILL at the memory or process limit), "setup_error" (the
        sandbox could not be built; stderr says why).
      exit_code: the exit status when it exited, else None.
      signal: the signal that ended it, else None.
      seconds: wall time from start to the end of its last process.
      truncated: whether stdout or stderr was cut.
    """

    stdout: str
    stderr: str
    status: str
    exit_code: int | None = None
    signal: int | None = None
    seconds: float = 0.0
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """Exited with status 0."""
        return self.status == "exited" and self.exit_code == 0

    def describe(self) -> str:
        """One line: how it ended."""
        if self.status == "exited":
            return f"exit status {self.exit_code}"
        if self.status == "timeout":
            return "killed at the time limit"
        if self.status == "cpu_limit":
            return "killed at the CPU-time limit"
        if self.status == "output_limit":
            return "killed for writing too much output"
        if self.status == "signal":
            return f"killed by signal {self.signal} ({signal.Signals(self.signal).name})"
        return "the sandbox could not start"


@dataclass
class SandboxCounters:
    """Programs run and how they ended, cumulative over a `Sandbox`'s life (for metrics: `metrics()`)."""

    programs: int = 0
    exited_ok: int = 0
    exited_error: int = 0
    timeouts: int = 0
    cpu_limits: int = 0
    output_limits: int = 0
    killed: int = 0
    setup_errors: int = 0
    seconds: float = 0.0

    def add(self, result: ProgramResult) -> None:
        self.programs += 1
        self.seconds += result.seconds
        if result.status == "exited":
            if result.exit_code == 0:
                self.exited_ok += 1
            else:
                self.exited_error += 1
        elif result.status == "timeout":
            self.timeouts += 1
        elif result.status == "cpu_limit":
            self.cpu_limits += 1
        elif result.status == "output_limit":
            self.output_limits += 1
        elif result.status == "signal":
            self.killed += 1
        else:
            self.setup_errors += 1

    def metrics(self, prefix: str = "sandbox/") -> dict[str, float]:
        """`sandbox/programs`, `sandbox/timeouts`, `sandbox/cpu_limits`, `sandbox/output_limits`, `sandbox/killed`
        (another signal), `sandbox/errors` (a non-zero exit), `sandbox/setup_errors`, `sandbox/seconds`."""
        return {f"{prefix}programs": float(self.programs), f"{prefix}timeouts": float(self.timeouts),
                f"{prefix}cpu_limits": float(self.cpu_limits), f"{prefix}output_limits": float(self.output_limits),
                f"{prefix}killed": float(self.killed), f"{prefix}errors": float(self.exited_error),
                f"{prefix}setup_errors": float(self.setup_errors), f"{prefix}seconds": self.seconds}


class _UidSlots:
    """Hands out the uid offsets of this process's running programs: one program, one uid (so RLIMIT_NPROC and
    the clean-up by uid see that program alone). Offsets are spread by the process id, so two trainers on one
    machine rarely share a uid."""

    def __init__(self) -> None:
        self._free = list(range(MAX_WORKERS))
        self._cond = threading.Condition()

    def take(self) -> int:
        with self._cond:
            while not self._free:
                self._cond.wait()
            slot = self._free.pop(0)
        return (os.getpid() % 997) * MAX_WORKERS + slot

    def give(self, offset: int) -> None:
        with self._cond:
            self._free.append(offset % MAX_WORKERS)
            self._cond.notify()


_SLOTS = _UidSlots()
_WARNED: set[str] = set()
_WARN_LOCK = threading.Lock()


def default_interpreter() -> str:
    """The interpreter itself, not a virtual environment's link to it (the environment's folder is hidden)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(base)


def hidden_paths(config: SandboxConfig) -> list[str]:
    """Folders a program sees empty: home, the working directory, this Python environment and tempax's own
    checkout, the other shared temporary folders, and `config.hide_paths`."""
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    candidates = [os.path.expanduser("~"), os.getcwd(), sys.prefix, checkout,
                  tempfile.gettempdir(), "/var/tmp", "/dev/shm", *config.hide_paths]
    out = []
    for path in candidates:
        real = os.path.realpath(path)
        if real not in ("/", "/usr", "/bin", "/lib", "/etc") and real not in out:
            out.append(real)
    return out


def _warn_once(text: str) -> None:
    with _WARN_LOCK:
        if text in _WARNED:
            return
        _WARNED.add(text)
    warnings.warn(text, RuntimeWarning, stacklevel=3)
    print(f"sandbox: {text}", file=sys.stderr, flush=True)


def _missing(applied: dict) -> list[str]:
    """What the kernel did not allow, in words (from the launcher's `applied` record)."""
    out = []
    if not applied.get("network"):
        out.append("no network namespace: programs can reach the network")
    if not applied.get("mount"):
        out.append("no mount namespace: programs can read every world-readable file and write world-writable "
                   "folders (the temporary folders, /dev/shm)")
    if not applied.get("pid"):
        out.append("no process-id namespace: children that leave the program's process group are killed by uid "
                   "only")
    if not applied.get("uid"):
        out.append("not run as root: programs run as this user, RLIMIT_NPROC counts all of this user's processes")
    return out


class Sandbox:
    """Runs programs under `config`'s limits (docs/code-execution.md); thread-safe. `counters` keep how they
    ended."""

    def __init__(self, config: SandboxConfig = SandboxConfig()) -> None:
        self.config = config
        self.python = config.python or default_interpreter()
        self.hidden = hidden_paths(config)
        self.counters = SandboxCounters()
        self.applied: dict = {}  # what the kernel allowed, as the last program's launcher reported it
        self._lock = threading.Lock()
        if not os.path.isfile(self.python):
            raise ConfigError(f"{_keys('python')}={self.python!r} is not a file; name an interpreter or leave it null")
        if sys.platform != "linux":
            raise SandboxUnavailable(f"the sandbox needs Linux (namespaces, rlimits); this is {sys.platform}")

    @property
    def workers(self) -> int:
        return self.config.workers or min(os.cpu_count() or 1, MAX_WORKERS)

    def run(self, source: str) -> ProgramResult:
        """Runs one program (Python source) and returns how it ended; never raises for what the program does."""
        offset = _SLOTS.take()
        try:
            result = self._run(source, self.config.uid_base + offset)
        finally:
            _SLOTS.give(offset)
        with self._lock:
            self.counters.add(result)
        return result

    def run_many(self, sources: Sequence[str]) -> list[ProgramResult]:
        """Runs every program, `workers` at a time, and returns their results in order."""
        if len(sources) <= 1:
            return [self.run(s) for s in sources]
        with ThreadPoolExecutor(min(self.workers, len(sources))) as pool:
            return list(pool.map(self.run, sources))

    def _settings(self, uid: int, status_fd: int, fallback_dir: str) -> dict:
        c = self.config
        expose = [os.path.realpath(sys.base_prefix), os.path.dirname(os.path.dirname(self.python))]
        return {
            "status_fd": status_fd, "parent_pid": os.getpid(), "namespaces": list(NAMESPACES),
            "require_network": c.allow_network_check, "uid": uid, "gid": uid, "python": self.python,
            "hide": self.hidden, "expose": expose, "fallback_dir": fallback_dir,
            "workdir_bytes": c.workdir_mb << 20,
            "limits": {"cpu_seconds": c.cpu_seconds, "address_space_bytes": c.memory_mb << 20,
                       "file_size_bytes": c.file_size_mb << 20, "processes": c.max_processes,
                       "open_files": c.open_files},
        }

    def _run(self, source: str, uid: int) -> ProgramResult:
        cfg = self.config
        start = time.monotonic()
        status_r, status_w = os.pipe()
        fallback_dir = tempfile.mkdtemp(prefix="tempax-sandbox-")
        try:
            os.chown(fallback_dir, uid, uid) if os.geteuid() == 0 else None
            settings = self._settings(uid, status_w, fallback_dir)
            proc = subprocess.Popen(
                [self.python, "-I", "-S", "-B", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, pass_fds=(status_w,), start_new_session=True, cwd="/",
                env={"PATH": "/usr/bin:/bin"},
            )
            os.close(status_w)
            status_w = -1
            try:
                proc.stdin.write(json.dumps(settings).encode() + b"\n" + source.encode("utf-8", "replace"))
                proc.stdin.close()
            except BrokenPipeError:
                pass
            out, err, status_text, why = self._collect(proc, status_r, start + cfg.timeout_s)
        finally:
            if status_w >= 0:
                os.close(status_w)
            os.close(status_r)
            shutil.rmtree(fallback_dir, ignore_errors=True)
        seconds = time.monotonic() - start
        limit = cfg.max_output_bytes
        truncated = len(out) > limit or len(err) > limit
        stdout = out[:limit].decode("utf-8", "replace")
        stderr = err[:limit].decode("utf-8", "replace")
        status = json.loads(status_text) if status_text else {}
        applied = status.get("applied", {})
        if applied and "setup_error" not in status:
            self.applied = applied
            self._say_missing(applied)
        if "setup_error" in status:
            if status["setup_error"] == "no network namespace":
                raise SandboxUnavailable(
                    "the kernel does not allow a network namespace here, so sandboxed programs could reach the "
                    "network; run where unshare(CLONE_NEWNET) is allowed (as root, or with unprivileged user "
                    f"namespaces), or set {_keys('allow_network_check')}=false to run them with network access")
            return ProgramResult(stdout, f"sandbox setup failed: {status['setup_error']}", "setup_error",
                                 seconds=seconds)
        if why is not None:
            return ProgramResult(stdout, stderr, why, seconds=seconds, truncated=truncated)
        if "exit_code" in status:
            return ProgramResult(stdout, stderr, "exited", exit_code=status["exit_code"], seconds=seconds,
                                 truncated=truncated)
        sig = status.get("signal")
        if sig is None:
            return ProgramResult(stdout, stderr + "\nsandbox: the launcher ended without a status", "setup_error",
                                 seconds=seconds, truncated=truncated)
        # SIGXCPU comes only from RLIMIT_CPU; the kernel's CPU accounting may read a little under the limit then.
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and status.get("cpu_seconds", 0.0) >= 0.9 * cfg.cpu_seconds):
            return ProgramResult(stdout, stderr, "cpu_limit", signal=sig, seconds=seconds, truncated=truncated)
        return ProgramResult(stdout, stderr, "signal", signal=sig, seconds=seconds, truncated=truncated)

    def _collect(self, proc: subprocess.Popen, status_r: int,
                 deadline: float) -> tuple[bytes, bytes, bytes, str | None]:
        """Reads stdout, stderr and the status pipe until all three close; kills the process group at the
        deadline or when an output stream passes its bound. Returns (stdout, stderr, status, why it was killed)."""
        limit = self.config.max_output_bytes
        buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray(), status_r: bytearray()}
        sel = selectors.DefaultSelector()
        for fd in buffers:
            sel.register(fd, selectors.EVENT_READ)
        why: str | None = None
        grace = None  # after a kill, how long to wait for the pipes to close
        try:
            while sel.get_map():
                now = time.monotonic()
                if why is None and now >= deadline:
                    why = "timeout"
                    self._kill(proc)
                if why is not None and grace is None:
                    grace = now + 5.0
                if grace is not None and now >= grace:
                    break  # nothing holds the pipes that the kill did not reach; give up reading
                wait = (grace if grace is not None else deadline) - now
                for key, _ in sel.select(timeout=max(0.0, wait)):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    buf = buffers[key.fd]
                    if len(buf) <= limit:
                        buf += chunk
                    if key.fd != status_r and len(buf) > limit and why is None:
                        why = "output_limit"
                        self._kill(proc)
        finally:
            sel.close()
            if why is not None or proc.poll() is None:
                self._kill(proc)
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        out_fd, err_fd = list(buffers)[:2]
        return bytes(buffers[out_fd]), bytes(buffers[err_fd]), bytes(buffers[status_r]), why

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        """SIGKILL to the launcher's process group: the launcher, the namespace's first process (which dies with
        the launcher in any case) and the program; the namespace's end takes the rest."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _say_missing(self, applied: dict) -> None:
        for text in _missing(applied):
            if text.startswith("no network") and self.config.allow_network_check:
                continue  # refused below instead
            _warn_once(text)


def describe_isolation(config: SandboxConfig = SandboxConfig()) -> dict[str, object]:
    """What the kernel allows here: runs one empty program and returns the isolation applied (`applied`: each
    namespace, the uid drop, the hidden folders) and what is missing, in words (`missing`)."""
    sandbox = Sandbox(dataclasses.replace(config, allow_network_check=False))
    result = sandbox.run("pass")
    return {"result": result.describe(), "applied": sandbox.applied, "missing": _missing(sandbox.applied)}


__all__ = ["LAUNCHER", "STATUSES", "ProgramResult", "Sandbox", "SandboxConfig", "SandboxCounters",
           "SandboxUnavailable", "default_interpreter", "describe_isolation", "hidden_paths"]
