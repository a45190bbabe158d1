"""Host memory of loading SmolLM2-135M-Instruct from its GGUF: peak RSS added by the load, against the weights.

    python bench/load_memory.py            # each repeat in a fresh process (default 2), one JSON line each
    python bench/load_memory.py --one      # one measurement in this process (what the driver spawns)

In a fresh process: import tempax and JAX and parse the GGUF header first (so their memory is not counted), read
the resident set size, load the model (Q4_1 -> float32, tied embedding), wait for the arrays, then read the peak
resident set size (`ru_maxrss`). Printed: the float32 weight bytes, the peak RSS added by loading, and their
ratio (1.0 = the load never held more than one copy of the weights).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 2**20


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure() -> dict:
    import jax

    from tempax.models.config import memory_for_weights
    from tempax.models.gguf_io import gguf_config, load_gguf, read_gguf_header
    from tempax.models.registry import resolve_source

    path = resolve_source("smollm2-135m-instruct").location
    cfg = gguf_config(read_gguf_header(path))
    jax.numpy.zeros(1).block_until_ready()  # start the backend before the baseline
    before = _rss_bytes()
    if resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 > before + 64 * MIB:
        print("warning: the peak before loading is well above the current RSS; the delta may be low",
              file=sys.stderr)
    start = time.perf_counter()
    model = load_gguf(path, progress=False)
    jax.block_until_ready(jax.tree.leaves(model))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    weights = memory_for_weights(cfg)["float32"]
    return {"file": os.path.basename(path), "weights_float32_mib": round(weights / MIB, 1),
            "rss_before_mib": round(before / MIB, 1), "peak_rss_added_mib": round((peak - before) / MIB, 1),
            "ratio_to_weights": round((peak - before) / weights, 3), "load_s": round(seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--one", action="store_true", help="measure in this process")
    parser.add_argument("--repeats", type=int, default=2, help="fresh processes to measure in")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure()))
        return
    for _ in range(args.repeats):
        subprocess.run([sys.executable, os.path.abspath(__file__), "--one"], check=True)


if __name__ == "__main__":
    main()
