"""`write_atomic` under a real write failure: a child process whose files may not grow past 64 bytes
(`RLIMIT_FSIZE`, SIGXFSZ ignored so the write fails with EFBIG as on a full disk) rewrites config.yaml with a longer
one (20 + 20 x 10 = 220 bytes). The old file is intact, no temporary file is left, and the error is one line with
exit status 4."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_failed_rewrite_leaves_the_old_config_yaml(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("train: {steps: 3}\n")
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "from tempax.train.storage import StorageError, write_atomic\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64, resource.RLIM_INFINITY))\n"
        f"try:\n    write_atomic({str(config)!r}, 'train: {{steps: 300}}\\n' + '# padding\\n' * 20)\n"
        "except StorageError as e:\n    print(e)\n    sys.exit(e.exit_status)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 4 and "Traceback" not in out.stderr, out.stderr
    line = out.stdout.strip()
    assert line.startswith(f"config.yaml: writing {config} failed: File too large (errno 27) (it needs about 220 "
                           "bytes;"), line
    assert "at most 64 bytes (ulimit -f)" in line and "The previous version of the file is unchanged" in line
    assert config.read_text() == "train: {steps: 3}\n"
    assert sorted(os.listdir(tmp_path)) == ["config.yaml"]
