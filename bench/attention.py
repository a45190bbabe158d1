"""One layer's training attention, forward + backward, at bench-small shapes: wall ms per call, float32 and bf16.

    python bench/attention.py                          # this checkout's tempax.ops.attention (the CPU variant)
    PYTHONPATH=/path/to/other/checkout python bench/attention.py   # another version's, for a before / after pair

B 8, T 256, 9 query heads sharing 3 kv heads of 64 (SmolLM2-135M's), causal; the gradient of sum(out * c) with
respect to q, k and v under `jax.jit`, best and median of 20 calls after two warm-up calls
(tests/ops/cpu/test_attention.py checks which kernels the bf16 program's dots compile to).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from tempax.runtime.host import cpu_line

try:
    from tempax.ops import attention
except ImportError:  # a checkout from before tempax.ops, measured for a before / after pair
    from tempax.models.decoder import attention

B, T, N, K, H = 8, 256, 9, 3, 64


def measure(dtype) -> dict:
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal(s), dtype) for s in ((B, T, N, H), (B, T, K, H), (B, T, K, H)))
    c = jnp.asarray(rng.standard_normal((B, T, N, H)), jnp.float32)
    index, segments = jnp.arange(T, dtype=jnp.int32), jnp.ones((B, T), jnp.int32)

    def loss(q, k, v, c):
        out = attention(q, k, v, q_index=index, k_index=index, q_segments=segments, k_segments=segments,
                        scale=H**-0.5)
        return jnp.sum(out.astype(jnp.float32) * c)

    step = jax.jit(jax.grad(loss, (0, 1, 2)))
    for _ in range(2):
        jax.block_until_ready(step(q, k, v, c))
    times = []
    for _ in range(20):
        start = time.perf_counter()
        jax.block_until_ready(step(q, k, v, c))
        times.append(time.perf_counter() - start)
    return {"dtype": jnp.dtype(dtype).name, "best_ms": round(min(times) * 1e3, 2),
            "median_ms": round(statistics.median(times) * 1e3, 2)}


def main() -> int:
    for dtype in (jnp.float32, jnp.bfloat16):
        print(json.dumps({**measure(dtype), "cpu": cpu_line(), "jax": jax.__version__}))
    return 0


if __name__ == "__main__":
    from tempax.runtime.process import setup_process

    setup_process()  # the XLA flags and allocator settings the `tempax` command runs with
    sys.exit(main())
