"""The numerical ops the decoder and the losses are written with, and the one table that picks each op's
implementation for the backend it is traced on.

Each op has a definition in plain JAX (`tempax.ops.plain`, the one to read) and, where a backend runs some other
form of the same function faster, that backend's implementation: XLA:CPU's layouts and custom VJPs
(`tempax.ops.cpu`), JAX's Pallas TPU kernels (`tempax.ops.tpu`). `IMPLEMENTATIONS` is the table, one row per op
and one column per backend; `backend()` is the column traced now.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any, Literal

import jax

from tempax.ops import experts, fused_head, plain
from tempax.ops.cpu import attention as cpu_attention
from tempax.ops.cpu import experts as cpu_experts
from tempax.ops.cpu import lm_head as cpu_lm_head
from tempax.ops.cpu import matmul as cpu_matmul
from tempax.ops.plain import BF16, attention_mask, keep_kernel_dtype, softcap

__all__ = ["BF16", "Backend", "IMPLEMENTATIONS", "attention", "attention_mask", "backend", "expert_products",
           "fused_causal_lm_loss", "fused_token_logprobs", "gated", "implementation", "keep_kernel_dtype", "matmul",
           "projection_dot", "softcap", "table_on_left_in_decode", "tied_lm_head", "use_backend", "use_variant",
           "variant"]

Backend = Literal["cpu", "tpu", "gpu", "plain"]
BACKENDS: tuple[Backend, ...] = ("cpu", "tpu", "gpu", "plain")
_FORCED: contextvars.ContextVar[Backend | None] = contextvars.ContextVar("tempax_ops_backend", default=None)


def backend() -> Backend:
    """The table's column traced now: JAX's default backend ("cpu", "tpu", "gpu"; "plain" for any other), or what
    `use_backend` forces."""
    forced = _FORCED.get()
    if forced is not None:
        return forced
    name = jax.default_backend()
    return name if name in ("cpu", "tpu") else "gpu" if name in ("gpu", "cuda", "rocm") else "plain"


def variant() -> str:
    """"cpu" where XLA:CPU's implementations run, else "plain" (the name the CPU-only code paths check)."""
    return "cpu" if backend() == "cpu" else "plain"


@contextlib.contextmanager
def use_backend(name: Backend) -> Iterator[None]:
    """Trace with `name`'s column of the table inside the block, whatever the backend (tests compare the columns on
    one machine; the TPU column's kernels then run in Pallas interpret mode). jit keeps the programs it traced
    without regard to this choice, so JAX's caches are cleared on entry and on exit: no program traced under one
    column runs under another."""
    if name not in BACKENDS:
        raise ValueError(f"unknown ops backend {name!r}: one of {', '.join(BACKENDS)}")
    token = _FORCED.set(name)
    jax.clear_caches()
    try:
        yield
    finally:
        _FORCED.reset(token)
        jax.clear_caches()


def use_variant(name: str) -> contextlib.AbstractContextManager[None]:
    """`use_backend` under the older names: "cpu" or "plain"."""
    if name not in ("plain", "cpu"):
        raise ValueError(f"unknown ops variant {name!r}: 'plain' or 'cpu'")
    return use_backend(name)  # type: ignore[arg-type]


def _interpret() -> bool:
    """Pallas TPU kernels traced where JAX's backend is not a TPU (a forced TPU column in tests) run interpreted."""
    return jax.default_backend() != "tpu"


def table_on_left_in_decode() -> bool:
    """Whether decode steps should multiply a tied LM head with the table on the left (`tied_lm_head`): XLA:CPU
    streams the table faster that way in few-row products, a rule of its own; other backends' compilers choose
    their layouts themselves."""
    return backend() == "cpu"


# --------------------------------------------------------------------------------------------------------------


# The implementations, by op and backend (the table above `IMPLEMENTATIONS`). Each takes the op's full arguments.


def _projection_cpu(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, out_sharding=None):
    if plain.is_projection(lhs, rhs, dimension_numbers, precision, preferred_element_type, out_sharding):
        return cpu_matmul.project(lhs, rhs)
    return plain.projection_dot(lhs, rhs, dimension_numbers, precision, preferred_element_type, out_sharding)


def _attention_plain(q_btnh, k, v, mask, *, q_segments, k_segments, scale, logit_cap, window, window_on,
                     kv_heads_first):
    del q_segments, k_segments, window, window_on
    return plain.attention(q_btnh, k, v, mask(), scale=scale, logit_cap=logit_cap,
                           kv_layout="bksh" if kv_heads_first else "bskh")


def _attention_cpu(q_btnh, k, v, mask, *, kv_heads_first, scale, logit_cap, **rest):
    if not kv_heads_first and q_btnh.dtype == k.dtype == v.dtype == BF16:
        return cpu_attention.bf16_attention(q_btnh, k, v, mask(), scale=scale, logit_cap=logit_cap)  # training
    if kv_heads_first and q_btnh.shape[1] == 1:
        return cpu_attention.decode_step_attention(q_btnh, k, v, mask(), scale=scale, logit_cap=logit_cap)
    return _attention_plain(q_btnh, k, v, mask, kv_heads_first=kv_heads_first, scale=scale, logit_cap=logit_cap,
                            **rest)


