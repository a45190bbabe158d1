"""Progress bars for work that takes more than a few seconds: what is being done, how far it is, and an ETA.

Every long command (training, a held-out evaluation, generation-based evaluation, scoring a file) shows one
`work_bar`: a tqdm bar on stderr labelled with what it is doing ("held-out eval at step 20", "eval gsm8k greedy",
"scoring test.jsonl"), counting the units it works through (batches, problems, sequences), so tqdm can show
the rate and the time left. By default a bar is drawn only on a terminal (tqdm's rule for `disable=None`), so
logs, pipes and tests stay free of carriage-return noise; the training bar keeps its own switch
(`train.progress_bar`).
"""

from __future__ import annotations

import sys
from typing import Any


class _Silent:
    """What `work_bar` returns when no bar is drawn: the same calls, doing nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "_Silent":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def on_terminal() -> bool:
    return sys.stderr.isatty()


def work_bar(total: int | None, desc: str, *, unit: str = "it", enabled: bool | None = None) -> Any:
    """A labelled tqdm bar over `total` units (None: unknown, no ETA), used as a context manager.

    Args:
      total: how many units the work has.
      desc: what is being done, shown at the bar's left.
      unit: the name of one unit ("batch", "problem", "seq").
      enabled: True draws the bar, False never; None draws it only when stderr is a terminal.
    """
    if enabled is False or (enabled is None and not on_terminal()):
        return _Silent()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, leave=False, file=sys.stderr)
