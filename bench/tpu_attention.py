"""Attention on a TPU: the splash and paged kernels (`tempax.ops.tpu`) against the plain op, at the 1B shape.

    python bench/tpu_attention.py                      # on a TPU: B 8, T 1024, 32 query heads over 8 kv heads of 64
    python bench/tpu_attention.py --block 1024 --fused-backward   # other splash tiles
    python bench/tpu_attention.py --tiny               # anywhere: B 1, T 256, 4 over 2 heads, Pallas interpret mode

Training attention (one JSON line per implementation and pass), bf16, causal, every row one segment, scale
1/8: `forward` is out = attention(q, k, v); `forward_backward` is the gradient of sum(out * c) with respect to
q, k and v, each under `jax.jit`, the median of `--repeats` calls after one warm-up call, which compiles
(`bench.decode_matmul.median_seconds`).
Implementations:

* `plain`: `tempax.ops.plain.attention` with the [B, T, S] mask of `attention_mask` (what the op table runs on
  a TPU without the kernels);
* `xla`: `jax.nn.dot_product_attention(implementation="xla")` with the same mask;
* `splash`: `tempax.ops.tpu.attention.attention`, q, k, v in tempax's [B, T, heads, H] layout (the transposes
  to and from the kernel's heads-first layout included);
* `splash_heads_first`: the same kernel on inputs already heads-first ([B, heads, T, H]): what the transposes
  cost is the difference.

`tflops` counts the model FLOPs of causal attention, the two products q k^T and p v over the visible half of the
scores: forward 2 x 2 B N T^2 H / 2, forward and backward three times that (the backward's four products);
recomputation inside a kernel is not counted.

Decode (skipped with `--no-decode`): one step of B 64 rows over a bf16 cache of S 2048 slots, every row having
written `--decode-length` of them: `plain` attends over the whole buffer with the rest masked (the plain op's
decode step); `paged` is `tempax.ops.tpu.decode.cache_attention`, which reads each row's written slots only.
`gbps` is the K and V bytes of the written slots over the step's time (what a kernel must read at least).

On a backend other than a TPU without `--tiny`, the script says that it needs a TPU and exits 0. `--tiny` runs
the same code at a tiny shape in Pallas's interpret mode, a check that the script works, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout, for `bench.*`

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel import SegmentIds  # noqa: E402

from bench.decode_matmul import median_seconds  # noqa: E402
from tempax.ops import plain  # noqa: E402
from tempax.ops.tpu import attention as tpu_attention  # noqa: E402
from tempax.ops.tpu import decode as tpu_decode  # noqa: E402

SHAPE_1B = dict(b=8, t=1024, n=32, k=8, h=64)
SHAPE_TINY = dict(b=1, t=256, n=4, k=2, h=64)


def training_rows(shape: dict[str, int], *, block: int, fused_backward: bool, repeats: int,
                  interpret: bool) -> list[dict[str, Any]]:
    b, t, n, k, h = shape["b"], shape["t"], shape["n"], shape["k"], shape["h"]
    rng = np.random.default_rng(0)
    q, kk, v, c = (jnp.asarray(rng.standard_normal(s), jnp.bfloat16)
                   for s in ((b, t, n, h), (b, t, k, h), (b, t, k, h), (b, t, n, h)))
    scale = h**-0.5
    index, segments = jnp.arange(t, dtype=jnp.int32), jnp.ones((b, t), jnp.int32)
    sizes = tpu_attention.block_sizes(t, block=block, fused_backward=fused_backward)

    def plain_op(q, kk, v):
        mask = plain.attention_mask(index, index, segments, segments, None)
        return plain.attention(q, kk, v, mask, scale=scale, logit_cap=None, kv_layout="bskh")

    def xla_op(q, kk, v):
        mask = plain.attention_mask(index, index, segments, segments, None)
        return plain.library_attention(q, kk, v, mask, scale=scale, implementation="xla")

    def splash_op(q, kk, v):
        return tpu_attention.attention(q, kk, v, q_segments=segments, k_segments=segments, scale=scale, sizes=sizes,
                                       interpret=interpret)

    def splash_heads_first(q, kk, v):  # q [B, N, T, H], k and v [B, K, T, H]: the kernel's own layout
        kernel = tpu_attention.splash_kernel(t, n, None, None, sizes, interpret)
        return jax.vmap(kernel)(q * jnp.asarray(scale, q.dtype), kk, v, SegmentIds(segments, segments))

    heads_first = lambda x: jnp.asarray(x.swapaxes(1, 2))  # noqa: E731
    impls = {"plain": (plain_op, (q, kk, v), c), "xla": (xla_op, (q, kk, v), c),
             "splash": (splash_op, (q, kk, v), c),
             "splash_heads_first": (splash_heads_first, tuple(heads_first(x) for x in (q, kk, v)), heads_first(c))}
    flops_forward = 2 * 2 * b * n * t * t * h / 2
    rows = []
    for name, (op, args, cot) in impls.items():
        forward = jax.jit(op)
        backward = jax.jit(jax.grad(lambda q, kk, v, c, op=op: jnp.sum(op(q, kk, v).astype(jnp.float32) * c),
                                    (0, 1, 2)))
        for pass_name, fn, call_args, flops in (("forward", forward, args, flops_forward),
                                                ("forward_backward", backward, (*args, cot), 3 * flops_forward)):
            try:
                seconds = median_seconds(fn, *call_args, repeats=repeats)
            except Exception as error:  # a failing implementation is a result to print, not the end of the run
                rows.append({"part": "training", "impl": name, "pass": pass_name, "error": repr(error)[:500]})
                continue
            rows.append({"part": "training", "impl": name, "pass": pass_name, "ms": round(seconds * 1e3, 3),
                         "tflops": round(flops / seconds / 1e12, 2), "block": sizes.block_q,
                         "fused_backward": fused_backward})
    return rows


def decode_rows(shape: dict[str, int], *, batch: int, slots: int, length: int, repeats: int,
                interpret: bool) -> list[dict[str, Any]]:
    n, k, h = shape["n"], shape["k"], shape["h"]
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.standard_normal((batch, 1, n, h)), jnp.bfloat16)
    kk, v = (jnp.asarray(rng.standard_normal((batch, k, slots, h)), jnp.bfloat16) for _ in range(2))
    lengths = jnp.full((batch,), length, jnp.int32)
    segments = (jnp.arange(slots)[None] < lengths[:, None]).astype(jnp.int32)
    scale = h**-0.5

    def plain_op(q, kk, v, lengths):
        mask = plain.attention_mask(lengths[:1] - 1, jnp.arange(slots), jnp.ones((batch, 1), jnp.int32), segments,
                                    None)
        return plain.attention(q, kk, v, mask, scale=scale, logit_cap=None, kv_layout="bksh")

    def paged_op(q, kk, v, lengths):
        return tpu_decode.cache_attention(q, kk, v, lengths=lengths, scale=scale, interpret=interpret)

    written = 2 * batch * k * length * h * 2  # K and V, bf16
    rows = []
    for name, op in (("plain", plain_op), ("paged", paged_op)):
        try:
            seconds = median_seconds(jax.jit(op), q, kk, v, lengths, repeats=repeats)
        except Exception as error:  # as above
            rows.append({"part": "decode", "impl": name, "error": repr(error)[:500]})
            continue
        rows.append({"part": "decode", "impl": name, "batch": batch, "slots": slots, "length": length,
                     "us": round(seconds * 1e6, 1), "gbps": round(written / seconds / 1e9, 1)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes in Pallas interpret mode (any backend)")
    parser.add_argument("--block", type=int, default=tpu_attention.DEFAULT_BLOCK, help="splash tile (128, 256, ...)")
    parser.add_argument("--fused-backward", action="store_true", help="splash's fused dq/dk/dv backward kernel")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-decode", dest="decode", action="store_false", help="skip the decode step")
    parser.add_argument("--decode-length", type=int, default=1024, help="slots each row has written (of 2048)")
    args = parser.parse_args(argv)
    backend = jax.default_backend()
    device = jax.devices()[0]
    head = {"device": getattr(device, "device_kind", str(device)), "backend": backend, "jax": jax.__version__}
    if backend != "tpu" and not args.tiny:
        print(json.dumps({**head, "skipped": "the kernels need a TPU; --tiny runs them in interpret mode"}))
        return 0
    interpret = backend != "tpu"
    shape = SHAPE_TINY if args.tiny else SHAPE_1B
    head.update(shape, interpret=interpret, dtype="bfloat16")
    repeats = 2 if args.tiny else args.repeats
    rows = training_rows(shape, block=args.block, fused_backward=args.fused_backward, repeats=repeats,
                         interpret=interpret)
    if args.decode:
        batch, slots = (2, 64) if args.tiny else (64, 2048)
        rows += decode_rows(shape, batch=batch, slots=slots, length=min(args.decode_length, slots), repeats=repeats,
                            interpret=interpret)
    for row in rows:
        print(json.dumps({**head, **row}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