def _attention_tpu(q_btnh, k, v, mask, *, q_segments, k_segments, scale, logit_cap, window, window_on,
                   kv_heads_first):
    """Splash attention for self-attention over [B, S, K, H] keys (training, scoring, a prefill into a fresh
    cache), where its shape limits allow; the plain op otherwise."""
    from tempax.ops.tpu import attention as tpu_attention

    if not kv_heads_first and tpu_attention.supports(q_btnh, k, v, window=window, logit_cap=logit_cap):
        return tpu_attention.attention(q_btnh, k, v, q_segments=q_segments, k_segments=k_segments, scale=scale,
                                       logit_cap=logit_cap, window=window, window_on=window_on,
                                       interpret=_interpret())
    return _attention_plain(q_btnh, k, v, mask, q_segments=q_segments, k_segments=k_segments, scale=scale,
                            logit_cap=logit_cap, window=window, window_on=window_on, kv_heads_first=kv_heads_first)


def _attention_gpu(q_btnh, k, v, mask, *, scale, logit_cap, kv_heads_first, **rest):
    """cuDNN's fused flash attention where it applies (no soft-capping, [B, S, K, H] keys)."""
    if logit_cap is None and not kv_heads_first:
        return plain.library_attention(q_btnh, k, v, mask(), scale=scale, implementation="cudnn")
    return _attention_plain(q_btnh, k, v, mask, scale=scale, logit_cap=logit_cap, kv_heads_first=kv_heads_first,
                            **rest)


def _tied_head_cpu(hidden, table, *, table_on_left):
    return cpu_lm_head.table_on_left(hidden, table) if table_on_left else plain.tied_lm_head(hidden, table)


def _tied_head_plain(hidden, table, *, table_on_left):
    del table_on_left  # other compilers choose their layouts themselves
    return plain.tied_lm_head(hidden, table)


def _experts_tpu(*args, **kwargs):
    """megablox's grouped products where their tiling applies (`tempax.ops.tpu.experts.unsupported_reason`)."""
    from tempax.ops.tpu import experts as tpu_experts

    x_td, gate_edi = args[0], args[3]
    rows = jax.ShapeDtypeStruct((x_td.shape[0] * args[1].shape[1], x_td.shape[1]), x_td.dtype)
    if tpu_experts.unsupported_reason(rows, gate_edi) is None:
        kwargs["grouped_product"] = tpu_experts.grouped_matmul
    return experts.expert_products(*args, **kwargs)


def _experts_cpu(*args, **kwargs):
    """Row tiles visited group by group (`tempax.ops.cpu.experts`): XLA:CPU's `ragged_dot` multiplies every row
    by every expert's kernel."""
    kwargs.setdefault("grouped_product", cpu_experts.grouped_matmul)
    return experts.expert_products(*args, **kwargs)


# The table, one row per op and one column per backend:
#
#   op               cpu                                    tpu                                gpu          plain
#   projection_dot   x^T g weight gradients (cpu.matmul)    plain                              plain        autodiff
#   gated            gradients behind a barrier             plain                              plain        autodiff
#   attention        bf16 training VJP; decode-step sum     splash attention (self-attention   cuDNN flash  einsum
#                                                           that `tpu.attention` supports)     (no softcap)
#   tied_lm_head     the table on the left in decode steps  plain                              plain        h @ E^T
#   lm_loss_forms    one exp pass for bf16; XLA:CPU layout  plain                              plain        head's layout
#   expert_products  row tiles visited group by group       megablox grouped matmul (shapes    ragged_dot   ragged_dot
#                    (cpu.experts)                          `tpu.experts` supports)
#
# An implementation that cannot take some arguments (a kernel's shape limits) computes them with the plain op, so
# every column computes the same function to float rounding (tests/ops/test_ops.py, tests/ops/tpu/); a kernel's TPU
# column runs on a CPU only in Pallas interpret mode, which is how its tests run.
IMPLEMENTATIONS: dict[str, dict[Backend, Callable[..., Any]]] = {
    "projection_dot": {"cpu": _projection_cpu, "tpu": plain.projection_dot, "gpu": plain.projection_dot,
                       "plain": plain.projection_dot},
    "gated": {"cpu": cpu_matmul.gated, "tpu": plain.gated, "gpu": plain.gated, "plain": plain.gated},
    "attention": {"cpu": _attention_cpu, "tpu": _attention_tpu, "gpu": _attention_gpu, "plain": _attention_plain},
    "tied_lm_head": {"cpu": _tied_head_cpu, "tpu": _tied_head_plain, "gpu": _tied_head_plain,
                     "plain": _tied_head_plain},
    "lm_loss_forms": {"cpu": lambda: cpu_lm_head.CPU_FORMS, "tpu": lambda: fused_head.PLAIN_FORMS,
                      "gpu": lambda: fused_head.PLAIN_FORMS, "plain": lambda: fused_head.PLAIN_FORMS},
    "expert_products": {"cpu": _experts_cpu, "tpu": _experts_tpu, "gpu": experts.expert_products,
                        "plain": experts.expert_products},
}


