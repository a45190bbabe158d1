"""The numerical ops the decoder and the losses are written with, and the one place a platform's variant is
chosen.

Each op has a default implementation in plain JAX (`tempax.ops.plain`, the definition to read), and where XLA:CPU
runs some other form of the same function faster, a CPU variant (`tempax.ops.cpu`: layouts, custom VJPs, bf16
forms, optimization barriers). The functions below choose between them when they are traced:

    op                       CPU variant, where it applies                               default
    projection_dot, matmul   x^T g weight gradients; bf16 from a row-major x^T           autodiff (bf16: mixed VJP)
    gated                    both gradients behind a barrier                             autodiff
    attention                bf16 q, k, v: heads-first bf16 custom VJP (training);       einsum; or
                             one query over the cache: multiply-and-sum (decode step)    jax.nn (attention_impl)
    tied_lm_head             the table on the left (decode steps)                        h @ E^T
    fused_causal_lm_loss     one exp pass for bf16; dL/dW summed in XLA:CPU's layout     the head's layout
    fused_token_logprobs     (one form: the plain one)                                   masked positions only

`variant()` is the rule: "cpu" where JAX's default backend is XLA:CPU, "plain" on every other backend (GPUs,
TPUs), whose compilers pick their own layouts. Both variants compute the same function, to float rounding
(tests/ops/test_ops.py compares them on one machine); on a CPU the CPU variant is what runs, so its results are
tempax's reference results there.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, Literal

import jax

from tempax.ops import fused_head, plain
from tempax.ops.cpu import attention as cpu_attention
from tempax.ops.cpu import lm_head as cpu_lm_head
from tempax.ops.cpu import matmul as cpu_matmul
from tempax.ops.plain import BF16, attention_mask, keep_kernel_dtype, softcap

__all__ = ["BF16", "Variant", "attention", "attention_mask", "fused_causal_lm_loss", "fused_token_logprobs", "gated",
           "keep_kernel_dtype", "matmul", "projection_dot", "softcap", "table_on_left_in_decode", "tied_lm_head",
           "use_variant", "variant"]

Variant = Literal["plain", "cpu"]
_FORCED: contextvars.ContextVar[Variant | None] = contextvars.ContextVar("tempax_ops_variant", default=None)


def variant() -> Variant:
    """The implementations traced now: "cpu" on XLA:CPU (JAX's default backend), "plain" on any other backend, or
    what `use_variant` forces."""
    forced = _FORCED.get()
    if forced is not None:
        return forced
    return "cpu" if jax.default_backend() == "cpu" else "plain"


@contextlib.contextmanager
def use_variant(name: Variant) -> Iterator[None]:
    """Trace with `name`'s implementations inside the block, whatever the backend (tests compare the variants on
    one machine). jit keeps the programs it traced without regard to this choice, so JAX's caches are cleared on
    entry and on exit: no program traced under one variant runs under the other."""
    if name not in ("plain", "cpu"):
        raise ValueError(f"unknown ops variant {name!r}: 'plain' or 'cpu'")
    token = _FORCED.set(name)
    jax.clear_caches()
    try:
        yield
    finally:
        _FORCED.reset(token)
        jax.clear_caches()


def table_on_left_in_decode() -> bool:
    """Whether decode steps should multiply a tied LM head with the table on the left (`tied_lm_head`): XLA:CPU
    streams the table faster that way in few-row products, a rule of its own; other backends' compilers choose
    their layouts themselves."""
    return variant() == "cpu"


# --------------------------------------------------------------------------------------------------------------


def projection_dot(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, out_sharding=None):
    """`lax.dot_general` for a layer's x [..., in] @ kernel [in, out] (`nnx.Linear(dot_general=...)`).

    bfloat16 x (`train.precision=bf16`): bf16 operands with float32 accumulation; y and d x in x's dtype, d kernel
    summed in float32 and returned in the kernel's (float32 for a float32 master left uncast by
    `keep_kernel_dtype`). On a CPU the kernel's gradient is made as x^T g over all tokens (`tempax.ops.cpu.matmul`).
    Products other than a projection (other dimension numbers, a requested output type or sharding) go to
    `lax.dot_general` unchanged.
    """
    if variant() == "cpu" and plain.is_projection(lhs, rhs, dimension_numbers, precision, preferred_element_type,
                                                   out_sharding):
        return cpu_matmul.project(lhs, rhs)
    return plain.projection_dot(lhs, rhs, dimension_numbers, precision, preferred_element_type, out_sharding)


def matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """x [..., in] @ kernel [in, out] as a projection (`projection_dot`): LoRA's adapter products."""
    return projection_dot(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


def gated(gate: jax.Array, up: jax.Array, activation: str) -> jax.Array:
    """act(gate) * up, the gated MLP's hidden state (act = "silu" or "gelu_tanh")."""
    if variant() == "cpu":
        return cpu_matmul.gated(gate, up, activation)
    return plain.gated(gate, up, activation)


def attention(
    q_btnh: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    q_index: jax.Array,
    k_index: jax.Array,
    q_segments: jax.Array,
    k_segments: jax.Array,
    scale: float,
    logit_cap: float | None = None,
    window: int | None = None,
    kv_heads_first: bool = False,
    implementation: str = "tempax",
) -> jax.Array:
    """Grouped-query attention with causal + segment (+ sliding-window) masking.

    q is [B, T, N, H]; k and v are [B, S, K, H], or [B, K, S, H] with `kv_heads_first` (the KV cache's layout).
    A query at index i in segment s sees key j when j <= i, segment(j) == s != 0 and (window) i - j < window
    (`attention_mask`). softmax(softcap(q k^T * scale)) in float32; fully masked query rows (padding) get a
    uniform, finite distribution. `implementation` ("tempax", or `ModelConfig.attention_impl`'s "xla" / "cudnn")
    picks `jax.nn.dot_product_attention` for [B, S, K, H] keys (no soft-capping); the cache's layout always takes
    tempax's.
    """
    mask = attention_mask(q_index, k_index, q_segments, k_segments, window)
    if implementation != "tempax" and not kv_heads_first:
        return plain.library_attention(q_btnh, k, v, mask, scale=scale, implementation=implementation)
    on_cpu = variant() == "cpu"
    if on_cpu and not kv_heads_first and q_btnh.dtype == k.dtype == v.dtype == BF16:
        return cpu_attention.bf16_attention(q_btnh, k, v, mask, scale=scale, logit_cap=logit_cap)  # training
    if on_cpu and kv_heads_first and q_btnh.shape[1] == 1:
        return cpu_attention.decode_step_attention(q_btnh, k, v, mask, scale=scale, logit_cap=logit_cap)
    return plain.attention(q_btnh, k, v, mask, scale=scale, logit_cap=logit_cap,
                           kv_layout="bksh" if kv_heads_first else "bskh")


def tied_lm_head(hidden: jax.Array, table: jax.Array, *, table_on_left: bool = False) -> jax.Array:
    """Logits h @ E^T of a head tied to the embedding table E [vocab, hidden]; with `table_on_left` (decode steps,
    see `table_on_left_in_decode`) computed as E @ h^T, the same logits."""
    if table_on_left:
        return cpu_lm_head.table_on_left(hidden, table)
    return plain.tied_lm_head(hidden, table)


def fused_causal_lm_loss(
    hidden_btd: jax.Array,
    head: jax.Array,
    targets_bt: jax.Array,
    loss_mask_bt: jax.Array,
    *,
    vocab_major: bool,
    normalize: str = "tokens",
    chunk_len: int | None = None,
    softcap: float | None = None,
) -> tuple[jax.Array, dict[str, Any]]:
    """`causal_lm_loss(hidden @ head, targets, loss_mask)` without materialising the logits: the LM head and the
    causal-LM cross-entropy fused over sequence chunks, with the gradient formed in the forward pass
    (`tempax.ops.fused_head` gives the formula). On a CPU the softmax and the head's gradient take XLA:CPU's forms
    (`tempax.ops.cpu.lm_head.CPU_FORMS`).

    Args:
      hidden_btd: [batch, time, hidden] final-norm hidden states.
      head: the LM head, [vocab, hidden] when `vocab_major` (a tied embedding table), else [hidden, vocab]; in
        hidden's dtype or a float32 master of bf16 hidden states (gradient returned in float32).
      targets_bt, loss_mask_bt: [batch, time] next-token targets and 0/1 mask.
      normalize: "tokens" (mean over supervised tokens) or "sequences" (mean of per-row means).
      chunk_len: at most this many sequence positions per chunk (`fused_head.chunk_size`); None: the whole
        sequence.
      softcap: final-logit soft-cap (Gemma 2), or None.

    Returns:
      (loss, metrics) with the keys and meaning of `causal_lm_loss`'s metrics.
    """
    forms = cpu_lm_head.CPU_FORMS if variant() == "cpu" else fused_head.PLAIN_FORMS
    return fused_head.fused_causal_lm_loss(forms, hidden_btd, head, targets_bt, loss_mask_bt, vocab_major, normalize,
                                           chunk_len, softcap)


def fused_token_logprobs(
    hidden_btd: jax.Array,
    head: jax.Array,
    targets_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    vocab_major: bool,
    chunk_len: int | None = None,
    softcap: float | None = None,
) -> jax.Array:
    """`token_logprobs(hidden @ head, targets)` at the positions of `mask_bt` (0 elsewhere), computed only there
    and without materialising the logits: the masked positions are gathered, the head applied in chunks of them,
    and d log p / d hidden formed in the forward pass (`tempax.ops.fused_head`).

    Args:
      hidden_btd: [batch, time, hidden] final-norm hidden states.
      head: the LM head, [vocab, hidden] when `vocab_major` (a tied embedding table), else [hidden, vocab]; in
        hidden's dtype or a float32 master of bf16 hidden states (gradient returned in the master's dtype).
      targets_bt, mask_bt: [batch, time] next-token targets and the 0/1 mask of the positions wanted.
      chunk_len: at most this many masked positions per chunk (`fused_head.chunk_size`); None: all at once.
      softcap: final-logit soft-cap (Gemma 2), or None.

    Returns:
      [batch, time] float32 log-probabilities, 0 where the mask is 0.
    """
    return fused_head.fused_token_logprobs(hidden_btd, head, targets_bt, mask_bt, vocab_major, chunk_len, softcap)
