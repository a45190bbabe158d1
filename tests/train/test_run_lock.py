"""The run dir's lock within one process: re-entrant (a command and the `start_run` inside it share it), released
by the last holder, or at once by the outermost one (`every=True`)."""

from __future__ import annotations

import fcntl
import os

from tempax.train.run_identity import LOCK_FILE, acquire_run_dir, release_run_dir


def _free(run_dir) -> bool:
    """Whether another open file description can take the lock (as another process would)."""
    with open(os.path.join(run_dir, LOCK_FILE)) as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return True


def test_the_lock_counts_its_holders(tmp_path):
    run = str(tmp_path / "run")
    acquire_run_dir(run)
    acquire_run_dir(run)
    assert not _free(run)
    with open(os.path.join(run, LOCK_FILE)) as f:
        pid, host = f.read().split()
    assert int(pid) == os.getpid() and host
    release_run_dir(run)
    assert not _free(run)
    release_run_dir(run)
    assert _free(run)
    acquire_run_dir(run)
    acquire_run_dir(run)
    release_run_dir(run, every=True)
    assert _free(run)
