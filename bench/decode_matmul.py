"""Few-row matrix products as a decode step does them: which operand layout streams weights fastest on XLA:CPU.

    python bench/decode_matmul.py

For 8 rows (the decode workload's batch) times 30 distinct float32 weight matrices of bench-small's shapes (the
tied LM head: 3), prints milliseconds per product and the weight bytes streamed per second for
  * `x @ W`            W stored [in, out], the usual layout (flax kernels);
  * `W_t @ x.T`        W stored [out, in] on the left (`tempax.ops.cpu.lm_head.table_on_left`);
  * `x @ W_t.T`        W stored [out, in] on the right.
The matrices are distinct so that none stays in cache between products, as in a real step.

    python bench/decode_matmul.py --step

The weight products of one whole bench-small decode step and nothing else, in order, each consuming the one
before (30 layers of q, k, v, o, gate, up, down, then the tied head [V, D] on the left as tempax decodes), under
the XLA flags tempax sets on this CPU; and, when PyTorch is installed, the same chain with `F.linear` on [out,
in] weights (PyTorch's own layout and kernels, its default threads). A decode step cannot be faster than its
products, so batch / (products' time) is an upper bound on the workload's generated tokens/s for a decoder built
on those kernels, whatever it does around them; the line beside it is the memory-bandwidth bound (the weight
bytes read at the speed of a plain jitted sum).
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


def step_products(repeats: int = 20) -> None:
    """The `--step` figures (see the module docstring)."""
    import json
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    from bench.decode import load_spec
    from tempax.runtime.process import settings_in_effect, tuned_env

    os.environ["XLA_FLAGS"] = tuned_env(dict(os.environ)).get("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    shape = load_spec()["models"]["small"]
    d, f, kv = shape["hidden_size"], shape["intermediate_size"], shape["num_kv_heads"] * shape["head_dim"]
    vocab, layers, rows = shape["vocab_size"], shape["num_layers"], 8
    group = d // kv  # query width / kv width: the kv projections are widened back to d by repetition
    shapes = {"q": (d, d), "k": (d, kv), "v": (d, kv), "o": (d, d), "gate": (d, f), "up": (d, f), "down": (f, d)}
    rng = np.random.default_rng(0)
    weights = [{n: (rng.standard_normal(s, np.float32) * 0.02) for n, s in shapes.items()} for _ in range(layers)]
    table = rng.standard_normal((vocab, d), np.float32) * 0.02
    x0 = rng.standard_normal((rows, d), np.float32)
    weight_bytes = 4 * (sum(a.size for w in weights for a in w.values()) + table.size)

    def chain(x, ws, table, linear, silu, tile):
        for w in ws:
            a = linear(x, w["q"]) + tile(linear(x, w["k"]) + linear(x, w["v"]), group)
            x = x + linear(a, w["o"])
            x = x + linear(silu(linear(x, w["gate"])) * linear(x, w["up"]), w["down"])
        return linear(x, table, head=True)

    def jax_linear(x, w, head=False):  # tempax's layouts: kernels [in, out]; the tied head [V, D] on the left
        return jax.lax.dot_general(w, x, (((1,), (1,)), ((), ()))).T if head else x @ w

    fn = jax.jit(lambda x, ws, t: chain(x, ws, t, jax_linear, jax.nn.silu, lambda y, g: jnp.tile(y, g)))
    args = (jnp.asarray(x0), [{n: jnp.asarray(a) for n, a in w.items()} for w in weights], jnp.asarray(table))
    seconds = median_seconds(fn, *args, repeats=repeats)
    total = jax.jit(jnp.sum)
    flat = jnp.ones((weight_bytes // 4,), jnp.float32)
    sum_s = median_seconds(total, flat, repeats=repeats)
    print(json.dumps({"what": "bench-small decode step, weight products only", "library": f"JAX {jax.__version__}",
                      "ms_per_step": round(seconds * 1e3, 2), "bound_tokens_per_s": round(rows / seconds, 1),
                      "bandwidth_bound_tokens_per_s": round(rows / sum_s, 1), **settings_in_effect()}))
    try:
        import torch
    except ImportError:
        return
    torch_weights = [{n: torch.from_numpy(np.ascontiguousarray(a.T)) for n, a in w.items()} for w in weights]

    def torch_linear(x, w, head=False):  # PyTorch's layout: [out, in] (the tied table is one already)
        return torch.nn.functional.linear(x, w)

    tx, tt = torch.from_numpy(x0), torch.from_numpy(table)
    step = lambda: chain(tx, torch_weights, tt, torch_linear, torch.nn.functional.silu,  # noqa: E731
                         lambda y, g: y.repeat(1, g))
    with torch.inference_mode():
        step()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    seconds = float(np.median(times))
    print(json.dumps({"what": "bench-small decode step, weight products only",
                      "library": f"torch {torch.__version__} ({torch.get_num_threads()} threads)",
                      "ms_per_step": round(seconds * 1e3, 2), "bound_tokens_per_s": round(rows / seconds, 1)}))


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--step"]:
        step_products()
    else:
        main()
