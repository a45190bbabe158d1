"""The routed experts of a mixture-of-experts layer as one op: tokens sorted by expert, grouped matrix products.

`expert_products` computes every token's weighted sum over the experts its router chose without a loop over
experts and without a dense [tokens, experts, ...] product; its docstring holds the formula, the papers and the
method. The grouped product here is `jax.lax.ragged_dot` (plain JAX, lowered by XLA for any backend); a platform's
kernel is passed as `expert_products(grouped_product=...)` (`tempax.ops.tpu.experts`: megablox's Pallas kernel).
Every grouped product is built by `with_mixed_precision_vjp` (it says how bfloat16 rows meet float32 kernels).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from tempax.ops.plain import gated

ExpertActivation = Literal["silu", "gelu_tanh", "clamped_swiglu"]

EXPERT_ACTIVATIONS: tuple[str, ...] = ("silu", "gelu_tanh", "clamped_swiglu")


# --------------------------------------------------------------------------------------------------------------
# Sorting (token, slot) pairs by expert


class ExpertGroups(NamedTuple):
    """The T * k (token, slot) pairs of a routing, sorted by expert.

    Attributes:
      order: [T * k] int32; sorted row r holds the flat pair order[r] = t * k + j.
      token: [T * k] int32; the token t of sorted row r (order // k).
      expert: [T * k] int32; the expert of sorted row r (non-decreasing).
      group_sizes: [E] int32; how many rows each expert received (sums to T * k).
    """

    order: jax.Array
    token: jax.Array
    expert: jax.Array
    group_sizes: jax.Array


def group_by_expert(expert_ids_tk: jax.Array, num_experts: int) -> ExpertGroups:
    """Sorts the (token, slot) pairs of `expert_ids_tk` [T, k] by expert (stable: ties keep token order)."""
    k = expert_ids_tk.shape[-1]
    flat = expert_ids_tk.reshape(-1).astype(jnp.int32)
    order = jnp.argsort(flat, stable=True).astype(jnp.int32)
    group_sizes = jnp.zeros((num_experts,), jnp.int32).at[flat].add(1)
    return ExpertGroups(order=order, token=order // k, expert=flat[order], group_sizes=group_sizes)


def unsort(rows: jax.Array, order: jax.Array) -> jax.Array:
    """`rows` in sorted order back in flat (token, slot) order: out[order[r]] = rows[r] (a gather through the
    inverse permutation, so its gradient is a gather too)."""
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
    return rows[inverse]


# --------------------------------------------------------------------------------------------------------------
# The grouped matrix product

GroupedProduct = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def with_mixed_precision_vjp(
    forward: Callable[[jax.Array, jax.Array, jax.Array], jax.Array],
    backward: Callable[[jax.Array, jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]],
) -> GroupedProduct:
    """A grouped product (lhs [m, in], rhs [groups, in, out], group_sizes [groups] int32 summing to m) -> [m, out]
    in lhs's dtype, from a kernel's `forward(lhs, rhs, sizes)` and `backward(lhs, rhs, sizes, g) -> (d lhs,
    d rhs)`, each accumulating in float32.

    The kernel sees both operands in lhs's dtype (a float32 master against bf16 rows multiplies as bf16). Backward:
    d lhs = g rhs[g(r)]^T in lhs's dtype; d rhs[e] = lhs[rows of e]^T g[rows of e], returned in rhs's own dtype
    straight from the float32 accumulator. The group sizes get no gradient.

    Every grouped product is built here, by the rule `tempax.ops.plain.projection_dot` follows for a layer's
    projection: bfloat16 rows against float32 master kernels multiply as bf16 x bf16 with float32 accumulation, and
    the kernels' gradient (a sum over every row an expert received) is accumulated and returned in float32, never
    rounded to bfloat16 on the way.
    """

    @jax.custom_vjp
    def product(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
        return product_fwd(lhs, rhs, group_sizes)[0]

    def product_fwd(lhs, rhs, group_sizes):
        a, b = lhs, rhs.astype(lhs.dtype)
        # Zero-size arrays carry the primal dtypes into the backward pass (residuals must be arrays).
        return forward(a, b, group_sizes).astype(lhs.dtype), (a, b, group_sizes, jnp.zeros((0,), rhs.dtype))

    def product_bwd(residuals, g):
        a, b, group_sizes, rhs_like = residuals
        d_lhs, d_rhs = backward(a, b, group_sizes, g.astype(a.dtype))
        return d_lhs.astype(a.dtype), d_rhs.astype(rhs_like.dtype), None

    product.defvjp(product_fwd, product_bwd)
    return product


def _ragged_forward(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    return jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=jnp.float32)


def _ragged_backward(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, g: jax.Array):
    d_lhs = jax.lax.ragged_dot(g, rhs.swapaxes(1, 2), group_sizes, preferred_element_type=jnp.float32)
    # d rhs[e] = lhs[rows of e]^T g[rows of e]: the rows are the ragged, contracted axis; the groups form the output.
    numbers = jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(((0,), (0,)), ((), ())), lhs_ragged_dimensions=(0,), rhs_group_dimensions=())
    d_rhs = jax.lax.ragged_dot_general(lhs, g, group_sizes, numbers, preferred_element_type=jnp.float32)
    return d_lhs, d_rhs


_ragged_product = with_mixed_precision_vjp(_ragged_forward, _ragged_backward)


def grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """out[r] = lhs[r] @ rhs[g(r)] for rows sorted by group, with `jax.lax.ragged_dot`: lhs [m, in], rhs
    [groups, in, out], group_sizes [groups] int32 summing to m; [m, out] in lhs's dtype, gradients as
    `with_mixed_precision_vjp` gives them."""
    return _ragged_product(lhs, rhs, group_sizes)


class ExpertAdapter(NamedTuple):
    """A low-rank (LoRA) update of a stacked expert kernel W [E, in, out]: expert e computes with
    W_e + scale * A_e B_e, kept factored (`low_rank_update`).

    Attributes:
      a_eir: [E, in, r] the experts' A.
      b_ero: [E, r, out] the experts' B.
      scale: alpha / r (times 0 or 1 for a layer without the adapter), a float or a scalar array.
    """

    a_eir: jax.Array
    b_ero: jax.Array
    scale: jax.Array | float


def low_rank_update(rows: jax.Array, adapter: ExpertAdapter, group_sizes: jax.Array,
                    grouped_product: GroupedProduct = grouped_matmul) -> jax.Array:
    """scale * (rows[r] A_{g(r)}) B_{g(r)} for rows sorted by expert: two grouped products through the rank r,
    never the [E, in, out] product A B (LoRA, Hu et al. 2021, arXiv:2106.09685, per expert). [m, out] in rows'
    dtype."""
    h = grouped_product(rows, adapter.a_eir, group_sizes)
    return grouped_product(h, adapter.b_ero, group_sizes) * jnp.asarray(adapter.scale, rows.dtype)


# --------------------------------------------------------------------------------------------------------------
# The experts' activation and the whole op


def clamped_swiglu(gate: jax.Array, up: jax.Array, *, alpha: float, limit: float) -> jax.Array:
    """gpt-oss's expert activation: (clip(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit).

    The gate is clamped from above only, the linear half from both sides, and the linear half carries a + 1."""
    g = jnp.minimum(gate, limit)
    u = jnp.clip(up, -limit, limit)
    return (u + 1) * (g * jax.nn.sigmoid(alpha * g))


def expert_activation(gate: jax.Array, up: jax.Array, name: ExpertActivation, *, swiglu_alpha: float = 1.702,
                      swiglu_limit: float = 7.0) -> jax.Array:
    """act(gate, up), an expert's hidden state: silu(gate) * up (SwiGLU), gelu_tanh(gate) * up (GeGLU), or
    gpt-oss's `clamped_swiglu`."""
    if name == "clamped_swiglu":
        return clamped_swiglu(gate, up, alpha=swiglu_alpha, limit=swiglu_limit)
    if name in ("silu", "gelu_tanh"):
        return gated(gate, up, name)
    raise ValueError(f"expert activation {name!r} is not one of {EXPERT_ACTIVATIONS}")


def expert_products(
    x_td: jax.Array,
    expert_ids_tk: jax.Array,
    weights_tk: jax.Array,
    gate_edi: jax.Array,
    up_edi: jax.Array,
    down_eid: jax.Array,
    *,
    activation: ExpertActivation = "silu",
    gate_bias_ei: jax.Array | None = None,
    up_bias_ei: jax.Array | None = None,
    down_bias_ed: jax.Array | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    grouped_product: GroupedProduct = grouped_matmul,
    gate_up_adapter: ExpertAdapter | None = None,
    down_adapter: ExpertAdapter | None = None,
) -> jax.Array:
    """y_t = sum_j w[t, j] * (act(x_t G_e + b^G_e, x_t U_e + b^U_e) D_e + b^D_e), e = ids[t, j].

    Each token t goes to the k experts e = ids[t, j] its router chose, with weights w[t, j]. Expert e is a gated MLP
    with kernels G_e, U_e [hidden, inner], D_e [inner, hidden] and, for gpt-oss, biases; the layer's output is

        y_t = sum_j  w[t, j] * ( act(x_t G_e + b^G_e,  x_t U_e + b^U_e) D_e + b^D_e ),     e = ids[t, j]

    (Shazeer et al. 2017, arXiv:1701.06538; the dropless form of Gale et al. 2022, MegaBlocks, arXiv:2211.15841: no
    token is dropped and no expert has a capacity). Computed without a loop over experts and without a dense
    [tokens, experts, ...] product: the T * k (token, expert) pairs are sorted by expert, so each expert's rows are
    contiguous, and each of the three products is one grouped matrix product over the sorted rows,

        out[r] = lhs[r] @ rhs[g(r)],    g(r) = the group (expert) whose contiguous block holds row r,

    with the group sizes (how many rows each expert received) as data, so the program is the same whatever the
    routing. The rows are then put back in (token, slot) order and summed with the routing weights.

    Args:
      x_td: [tokens, hidden] the tokens, in the compute dtype.
      expert_ids_tk: [tokens, k] int, the experts each token was routed to (each in [0, E)).
      weights_tk: [tokens, k] the routing weights (float32 from the router).
      gate_edi, up_edi: [E, hidden, inner] the experts' gate and up kernels.
      down_eid: [E, inner, hidden] the experts' down kernels.
      activation: "silu", "gelu_tanh" or "clamped_swiglu" (gpt-oss; `swiglu_alpha`, `swiglu_limit`).
      gate_bias_ei, up_bias_ei: [E, inner], down_bias_ed: [E, hidden]: the experts' biases (gpt-oss), or None.
      grouped_product: the grouped product (`grouped_matmul`, ragged_dot; or a platform's kernel built with
        `with_mixed_precision_vjp`, e.g. `tempax.ops.tpu.experts.grouped_matmul`).
      gate_up_adapter: LoRA on the gate and up kernels together ([G_e | U_e] += scale * A_e B_e, B's first `inner`
        columns the gate's), or None; down_adapter: LoRA on the down kernels, or None (`ExpertAdapter`).

    Returns:
      [tokens, hidden] in x's dtype; the k experts' outputs are weighted and summed in float32.
    """
    num_tokens, k = expert_ids_tk.shape
    groups = group_by_expert(expert_ids_tk, gate_edi.shape[0])
    rows = x_td[groups.token]  # [T * k, hidden], sorted by expert

    def bias(b: jax.Array | None) -> jax.Array | float:
        return 0.0 if b is None else b.astype(x_td.dtype)[groups.expert]

    gate = grouped_product(rows, gate_edi, groups.group_sizes) + bias(gate_bias_ei)
    up = grouped_product(rows, up_edi, groups.group_sizes) + bias(up_bias_ei)
    if gate_up_adapter is not None:
        delta = low_rank_update(rows, gate_up_adapter, groups.group_sizes, grouped_product)
        gate, up = gate + delta[:, :gate.shape[1]], up + delta[:, gate.shape[1]:]
    hidden = expert_activation(gate, up, activation, swiglu_alpha=swiglu_alpha, swiglu_limit=swiglu_limit)
    hidden = hidden.astype(x_td.dtype)
    out = grouped_product(hidden, down_eid, groups.group_sizes) + bias(down_bias_ed)
    if down_adapter is not None:
        out = out + low_rank_update(hidden, down_adapter, groups.group_sizes, grouped_product)
    out_tkd = unsort(out, groups.order).reshape(num_tokens, k, -1)
    y = jnp.sum(out_tkd.astype(jnp.float32) * weights_tk.astype(jnp.float32)[..., None], axis=1)
    return y.astype(x_td.dtype)


__all__ = ["EXPERT_ACTIVATIONS", "ExpertActivation", "ExpertAdapter", "ExpertGroups", "GroupedProduct",
           "clamped_swiglu", "expert_activation", "expert_products", "group_by_expert", "grouped_matmul",
           "low_rank_update", "unsort", "with_mixed_precision_vjp"]
