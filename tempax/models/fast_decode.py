"""Decode-time LM head for CPUs: the tied embedding table [vocab, hidden] multiplied as the *left* operand.

A decode step multiplies a handful of rows (the batch) by every weight matrix once, so its speed is how fast
the weights stream from memory. For the projections the modules' own [in, out] kernels stream about as fast as
an [out, in] copy would, so decoding copies no weight; the exception is the tied head, `embed.attend(h)` =
h @ E^T with the table E [vocab, hidden] on the right, which XLA:CPU runs markedly faster as E @ h^T with the
table on the left (`project` below). Per-product timings: `python bench/decode_matmul.py`; whole-workload
figures: `docs/measurements/performance-history.md`.
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
