"""The sandbox's launcher: the trusted process between the caller and a program (`tempax.rewards.sandbox`).

Run as `python -I -S sandbox_launcher.py` with one JSON line of settings and then the program's source on its
stdin; it imports nothing from tempax (the standard library only), so it starts in a few milliseconds and runs
the same whatever the caller has imported. `main` lists its steps; each is reported in the status it writes to
the file descriptor the caller passed (what was applied, how the program ended).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
NAMESPACES = {"mount": CLONE_NEWNS, "pid": CLONE_NEWPID, "network": CLONE_NEWNET, "ipc": CLONE_NEWIPC,
              "uts": CLONE_NEWUTS}
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
# A per-mount flag read from /proc/self/mountinfo that a read-only remount must keep (dropping one is refused).
_MOUNT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _die_with_parent(parent: int) -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The parent died before the request took effect (a parent outside our process-id namespace reads as 0).
    if os.getppid() not in (parent, 0):
        os._exit(1)


def _unshare(wanted: list[str], rootless: bool) -> dict[str, bool]:
    """Enters the wanted namespaces: all at once, else one by one; returns which were entered."""
    applied = dict.fromkeys(wanted, False)
    extra = CLONE_NEWUSER if rootless else 0
    if rootless:
        uid, gid = os.getuid(), os.getgid()
        if _libc.unshare(CLONE_NEWUSER) != 0:
            return applied
        for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"0 {uid} 1"),
                           ("/proc/self/gid_map", f"0 {gid} 1")):
            with open(path, "w") as f:
                f.write(text)
        extra = 0
    flags = extra
    for name in wanted:
        flags |= NAMESPACES[name]
    if _libc.unshare(flags) == 0:
        return dict.fromkeys(wanted, True)
    for name in wanted:
        applied[name] = _libc.unshare(NAMESPACES[name]) == 0
    return applied


def _mount_points() -> list[tuple[str, int]]:
    """(mount point, flags to keep) of every mount, parents before children."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")
            keep = 0
            for opt in fields[5].split(","):
                keep |= _MOUNT_FLAGS.get(opt, 0)
            points.append((point, keep))
    return sorted(points, key=lambda p: p[0].count("/") if p[0] != "/" else 0)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _set_up_mounts(settings: dict, source: bytes, applied: dict[str, bool]) -> str:
    """Step 4 of `main`; returns the program's working directory."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    problems = []
    for point, keep in _mount_points():
        try:
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | keep)
        except OSError as e:
            if point == "/":
                raise
            if not point.startswith(("/proc", "/sys")):  # /proc is replaced below; /sys stays as it is
                problems.append(str(e))
    applied["read_only_root"] = True
    if problems:
        applied["read_only_problems"] = problems[:4]
    if applied.get("pid"):
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    exposed = [p for p in settings["expose"] if os.path.isdir(p)]
    keep_open = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in exposed}
    hidden: list[str] = []
    for path in sorted(settings["hide"], key=len):
        if not os.path.isdir(path) or any(_inside(path, h) for h in hidden) or path in ("/", "/tmp"):
            continue
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=755")
        hidden.append(path)
        for inner in exposed:
            if _inside(inner, path) and inner != path:
                os.makedirs(inner, exist_ok=True)
                _mount(f"/proc/self/fd/{keep_open[inner]}", inner, None, MS_BIND | MS_REC)
                _mount(None, inner, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
        _mount(None, path, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for fd in keep_open.values():
        os.close(fd)
    applied["hidden"] = hidden
    uid, gid = settings["uid"], settings["gid"]
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={settings['workdir_bytes']},mode=700,uid={uid},gid={gid}")
    _write_program("/tmp", source, uid, gid)
    return "/tmp"


def _write_program(folder: str, source: bytes, uid: int, gid: int) -> None:
    path = os.path.join(folder, "main.py")
    with open(path, "wb") as f:
        f.write(source)
    if os.geteuid() == 0 and uid != 0:
        os.chown(path, uid, gid)


def _exec_program(settings: dict, workdir: str, status_fd: int, drop_uid: bool) -> None:
    """Step 5: becomes the program (never returns)."""
    try:
        os.close(status_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.setsid()  # its own session: the caller's terminal signals never reach it
        limits = settings["limits"]
        cpu = limits["cpu_seconds"]
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits["address_space_bytes"],) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_bytes"],) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"],) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if drop_uid:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"],) * 2)
            os.setgroups([])
            os.setgid(settings["gid"])
            os.setuid(settings["uid"])
        _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        os.chdir(workdir)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
        python = settings["python"]
        os.execve(python, [python, "-I", "-B", "-u", os.path.join(workdir, "main.py")], env)
    except BaseException as e:  # noqa: BLE001 - the program never started: say why on its stderr
        os.write(2, f"sandbox: the program could not start: {type(e).__name__}: {e}\n".encode())
    os._exit(126)


def _kill_uid(uid: int) -> None:
    """Kills every process of `uid` (kill(-1) as that uid reaches exactly its own processes)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def _first_process(settings: dict, source: bytes, status_fd: int, applied: dict, launcher: int) -> None:
    """Step 3-5 and the wait: the namespace's first process (never returns)."""
    _die_with_parent(launcher)
    status: dict = {"applied": applied}
    try:
        if applied.get("mount"):
            workdir = _set_up_mounts(settings, source, applied)
        else:
            workdir = settings["fallback_dir"]
            _write_program(workdir, source, settings["uid"], settings["gid"])
    except OSError as e:
        status["setup_error"] = str(e)
        os.write(status_fd, json.dumps(status).encode())
        os._exit(0)
    drop_uid = os.geteuid() == 0 and not settings["rootless"]
    applied["uid"] = drop_uid
    program = os.fork()
    if program == 0:
        _exec_program(settings, workdir, status_fd, drop_uid)
    while True:  # as pid 1 it also reaps the orphans the program leaves
        pid, code = os.waitpid(-1, 0)
        if pid == program:
            break
    if os.WIFSIGNALED(code):
        status["signal"] = os.WTERMSIG(code)
    else:
        status["exit_code"] = os.WEXITSTATUS(code)
    status["cpu_seconds"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime + \
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime
    if not applied.get("pid") and drop_uid:
        _kill_uid(settings["uid"])
    os.write(status_fd, json.dumps(status).encode())
    os._exit(0)  # as pid 1, its exit kills what is left in the namespace


def main() -> None:
    """The launcher's steps, each reported in its status:

        1. die with the caller (PR_SET_PDEATHSIG), so a killed trainer leaves no sandbox behind;
        2. new namespaces (unshare): network (only a loopback that is down), mounts, process ids, IPC, host name;
           each that the kernel refuses is reported, never skipped silently;
        3. fork the namespace's first process (pid 1), which also dies with the launcher; when it exits, the
           kernel kills every process left in the namespace, so a child that outlives the program cannot survive;
        4. in the new mount namespace: every mount read-only and nosuid, a fresh /proc that shows only the
           sandbox's processes, an empty read-only tmpfs over each hidden path (home, the caller's working
           directory, its Python environment, /var/tmp, /dev/shm) with the interpreter's own install re-exposed
           read-only, and a fresh size-bounded tmpfs on the temporary folder as the program's working directory;
        5. fork the program: stdin from /dev/null, resource limits (CPU seconds, address space, file size,
           processes, open files, no core files), no new privileges, an unprivileged uid and gid without
           supplementary groups, a minimal environment, then exec the interpreter on main.py there (unbuffered, so
           what it printed before a kill comes back).

    Without a process-id namespace the first process kills every process of the program's uid once the program
    has ended (the uid is the program's alone), which catches children that left its process group.
    """
    settings = json.loads(sys.stdin.buffer.readline())
    source = sys.stdin.buffer.read()
    status_fd = settings["status_fd"]
    _die_with_parent(settings["parent_pid"])
    rootless = os.geteuid() != 0
    settings["rootless"] = rootless
    applied = _unshare(settings["namespaces"], rootless)
    if rootless:  # the program keeps the caller's own uid (root inside a user namespace, when one was made)
        settings["uid"], settings["gid"] = os.getuid(), os.getgid()
    if settings["require_network"] and not applied.get("network"):
        os.write(status_fd, json.dumps({"applied": applied, "setup_error": "no network namespace"}).encode())
        os._exit(0)
    launcher = os.getpid()
    first = os.fork()
    if first == 0:
        _first_process(settings, source, status_fd, applied, launcher)
    os.close(status_fd)
    os.waitpid(first, 0)
    os._exit(0)


if __name__ == "__main__":
    main()