def implementation(op: str, on: Backend | None = None) -> Callable[..., Any]:
    """The implementation of `op` for backend `on` (default: `backend()`)."""
    return IMPLEMENTATIONS[op][on or backend()]


# --------------------------------------------------------------------------------------------------------------
# The ops


def projection_dot(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, out_sharding=None):
    """`lax.dot_general` for a layer's x [..., in] @ kernel [in, out] (`nnx.Linear(dot_general=...)`).

    bfloat16 x (`train.precision=bf16`): bf16 operands with float32 accumulation; y and d x in x's dtype, d kernel
    summed in float32 and returned in the kernel's (float32 for a float32 master left uncast by
    `keep_kernel_dtype`). On a CPU the kernel's gradient is made as x^T g over all tokens (`tempax.ops.cpu.matmul`).
    Products other than a projection (other dimension numbers, a requested output type or sharding) go to
    `lax.dot_general` unchanged.
    """
    return implementation("projection_dot")(lhs, rhs, dimension_numbers, precision, preferred_element_type,
                                            out_sharding)


def matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """x [..., in] @ kernel [in, out] as a projection (`projection_dot`): LoRA's adapter products."""
    return projection_dot(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


def gated(gate: jax.Array, up: jax.Array, activation: str) -> jax.Array:
    """act(gate) * up, the gated MLP's hidden state (act = "silu" or "gelu_tanh")."""
    return implementation("gated")(gate, up, activation)


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
    window_on: jax.Array | None = None,
    kv_heads_first: bool = False,
    implementation: str = "tempax",
    sinks: jax.Array | None = None,
) -> jax.Array:
    """Grouped-query attention with causal + segment (+ sliding-window) masking.

    q is [B, T, N, H]; k and v are [B, S, K, H], or [B, K, S, H] with `kv_heads_first` (the KV cache's layout).
    A query at index i in segment s sees key j when j <= i, segment(j) == s != 0 and (window) i - j < window
    (`attention_mask`; `window_on`, a traced bool, switches the window per layer of a scanned stack that mixes
    full and sliding layers). softmax(softcap(q k^T * scale)) in float32; fully masked query rows (padding) get a
    finite output. `implementation`: "tempax" takes the op table's choice for the backend; "xla" / "cudnn"
    (`ModelConfig.attention_impl`) name `jax.nn.dot_product_attention` for [B, S, K, H] keys (no soft-capping).
    `sinks` [N]: gpt-oss's per-head sink logits in the softmax's denominator (`tempax.ops.plain.attention_probs`);
    only the plain op has them, so they take it on every backend.
    """
    mask = lambda: attention_mask(q_index, k_index, q_segments, k_segments, window, window_on)  # noqa: E731
    if sinks is not None:
        return plain.attention(q_btnh, k, v, mask(), scale=scale, logit_cap=logit_cap,
                               kv_layout="bksh" if kv_heads_first else "bskh", sinks=sinks)
    if implementation != "tempax" and not kv_heads_first:
        return plain.library_attention(q_btnh, k, v, mask(), scale=scale, implementation=implementation)
    chosen = IMPLEMENTATIONS["attention"][backend()]
    # A kernel's self-attention assumes query i is key i; a cache's keys (or an offset) take the other forms.
    return chosen(q_btnh, k, v, mask, q_segments=q_segments, k_segments=k_segments, scale=scale,
                  logit_cap=logit_cap, window=window, window_on=window_on, kv_heads_first=kv_heads_first)


def tied_lm_head(hidden: jax.Array, table: jax.Array, *, table_on_left: bool = False) -> jax.Array:
    """Logits h @ E^T of a head tied to the embedding table E [vocab, hidden]; with `table_on_left` (decode steps,
    see `table_on_left_in_decode`) computed as E @ h^T on a CPU, the same logits."""
    return implementation("tied_lm_head")(hidden, table, table_on_left=table_on_left)


def expert_products(*args: Any, **kwargs: Any) -> jax.Array:
    """The routed experts of an MoE layer, `tempax.ops.experts.expert_products` (its docstring gives the formula
    and the arguments), with the grouped product the backend runs fastest."""
    return implementation("expert_products")(*args, **kwargs)


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
      chunk_len: at most this many sequence positions of each row per chunk (`fused_head.compacted_chunks`);
        None: the whole sequence.
      softcap: final-logit soft-cap (Gemma 2), or None.

    Returns:
      (loss, metrics) with the keys and meaning of `causal_lm_loss`'s metrics.
    """
    forms = implementation("lm_loss_forms")()
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
      chunk_len: at most this many masked positions of each row per chunk (`fused_head.compacted_chunks`);
        None: all at once.
      softcap: final-logit soft-cap (Gemma 2), or None.

    Returns:
      [batch, time] float32 log-probabilities, 0 where the mask is 0.
    """
    return fused_head.fused_token_logprobs(hidden_btd, head, targets_bt, mask_bt, vocab_major, chunk_len, softcap)
