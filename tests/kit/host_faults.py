"""A `tempax` command with its process killed at a chosen point, for the two-host tests (`tests/kit/hosts.py`).

    python -m tests.kit.host_faults FAULT STEP -- sft --config R.yaml ...

FAULT: kill_step (SIGKILL once training step STEP is dispatched and not finished), kill_save (SIGKILL right after
checkpoint STEP's asynchronous write started, while its files are being written). The process kills itself at
that point, exactly, which a kill from outside could only hit by chance; the test then kills whatever else
runs on the host (`Host.kill_all`).
"""

from __future__ import annotations

import runpy
import sys

from tests.kit.kill_points import install_kill


if __name__ == "__main__":
    fault, at_step, dash, *command = sys.argv[1:]
    assert dash == "--", "usage: python -m tests.kit.host_faults FAULT STEP -- COMMAND ..."
    install_kill(fault, int(at_step))
    # The command runs as `python -m tempax.cli.main COMMAND ...` runs it (the process set up as the `tempax`
    # command does), in this process, so the kill points installed above are in place.
    sys.argv = ["tempax", *command]
    runpy.run_module("tempax.cli.main", run_name="__main__", alter_sys=True)
