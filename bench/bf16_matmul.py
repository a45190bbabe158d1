"""Which bfloat16 matrix products XLA:CPU runs at bf16 speed: GFLOP/s of bench-small's layer products.

    python bench/bf16_matmul.py                                  # XLA, then PyTorch, default flags
    XLA_FLAGS=--xla_cpu_use_onednn=true python bench/bf16_matmul.py --no-torch

For the two layer shapes of bench-small ([2048, 576] x [576, 1536] and [2048, 1536] x [1536, 576], 2048 tokens)
each of the forward x W, the input gradient dy W^T and the weight gradient x^T dy, as one jitted
`lax.dot_general` in three forms: float32; bf16 operands with a bf16 result; bf16 operands with a float32
result (`preferred_element_type`). The weight gradient also as "wgrad_rowmajor": x^T handed over already
transposed, the layout `tempax.ops.projection_dot` gives it on a CPU. PyTorch: `torch.matmul` on the same
operands (bf16 and float32). Best of 5; prints one JSON object per library.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from matmul_shapes import best_time  # noqa: E402  (bench/, this script's folder)

TOKENS = 2048
SHAPES = {"576x1536": (576, 1536), "1536x576": (1536, 576)}


def measure_xla() -> dict:
    import jax
    import jax.numpy as jnp
    from jax import lax

    out = {"library": f"jax {jax.__version__}", "xla_flags": os.environ.get("XLA_FLAGS", "")}
    for name, (k, n) in SHAPES.items():
        m = TOKENS
        # (contracting dims, lhs shape, rhs shape) of each product, operands in the layout the step has them.
        products = {"fwd": (((1,), (0,)), (m, k), (k, n)), "dgrad": (((1,), (1,)), (m, n), (k, n)),
                    "wgrad": (((0,), (0,)), (m, k), (m, n)), "wgrad_rowmajor": (((1,), (0,)), (k, m), (m, n))}
        for product, (dims, lhs_shape, rhs_shape) in products.items():
            for mode, dtype, result in (("f32", jnp.float32, None), ("bf16->bf16", jnp.bfloat16, None),
                                        ("bf16->f32", jnp.bfloat16, jnp.float32)):
                a = jax.random.normal(jax.random.key(0), lhs_shape, jnp.float32).astype(dtype)
                b = jax.random.normal(jax.random.key(1), rhs_shape, jnp.float32).astype(dtype)
                dot = jax.jit(lambda a, b, d=dims, r=result: lax.dot_general(a, b, (d, ((), ())),
                                                                             preferred_element_type=r))
                seconds = best_time(lambda: dot(a, b).block_until_ready(), 5)
                out[f"{name} {product} {mode}"] = round(2 * m * k * n / seconds / 1e9, 1)
    return out


def measure_torch() -> dict:
    import torch

    out = {"library": f"torch {torch.__version__}", "threads": torch.get_num_threads()}
    for name, (k, n) in SHAPES.items():
        for mode, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
            x, w, g = (torch.randn(*s).to(dtype) for s in ((TOKENS, k), (k, n), (TOKENS, n)))
            for product, fn in (("fwd", lambda: x @ w), ("dgrad", lambda: g @ w.t()), ("wgrad", lambda: x.t() @ g)):
                out[f"{name} {product} {mode}"] = round(2 * TOKENS * k * n / best_time(fn, 5) / 1e9, 1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-torch", action="store_true", help="measure XLA only")
    args = parser.parse_args()
    from tempax.runtime.process import settings_in_effect

    print(json.dumps({**measure_xla(), "cpu": settings_in_effect()["cpu"]}), flush=True)
    if not args.no_torch:
        print(json.dumps(measure_torch()), flush=True)
    return 0


if __name__ == "__main__":
    from tempax.runtime.process import setup_process

    setup_process()  # as the `tempax` command does; TEMPAX_REEXEC=0 measures without
    raise SystemExit(main())
