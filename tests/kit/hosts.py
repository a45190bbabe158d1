"""Two hosts on one machine for tests: two network namespaces joined by a veth pair, each with its own host name,
its own local disk and a shared one.

    with two_hosts(tmp_path) as hosts:                     # or the `two_hosts` fixture in a test module
        a = hosts.a.start([python, "-m", "tempax.cli.main", "sft", ...], env=env, name="trainer")
        hosts.b.kill_all()                                 # every process of host B, as if its machine died
        a.wait(timeout=60); a.stderr()

Each host is a network namespace with only a loopback and one end of the veth pair, addressed 169.254.77.1/30
(host A) and 169.254.77.2/30 (host B): link-local addresses that exist only inside the two namespaces, so no
traffic leaves them. A process starts through `ip netns exec` in a private mount and UTS namespace
(`unshare --mount --uts`) that gives it the host's name (resolving to the host's address through its own
/etc/hosts, as on a real machine: gloo and Ray announce that address to their peers) and mounts the host's own
disk over `hosts.local`: the same path names different files on A and B, while `hosts.shared` is the storage
both see; `host.scratch` is a short folder of the host's own (for Unix sockets). Processes write stdout and
stderr to files under `hosts.logs`.

Everything is torn down when the `with` block ends, even after a failure, and at interpreter exit for whatever
a crashed test left: every process in each namespace is SIGKILLed (`ip netns pids`; the private mounts go with
them) and the namespaces are deleted (which deletes the veth pair). Namespace names carry the test process's id,
so two xdist workers never share one. Where the machine does not allow it (not root, no `ip`/`unshare`, a
kernel without network namespaces), `skip_reason()` says why and the fixture skips.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ADDRESS_A, ADDRESS_B, PREFIX = "169.254.77.1", "169.254.77.2", 30
# Environment that must not reach a host's processes: a proxy would be asked for the other host's address.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "grpc_proxy", "no_proxy")
_COUNTER = itertools.count()
_LIVE: list["TwoHosts"] = []
_SKIP_REASON: list[str | None] = []

# Run inside the new mount/UTS namespaces: name the host, give it its own /etc/hosts and its own local disk.
_ENTER = ('hostname "$1" && mount --bind "$2" /etc/hosts && mount --bind "$3" "$4" && shift 4 && exec "$@"')


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def skip_reason() -> str | None:
    """Why two hosts cannot be made here, or None when they can (probed once per process)."""
    if _SKIP_REASON:
        return _SKIP_REASON[0]
    reason = None
    if os.geteuid() != 0:
        reason = "network namespaces need root"
    elif not (shutil.which("ip") and shutil.which("unshare")):
        reason = "needs the `ip` (iproute2) and `unshare` (util-linux) commands"
    else:
        probe = f"tpxprobe{os.getpid()}"
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            reason = f"`ip netns add` failed: {made.stderr.strip()}"
        else:
            entered = subprocess.run(["ip", "netns", "exec", probe, "unshare", "--mount", "--uts", "true"],
                                     capture_output=True, text=True, timeout=30)
            if entered.returncode != 0:
                reason = f"`unshare --mount --uts` failed: {entered.stderr.strip()}"
            _ip("netns", "del", probe, check=False)
    _SKIP_REASON.append(reason)
    return reason


@dataclass
class HostProcess:
    """A process started on a host; its output goes to `<logs>/<host>-<name>.out` / `.err`."""

    name: str
    popen: subprocess.Popen
    out_path: Path
    err_path: Path

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def poll(self) -> int | None:
        return self.popen.poll()

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")


@dataclass
class Host:
    """One of the two hosts: its namespace, address, host name and local disk."""

    name: str
    netns: str
    address: str
    hostname: str
    disk: Path  # what this host sees at `local`
    local: Path
    hosts_file: Path
    logs: Path
    scratch: Path  # a short path of this host's own, for programs with Unix sockets (Ray's --temp-dir)
    processes: list[HostProcess] = field(default_factory=list)

    def start(self, argv: list[str], *, env: dict[str, str], name: str, cwd: str | None = None) -> HostProcess:
        """Starts `argv` on this host in its own session (stdin closed); `env` is its whole environment, less
        any proxy settings."""
        env = {k: v for k, v in env.items() if k.lower() not in PROXY_VARIABLES}
        out_path, err_path = self.logs / f"{self.name}-{name}.out", self.logs / f"{self.name}-{name}.err"
        wrapped = ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--uts", "--propagation", "private",
                   "sh", "-c", _ENTER, "sh", self.hostname, str(self.hosts_file), str(self.disk), str(self.local),
                   *argv]
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            popen = subprocess.Popen(wrapped, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                     start_new_session=True)
        process = HostProcess(name, popen, out_path, err_path)
        self.processes.append(process)
        return process

    def pids(self) -> list[int]:
        """Every process in this host's network namespace (the ones started here and whatever they spawned)."""
        listed = _ip("netns", "pids", self.netns, check=False)
        return [int(p) for p in listed.stdout.split()]

    def kill_all(self) -> None:
        """SIGKILLs every process of this host, as if its machine had died, and reaps the ones started here."""
        for _ in range(5):  # a process may fork while we kill
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.popen.wait(timeout=10)


