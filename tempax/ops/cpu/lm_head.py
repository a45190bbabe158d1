"""The LM head in the forms XLA:CPU runs fast: a tied head in decode steps, and two steps of the fused head.

`table_on_left` is the tied head of a decode step with the table on the left; `CpuHeadForms` (`CPU_FORMS`, for
`tempax.ops.fused_head`) is the fused head's softmax and dL/dW. Each docstring says why its form is faster. The
measurements behind both: `docs/measurements/performance-history.md` ("bf16 fused head").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tempax.ops.cpu.matmul import row_major_transpose
from tempax.ops.fused_head import HeadForms, logsumexp_from_max
from tempax.ops.plain import BF16


def table_on_left(x: jax.Array, weight_out_in: jax.Array) -> jax.Array:
    """x [..., in] @ weight_out_in.T, computed as weight [out, in] @ x.T with the weight on the left.

    A decode step multiplies a handful of rows (the batch) by every weight matrix once, so its speed is how fast
    the weights stream from memory. For the projections the modules' own [in, out] kernels stream about as fast as
    an [out, in] copy would, so decoding copies no weight; the exception is the tied head, h @ E^T with the table
    E [vocab, hidden] on the right, which XLA:CPU runs markedly faster as E @ h^T with the table on the left.
    Per-product timings: `python bench/decode_matmul.py`; whole-workload figures:
    `docs/measurements/performance-history.md`.

    The optimization barrier keeps XLA from folding the final transpose back into the product, which would
    turn it into the slow [rows, in] x [in, out]^T form again.
    """
    lead, d_in = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, d_in).astype(weight_out_in.dtype)
    out_rows = jax.lax.optimization_barrier(weight_out_in @ rows.T)  # [out, rows]
    return out_rows.T.reshape(*lead, weight_out_in.shape[0])


class CpuHeadForms(HeadForms):
    """The fused head's softmax and dL/dW in the forms XLA:CPU runs fast.

    * bfloat16 hidden states: softmax(z) = e / sum(e) from e = exp(z - max) written out once (behind an
      optimization barrier), instead of a second exp(z - lse) pass. XLA:CPU otherwise sends the fused exp-and-sum over
      the vocabulary to YNNPACK, which is slower than the whole of this form.
    * dL/dW is summed as [D, V] for either head layout: h^T g reads g [.., V] in its own layout, where g^T h has
      XLA:CPU transpose every chunk's [C, V] g first; a float32 [V, D] head's gradient is transposed once, after the
      chunks. A bf16 [V, D] head's is summed as [V, D] from g^T made row-major (`row_major_transpose`): the
      once-transposed [D, V] sum is read transposed by each of the optimizer's fusions on the tied embedding, at a
      fraction of the rate of a row-major update.
    """

    def softmax(self, z: jax.Array, m: jax.Array, dtype: jnp.dtype) -> tuple[jax.Array, jax.Array | None]:
        if dtype != BF16:
            return logsumexp_from_max(z, m), None
        e = jax.lax.optimization_barrier(jnp.exp(z - m[..., None]))
        total = jnp.sum(e, axis=-1)
        return m + jnp.log(total), e * (1.0 / total)[..., None]

    def gradient_shape(self, w_shape: tuple[int, ...], vocab_major: bool, dtype: jnp.dtype) -> tuple[int, ...]:
        return w_shape[::-1] if vocab_major and dtype != BF16 else w_shape

    def gradient_chunk(self, hc: jax.Array, g: jax.Array, vocab_major: bool) -> jax.Array:
        if vocab_major and hc.dtype == BF16:
            g_vc = row_major_transpose(g.reshape(-1, g.shape[-1]))
            return jax.lax.dot_general(g_vc, hc.reshape(-1, hc.shape[-1]), (((1,), (0,)), ((), ())),
                                       preferred_element_type=jnp.float32)
        return jnp.einsum("bcd,bcv->dv", hc, g, preferred_element_type=jnp.float32)

    def head_gradient(self, dw: jax.Array, vocab_major: bool, dtype: jnp.dtype) -> jax.Array:
        return dw.T if vocab_major and dtype != BF16 else dw


CPU_FORMS = CpuHeadForms()
