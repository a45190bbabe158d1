"""Few-row matrix products as a decode step does them: which operand layout streams weights fastest on XLA:CPU.

    python bench/decode_matmul.py

For 8 rows (the decode workload's batch) times 30 distinct float32 weight matrices of bench-small's shapes (the
tied LM head: 3), prints milliseconds per product and the weight bytes streamed per second for
  * `x @ W`            W stored [in, out], the usual layout (flax kernels);
  * `W_t @ x.T`        W stored [out, in] on the left (`tempax.ops.cpu.lm_head.table_on_left`);
  * `x @ W_t.T`        W stored [out, in] on the right.
The matrices are distinct so that none stays in cache between products, as in a real step.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np


def median_seconds(fn, *args, repeats: int = 10) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> None:
    rng = np.random.default_rng(0)
    rows = 8
    for d_in, d_out, count in [(576, 1536, 30), (1536, 576, 30), (576, 49152, 3)]:
        x = jnp.asarray(rng.standard_normal((rows, d_in), np.float32))
        w_in_out = [jnp.asarray(rng.standard_normal((d_in, d_out), np.float32)) for _ in range(count)]
        w_out_in = [jnp.asarray(np.ascontiguousarray(np.asarray(w).T)) for w in w_in_out]
        variants = {
            "x @ W     [in, out]": (lambda x, ws: [x @ w for w in ws], w_in_out),
            "W_t @ x.T [out, in]": (lambda x, ws: [jax.lax.optimization_barrier(w @ x.T).T for w in ws], w_out_in),
            "x @ W_t.T [out, in]": (lambda x, ws: [x @ w.T for w in ws], w_out_in),
        }
        for name, (fn, weights) in variants.items():
            seconds = median_seconds(jax.jit(fn), x, weights)
            streamed = d_in * d_out * 4 * count / seconds
            print(f"[{d_in}, {d_out}] {name}: {seconds / count * 1e3:.3f} ms a product, {streamed / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
