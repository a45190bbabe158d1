"""Projections and the gated MLP's gradient in the layouts XLA:CPU multiplies fastest.

The rule XLA:CPU (jaxlib 0.10) imposes, and the reason for each form here:

* A product's operands are read in the layout they have. Plain autodiff of x @ W builds the kernel's gradient
  transposed, as (g^T x)^T, and XLA:CPU then copies every [tokens, out] g into [out, tokens] first, a large
  share of a training step (`bench/profile_step.py`). `project` writes d W = x^T g over all tokens at once,
  [in, tokens] x [tokens, out], so both operands are multiplied where they lie.
* A bfloat16 dot runs on the bf16 kernels only when it asks for a float32 result and its left operand's
  contracting axis is the minor one; otherwise XLA:CPU upcasts both operands to float32 first, which is slower
  than float32 throughout (`python bench/bf16_matmul.py`). So the bf16 weight gradient contracts a row-major
  x^T (`row_major_transpose`) rather than autodiff's token axis.
* A fused elementwise gradient read through a transposing copy runs at a fraction of memory speed, so `gated`
  makes both of its gradients first and hands them on behind an optimization barrier.

Every function computes what its plain counterpart in `tempax.ops.plain` computes (tests/ops/test_ops.py);
the measurements behind each rule: `docs/measurements/performance-history.md`.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from tempax.ops.plain import activation, bf16_operands, f32_dot, gated as plain_gated, mixed_precision_project, rows


def row_major_transpose(x_mk: jax.Array) -> jax.Array:
    """x^T [K, M] materialised row-major, e.g. for a bf16 weight gradient's left operand.

    A plain `x.T` is folded into the dot (contracting axis major again: the float32-upcast path). Reversing an
    axis twice is the identity, but XLA:CPU's bf16 dot check runs before the simplifier, so it sees a row-major
    [K, M] operand; one transposing copy remains. tests/ops/cpu/test_matmul.py checks the compiled dots' types.
    The copy is made in float32 behind an optimization barrier, then cast back: XLA:CPU transposes bf16 elements
    several times slower than float32 ones, and without the barrier the simplifier drops the round trip and
    leaves a bf16 dot XLA cannot run.
    """
    x_km = jax.lax.optimization_barrier(jnp.flip(jnp.flip(x_mk.astype(jnp.float32).T, 1), 1))
    return x_km.astype(x_mk.dtype)


def row_major_weight_gradient(x_rows: jax.Array, g_rows: jax.Array) -> jax.Array:
    """d kernel = x^T g [in, out] in float32 from bf16 rows, x^T made row-major so the dot stays on the bf16
    kernels: [in, tokens] x [tokens, out], contracting the left operand's minor axis."""
    return f32_dot(row_major_transpose(x_rows), g_rows, 1, 0)


@jax.custom_vjp
def _project_float(x: jax.Array, kernel: jax.Array) -> jax.Array:
    return _project_float_fwd(x, kernel)[0]


def _project_float_fwd(x, kernel):
    return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ()))), (x, kernel)


def _project_float_bwd(residuals, g):
    x, kernel = residuals
    d_x = jax.lax.dot_general(g, kernel, (((g.ndim - 1,), (1,)), ((), ())))
    d_kernel = jax.lax.dot_general(rows(x), rows(g), (((0,), (0,)), ((), ())))
    return d_x, d_kernel


_project_float.defvjp(_project_float_fwd, _project_float_bwd)


def project(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """x [..., in] @ kernel [in, out] with the kernel's gradient made as x^T g over all tokens at once.

    bfloat16 x (`train.precision=bf16`): all three products are bf16 x bf16 with float32 accumulation
    (`mixed_precision_project`), the weight gradient from a row-major x^T (`row_major_weight_gradient`).
    """
    if bf16_operands(x, kernel):
        return mixed_precision_project(x, kernel, row_major_weight_gradient)
    return _project_float(x, kernel)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def gated(gate: jax.Array, up: jax.Array, activation_name: str) -> jax.Array:
    """act(gate) * up (`tempax.ops.plain.gated`), with its gradient made in the activations' own [..., M] layout.

    Plain autodiff gives the same numbers, but XLA:CPU fuses the elementwise gradient d/d gate = g * up *
    act'(gate) into the transposing copy the gate projection's weight gradient reads it through, and that fused,
    transposed loop runs at a small fraction of memory speed, many times slower than the same copy of d/d up
    (`bench/profile_step.py sft_full tiny`). Here the backward makes both gradients first and puts them behind an
    optimization barrier, so the transpose is a plain copy.
    """
    return plain_gated(gate, up, activation_name)


def _gated_fwd(gate, up, activation_name):
    return gated(gate, up, activation_name), (gate, up)


def _gated_bwd(activation_name, residuals, g):
    gate, up = residuals
    act, act_vjp = jax.vjp(activation(activation_name), gate)
    (d_gate,) = act_vjp(g * up)
    return jax.lax.optimization_barrier((d_gate, g * act))


gated.defvjp(_gated_fwd, _gated_bwd)
