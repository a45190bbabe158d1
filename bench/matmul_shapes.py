"""GFLOP/s of the training step's own matrix products, in JAX (per XLA:CPU flag setting) and in PyTorch.

    python bench/matmul_shapes.py small                          # default flags vs PyTorch
    python bench/matmul_shapes.py small --flags= --flags=--xla_cpu_use_onednn=true   # a sweep, one process each
    python bench/matmul_shapes.py tiny --only lm_head            # just the products whose name starts so

The products are those of one bench-`size` step (8 x 256 = 2048 tokens): for every projection weight W [in, out]
(stored so, as tempax's Linear kernels are) the forward x @ W, the input gradient dy @ W^T and the weight gradient
x^T @ dy, and for the tied LM head E [vocab, hidden] the forward x @ E^T, the input gradient dlogits @ E and the
weight gradient dlogits^T @ x. Each is one jitted `lax.dot_general` over operands in exactly that layout, so a
transposed operand is XLA's to handle, as in the step. Every JAX setting runs in its own process (XLA reads
XLA_FLAGS once, when it starts); PyTorch (`torch.matmul` on the same layouts, all cores) runs in this process.
Prints one table: GFLOP/s per product and setting, and each setting's time over all products of one step
(each product weighted by how often a step runs it) relative to PyTorch's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOKENS = 8 * 256

# (name, m, k, n) of the forward product [m, k] x [k, n] and how many times one step runs it.
SHAPES = {
    "tiny": {"hidden": 256, "q": 256, "kv": 128, "mlp": 1024, "vocab": 32000, "layers": 4},
    "small": {"hidden": 576, "q": 576, "kv": 192, "mlp": 1536, "vocab": 49152, "layers": 30},
}


def products(size: str) -> list[tuple[str, tuple[int, int], tuple[int, int], tuple[tuple[int], tuple[int]], int]]:
    """(name, lhs shape, rhs shape, contracting dims (lhs, rhs), count per step) of every product of a step."""
    s = SHAPES[size]
    d, t, layers = s["hidden"], TOKENS, s["layers"]
    weights = [("q_o", d, s["q"], 2), ("k_v", d, s["kv"], 2), ("gate_up", d, s["mlp"], 2), ("down", s["mlp"], d, 1)]
    out = []
    for name, i, o, count in weights:
        out += [(f"{name}.fwd", (t, i), (i, o), ((1,), (0,)), count * layers),
                (f"{name}.dgrad", (t, o), (i, o), ((1,), (1,)), count * layers),
                (f"{name}.wgrad", (t, i), (t, o), ((0,), (0,)), count * layers)]
    v = s["vocab"]
    out += [("lm_head.fwd", (t, d), (v, d), ((1,), (1,)), 1), ("lm_head.dgrad", (t, v), (v, d), ((1,), (0,)), 1),
            ("lm_head.wgrad", (t, v), (t, d), ((0,), (0,)), 1)]
    return out


def flops(lhs: tuple[int, int], rhs: tuple[int, int], contract: tuple[tuple[int], tuple[int]]) -> int:
    k = lhs[contract[0][0]]
    return 2 * k * (lhs[0] * lhs[1] // k) * (rhs[0] * rhs[1] // k)


def best_time(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure_jax(size: str, only: str, repeats: int) -> dict[str, float]:
    import jax
    import jax.numpy as jnp

    out = {}
    for name, lhs, rhs, contract, _ in products(size):
        if not name.startswith(only):
            continue
        a = jax.random.normal(jax.random.key(0), lhs, jnp.float32)
        b = jax.random.normal(jax.random.key(1), rhs, jnp.float32)
        dot = jax.jit(lambda a, b, c=contract: jax.lax.dot_general(a, b, (c, ((), ()))))
        out[name] = flops(lhs, rhs, contract) / best_time(lambda: dot(a, b).block_until_ready(), repeats) / 1e9
    return out


def measure_torch(size: str, only: str, repeats: int) -> dict[str, float]:
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    out = {}
    g = torch.Generator().manual_seed(0)
    for name, lhs, rhs, contract, _ in products(size):
        if not name.startswith(only):
            continue
        a, b = torch.randn(lhs, generator=g), torch.randn(rhs, generator=g)
        (ca,), (cb,) = contract
        x = a if ca == 1 else a.t()  # the same stored layouts as JAX's; torch.matmul takes the strided views
        y = b if cb == 0 else b.t()
        with torch.no_grad():
            out[name] = flops(lhs, rhs, contract) / best_time(lambda: torch.matmul(x, y), repeats) / 1e9
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("size", choices=tuple(SHAPES))
    parser.add_argument("--flags", action="append", default=None,
                        help="an XLA_FLAGS setting to compare (repeatable; write --flags=VALUE), each in its own "
                             "process (default: the current XLA_FLAGS)")
    parser.add_argument("--only", default="", help="measure only products whose name starts with this")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--jax-here", action="store_true", help=argparse.SUPPRESS)  # the child process's mode
    args = parser.parse_args()
    if args.jax_here:
        print(json.dumps(measure_jax(args.size, args.only, args.repeats)))
        return 0
    settings = args.flags if args.flags is not None else [os.environ.get("XLA_FLAGS", "")]
    results: dict[str, dict[str, float]] = {}
    for flags in settings:
        env = dict(os.environ, XLA_FLAGS=flags, PYTHONPATH=ROOT)
        run = subprocess.run([sys.executable, __file__, args.size, "--jax-here", "--only", args.only,
                              "--repeats", str(args.repeats)], env=env, capture_output=True, text=True)
        if run.returncode:
            print(f"[{flags or 'default'}] failed:\n{run.stderr[-1500:]}", file=sys.stderr)
            continue
        results[f"jax {flags or '(no flags)'}"] = json.loads(run.stdout.splitlines()[-1])
    if not args.no_torch:
        import torch

        results[f"torch {torch.__version__}"] = measure_torch(args.size, args.only, args.repeats)
    sys.path.insert(0, ROOT)
    from tempax.runtime.host import cpu_line

    print(f"# {args.size}, {TOKENS} tokens, float32; {cpu_line()}; GFLOP/s (best of {args.repeats})")
    names = [p[0] for p in products(args.size) if p[0].startswith(args.only)]
    counts = {p[0]: (p[4], flops(p[1], p[2], p[3])) for p in products(args.size)}
    cols = list(results)
    for i, c in enumerate(cols):
        print(f"# [{i}] {c}")
    print(f"{'product':16}" + "".join(f"{f'[{i}]':>9}" for i in range(len(cols))))
    for name in names:
        print(f"{name:16}" + "".join(f"{results[c].get(name, float('nan')):9.1f}" for c in cols))
    step_s = {c: sum(counts[n][0] * counts[n][1] / (results[c][n] * 1e9) for n in names) for c in cols}
    print(f"{'step s (sum)':16}" + "".join(f"{step_s[c]:9.3f}" for c in cols))
    print(json.dumps({"size": args.size, "cpu": cpu_line(), "gflops": results, "step_matmul_s": step_s}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
