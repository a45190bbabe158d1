"""Writing a run's files so that a full disk or an I/O error costs one clear line, never a half-written file.

Every small file of a run (config.yaml, summary.json, eval_summary.json, a checkpoint's file record) is written
to a temporary file beside it and renamed over the old one (`write_atomic`): a rename is atomic on POSIX file
systems, so a reader sees the old content or the new, and a write that fails (ENOSPC, EFBIG, EIO) leaves the old
file as it was and no temporary file behind. A failure becomes a `StorageError` (exit status 4) whose message says
which file could not be written, why, how much was needed and how much the file system had, and what to do
(`describe_write_failure`).
"""

from __future__ import annotations

import errno
import os
import re
import resource
import shutil

from tempax.errors import TempaxError

STORAGE_EXIT_STATUS = 4


class StorageError(TempaxError):
    """A run's file could not be written (disk full, file-size limit, I/O error); exit status 4.

    The run's earlier files are intact: its newest finished checkpoint is where the same command resumes.
    """

    exit_status = STORAGE_EXIT_STATUS


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def free_bytes(path: str) -> int | None:
    """Free bytes on the file system holding `path` (its nearest existing parent); None when unknown."""
    path = os.path.abspath(path)
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path or "/").free
    except OSError:
        return None


def failed_file_and_reason(error: BaseException) -> tuple[str | None, str]:
    """(file, reason) of a failed write: Python's `OSError` (filename, strerror) or TensorStore's text
    (`... local file "<path>" ... [os_error_code='28']`)."""
    if isinstance(error, OSError) and error.errno is not None:
        name = error.filename if isinstance(error.filename, str) else None
        return name, f"{os.strerror(error.errno)} (errno {error.errno})"
    text = str(error)
    files = re.findall(r'(?:local file|Failed writing:) "([^"]+)"', text)
    code = re.search(r"os_error_code='(\d+)'", text)
    path = files[-1].removesuffix(".__lock") if files else None
    if code:
        n = int(code.group(1))
        return path, f"{os.strerror(n)} (errno {n})"
    first = text.split(" [tensorstore_spec", 1)[0].strip().splitlines()
    return path, (first[0][:200] if first else type(error).__name__)


def describe_write_failure(what: str, error: BaseException, *, directory: str, needed: int | None = None,
                           file: str | None = None) -> str:
    """One line: what failed to be written, the file (the error's, else `file`, else `directory`) and reason, space
    needed vs free, and the file-size limit when one is set."""
    path, reason = failed_file_and_reason(error)
    parts = [f"{what}: writing {path or file or directory} failed: {reason}"]
    free = free_bytes(directory)
    space = []
    if needed is not None:
        space.append(f"it needs about {_size(needed)}")
    if free is not None:
        space.append(f"{_size(free)} free on the file system of {directory}")
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != resource.RLIM_INFINITY:
        space.append(f"this process may write files of at most {_size(soft)} (ulimit -f)")
    if space:
        parts.append("(" + "; ".join(space) + ")")
    return " ".join(parts)


def is_out_of_space(error: BaseException) -> bool:
    """True for the errors a full disk or a file-size limit gives (ENOSPC, EFBIG, EDQUOT)."""
    codes = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
    if isinstance(error, OSError) and error.errno in codes:
        return True
    code = re.search(r"os_error_code='(\d+)'", str(error))
    return bool(code and int(code.group(1)) in codes)


def write_atomic(path: str, data: str | bytes, *, what: str | None = None) -> None:
    """Writes `data` to `path` through a temporary file and a rename: `path` holds the old content or the new,
    never part of either. Raises `StorageError` (the temporary file removed) when the write fails."""
    tmp = f"{path}.tmp"
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        with open(tmp, mode) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        directory = os.path.dirname(os.path.abspath(path))
        raise StorageError(
            describe_write_failure(what or os.path.basename(path), e, directory=directory, file=path,
                                   needed=len(data.encode() if isinstance(data, str) else data))
            + ". The previous version of the file is unchanged; free some space and run the same command again."
        ) from None
