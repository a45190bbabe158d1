"""Runs a notebook's code cells top to bottom in this interpreter, without a Jupyter kernel: a TPU machine that
allows no sockets cannot start one, and a notebook should still run there unchanged.

    python scripts/tpu/run_notebook.py examples/grpo_gsm8k.ipynb

The cells share one namespace, as in a kernel; what they print is printed, and figures are drawn off screen
(matplotlib's Agg backend: a cell saves what it wants to keep). A cell's last expression is not displayed, so a
notebook meant for both prints what it shows. IPython syntax (`%magic`, `!command`) has no meaning here: such a
cell is refused, naming it, before anything runs. Standard library only (standard library and the notebook's own
imports are all a TPU machine is sure to have).
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings


class NotebookError(Exception):
    """A notebook that cannot run as plain Python; the message names the file and the cell."""


def code_cells(path: str) -> list[str]:
    """The source of each code cell, in order; raises `NotebookError` for a file that is not a notebook or a cell
    with IPython syntax."""
    try:
        with open(path, encoding="utf-8") as f:
            notebook = json.load(f)
        cells = notebook["cells"]
    except OSError as e:
        raise NotebookError(f"{path}: cannot read it ({e.strerror})") from None
    except (ValueError, KeyError, TypeError):
        raise NotebookError(f"{path}: not a Jupyter notebook (JSON with a 'cells' list)") from None
    sources = []
    for cell in cells:
        if cell.get("cell_type") != "code":
            continue
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        for line in source.splitlines():
            if line.lstrip().startswith(("%", "!")):
                raise NotebookError(f"{path}: code cell {len(sources) + 1} uses IPython syntax ({line.strip()!r}), "
                                    "which only a kernel runs; write it as Python")
        sources.append(source)
    return sources


def run(path: str) -> None:
    """Executes the code cells of `path` in one namespace whose `__name__` is `__main__`."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    # plt.show() under Agg only says it cannot show: the notebook saves its figures itself.
    warnings.filterwarnings("ignore", message=".*non-interactive.*cannot be shown")
    # As in a kernel started here: the working directory, not this script's folder, is first on the path.
    sys.path[0] = ""
    namespace = {"__name__": "__main__", "__file__": os.path.abspath(path)}
    cells = code_cells(path)
    for n, source in enumerate(cells, 1):
        started = time.perf_counter()
        print(f"--- code cell {n} of {len(cells)}", flush=True)
        exec(compile(source, f"{path} (code cell {n})", "exec"), namespace)
        print(f"--- code cell {n} done in {time.perf_counter() - started:.1f} s", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/tpu/run_notebook.py NOTEBOOK.ipynb", file=sys.stderr)
        return 2
    try:
        run(argv[0])
    except NotebookError as e:
        print(f"run_notebook.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