@dataclass
class TwoHosts:
    """Hosts `a` and `b` (see the module docstring), `shared` storage and the `local` path each host sees."""

    a: Host
    b: Host
    shared: Path
    local: Path
    logs: Path
    closed: bool = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for host in (self.a, self.b):
            host.kill_all()
        for host in (self.a, self.b):
            _ip("netns", "del", host.netns, check=False)  # deletes the veth pair with it
            shutil.rmtree(host.scratch, ignore_errors=True)
        if self in _LIVE:
            _LIVE.remove(self)

    def output(self) -> str:
        """Every process's stderr tail, for assertion messages."""
        return "\n".join(f"--- {h.name}/{p.name} (status {p.poll()}):\n{p.stderr()[-3000:]}"
                         for h in (self.a, self.b) for p in h.processes)


def _close_all() -> None:
    for hosts in list(_LIVE):
        hosts.close()


atexit.register(_close_all)


def make_two_hosts(folder: Path) -> TwoHosts:
    """Creates the two hosts under `folder` (disks, shared storage, logs); close them with `close()`."""
    tag = f"{os.getpid()}x{next(_COUNTER)}"
    local, shared, logs = folder / "local", folder / "shared", folder / "logs"
    for path in (local, shared, logs):
        path.mkdir(parents=True, exist_ok=True)
    hosts = []
    for name, address in (("a", ADDRESS_A), ("b", ADDRESS_B)):
        disk = folder / f"disk-{name}"
        disk.mkdir(exist_ok=True)
        hostname = f"host-{name}-{tag}"
        hosts_file = folder / f"hosts-{name}"
        hosts_file.write_text(f"127.0.0.1 localhost\n{address} {hostname}\n")
        scratch = Path(tempfile.mkdtemp(prefix=f"tpx{name}"))  # short: a Unix socket path has at most 107 bytes
        hosts.append(Host(name, f"tpx{tag}{name}", address, hostname, disk, local, hosts_file, logs, scratch))
    a, b = hosts
    pair = TwoHosts(a, b, shared, local, logs)
    _LIVE.append(pair)
    try:
        _ip("netns", "add", a.netns)
        _ip("netns", "add", b.netns)
        veth_a, veth_b = f"tv{tag}a"[-15:], f"tv{tag}b"[-15:]
        _ip("link", "add", veth_a, "netns", a.netns, "type", "veth", "peer", "name", veth_b, "netns", b.netns)
        for host, veth in ((a, veth_a), (b, veth_b)):
            _ip("-n", host.netns, "addr", "add", f"{host.address}/{PREFIX}", "dev", veth)
            _ip("-n", host.netns, "link", "set", veth, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
    except BaseException:
        pair.close()
        raise
    return pair


@contextlib.contextmanager
def two_hosts(folder: Path) -> Iterator[TwoHosts]:
    hosts = make_two_hosts(folder)
    try:
        yield hosts
    finally:
        hosts.close()
