"""Decode-time LM head for CPUs: the tied embedding table [vocab, hidden] multiplied as the *left* operand.

A decode step multiplies a handful of rows (the batch) by every weight matrix once, so its speed is how fast
the weights stream from memory. `bench/decode_matmul.py` (8 rows, float32, distinct matrices of bench-small's
shapes, jaxlib 0.10.2, AMD EPYC Zen 5, 2 cores, 2026-12-01), ms a product:

  | weight | `x @ W`, W [in, out] (flax kernels) | `W_t @ x.T`, W_t [out, in] on the left | `x @ W_t.T` |
  |---|---|---|---|
  | [576, 1536] | 0.126 | 0.145 | 0.162 |
  | [1536, 576] | 0.160 | 0.137 | 0.187 |
  | LM head [576, 49152] | 4.04 | 3.97 | 5.05 |

The projections run about as fast from the modules' own [in, out] kernels as from an [out, in] copy, and inside
the decode loop the difference is in the tied head: `embed.attend(h)` = h @ E^T, the table E [vocab, hidden] on
the right. In the whole bench-tiny decode workload (`bench/decode.py`, its head is 2/3 of the weights) the modules'
path (`decode_layout="off"`) gave 1290-1380 generated tokens/s against 1910-2110 with the former fused [out, in]
copy of every projection and of the head; with only the head on the left, as E @ h^T (`project` below), and every
projection through its module, 2280-2600 against 2290-2580 for the fused copy, and 252-278 against 252-273 on
bench-small (calls after the first, runs alternated in one process, shared machine). So decoding uses the table
itself on the left and copies no weight. (Earlier jaxlib builds were measured with the
[out, in] layout ~2x faster for the projections too, which is why decoding once kept a fused [out, in] copy of
every projection: 0.5 GB beside the model's 0.5 GB on bench-small.)
"""

from __future__ import annotations

import jax


def project(x: jax.Array, weight_out_in: jax.Array) -> jax.Array:
    """x [..., in] @ weight_out_in.T, computed as weight [out, in] @ x.T with the weight on the left.

    The optimization barrier keeps XLA from folding the final transpose back into the product, which would
    turn it into the slow [rows, in] x [in, out]^T form again.
    """
    lead, d_in = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, d_in).astype(weight_out_in.dtype)
    out_rows = jax.lax.optimization_barrier(weight_out_in @ rows.T)  # [out, rows]
    return out_rows.T.reshape(*lead, weight_out_in.shape[0])
