"""Decode-step attention on a TPU: one query token per row over the KV cache, on JAX's paged attention kernel
(`jax.experimental.pallas.ops.tpu.paged_attention`). The function is `tempax.ops.plain.attention` for one query
per row whose visible keys are the row's first `length` cache slots:

    out[b, n] = sum_{j < length[b]} p[b, n, j] v[b, n // G, j]     p[b, n, :] = softmax_j(softcap(s[b, n, :]))
    s[b, n, j] = scale * q[b, n] . k[b, n // G, j]                 (G = N / K query heads share a kv head)

The kernel is FlashAttention's decode form (Dao et al., 2022, "FlashAttention: Fast and Memory-Efficient Exact
Attention with IO-Awareness"; paged KV blocks as in vLLM, Kwon et al., 2023, "Efficient Memory Management for
Large Language Model Serving with PagedAttention"): for each row and kv head it folds the row's pages, a block at
a time, into a running max, normaliser and output, stopping at the row's length, so a step reads only the slots
written so far. This docstring keeps the formula and the papers; `paged_attention` takes the kernel's own page
pool, `cache_attention` tempax's cache read in place, and `unsupported_reason` says what the kernel cannot take.

Where it differs from the plain op: q is taken in float32 with the scale folded in (the kernel has no scale
argument), scores, softmax and p v stay in float32 (the plain op rounds p to the values' dtype first), and a row
of length 0 comes out as zeros (the plain op: the mean of every value); the output is in q's dtype. Forward only:
the kernel has no gradient, and decoding needs none.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as paged_kernel

BF16 = jnp.dtype(jnp.bfloat16)
# A page is a [page, H] tile of one kv head; bf16 packs 16 rows into a TPU vreg's sublanes.
PAGE_MULTIPLE = 16
PAGE_SIZES = (128, 64, 32, 16)
DEFAULT_BLOCK_LEN = 512


def _interpreting(interpret: bool) -> contextlib.AbstractContextManager:
    """The paged kernel takes no `interpret` argument; Pallas's TPU interpret mode is switched on around its trace
    instead (it simulates the kernel's DMAs and semaphores on a CPU). The switch is part of jit's cache key, so
    programs traced with and without it are never mixed."""
    return pltpu.force_tpu_interpret_mode() if interpret else contextlib.nullcontext()


def pages_per_block(pages_per_row: int, page: int, block_len: int = DEFAULT_BLOCK_LEN) -> int:
    """How many pages the kernel folds in at a time: the largest divisor of `pages_per_row` spanning at most
    `block_len` slots (at least 1)."""
    return max(d for d in range(1, pages_per_row + 1) if pages_per_row % d == 0 and (d == 1 or d * page <= block_len))


def paged_attention(q_bnh: jax.Array, k_pages: jax.Array, v_pages: jax.Array, lengths: jax.Array,
                    page_indices: jax.Array, *, scale: float, logit_cap: float | None = None,
                    pages_per_compute_block: int | None = None, interpret: bool = False) -> jax.Array:
    """One query per row over a page pool: row b sees the first lengths[b] slots of its pages
    page_indices[b, 0], page_indices[b, 1], ... (in that order): the kernel's own layout, a pool shared by all
    rows and a page table, what a paged cache that allocates pages on demand holds.

    Args:
      q_bnh: [B, N, H] queries.
      k_pages, v_pages: [K, P, page, H] bfloat16 page pools (K divides N; query head n reads kv head n // (N / K)).
      lengths: [B] int, the visible slots of each row (0 <= length <= pages per row * page).
      page_indices: [B, pages per row] int, each row's pages in order.
      scale, logit_cap: as in `tempax.ops.plain.attention`.
      pages_per_compute_block: pages folded in at a time (`pages_per_block` when None; it divides the pages per
        row).
      interpret: run in Pallas's TPU interpret mode (on a CPU).

    Returns:
      [B, N, H] in q's dtype.
    """
    per_row = page_indices.shape[1]
    block = pages_per_compute_block or pages_per_block(per_row, k_pages.shape[2])
    q = q_bnh.astype(jnp.float32) * jnp.float32(scale)
    with _interpreting(interpret):
        out = paged_kernel(q, k_pages, v_pages, lengths.astype(jnp.int32), page_indices.astype(jnp.int32),
                           attn_logits_soft_cap=None if logit_cap is None else float(logit_cap),
                           pages_per_compute_block=block)
    return out.astype(q_bnh.dtype)


def page_size(s: int) -> int | None:
    """The page `cache_attention` reads a cache of S slots in: the largest of 128, 64, 32, 16 dividing S, or None."""
    return next((p for p in PAGE_SIZES if s % p == 0), None)


def unsupported_reason(q_b1nh: jax.Array, k_bksh: jax.Array, v_bksh: jax.Array, *, window: int | None = None,
                       logit_cap: float | None = None) -> str | None:
    """Why `cache_attention` cannot compute this decode step, or None when it can (shapes and dtypes only:
    whether the rows' visible keys are prefixes is the caller's to know). q [B, 1, N, H]; k, v [B, K, S, H].

    The kernel sees a prefix of each row: no segment ids and no per-row start, so a row whose padding sits before
    its tokens (the left-padded rows of a batch that shares one write index) cannot use it; the slot engine, which
    puts each prompt at slot 0, can (length = the slots written, the current token's included). So a sliding window
    shorter than the cache is refused (one as long as the cache hides nothing), and so is a cache in any dtype but
    bfloat16 (the kernel rounds keys and values to bfloat16 as it loads them). The op table falls back to the plain
    op wherever this names a reason."""
    if q_b1nh.ndim != 4 or k_bksh.ndim != 4 or k_bksh.shape != v_bksh.shape:
        return f"q must be [B, 1, N, H] and k, v one [B, K, S, H] shape; got {q_b1nh.shape}, {k_bksh.shape}, " \
               f"{v_bksh.shape}"
    b, t, n, h = q_b1nh.shape
    kb, kh, s, kd = k_bksh.shape
    if t != 1:
        return f"one query token per row (a decode step); got {t}"
    if kb != b or kd != h:
        return f"the cache {k_bksh.shape} does not match q {q_b1nh.shape} in batch or head_dim"
    if kh == 0 or n % kh:
        return f"{n} query heads do not split evenly over {kh} kv heads"
    if page_size(s) is None:
        return f"a cache of {s} slots is not a multiple of {PAGE_MULTIPLE} (the kernel's page)"
    if jnp.dtype(k_bksh.dtype) != BF16 or jnp.dtype(v_bksh.dtype) != BF16:
        return f"the kernel reads a bfloat16 cache; this one is {jnp.dtype(k_bksh.dtype).name}"
    if window is not None and window < s:
        return f"a sliding window ({window}) shorter than the cache ({s}): the kernel sees a prefix of every row"
    if logit_cap is not None and logit_cap <= 0:
        return f"logit_cap {logit_cap} must be positive"
    return None


def supports(q_b1nh: jax.Array, k_bksh: jax.Array, v_bksh: jax.Array, *, window: int | None = None,
             logit_cap: float | None = None) -> bool:
    """Whether `cache_attention` applies (`unsupported_reason` is None)."""
    return unsupported_reason(q_b1nh, k_bksh, v_bksh, window=window, logit_cap=logit_cap) is None


def cache_attention(q_b1nh: jax.Array, k_bksh: jax.Array, v_bksh: jax.Array, *, lengths: jax.Array, scale: float,
                    logit_cap: float | None = None, page: int | None = None,
                    block_len: int = DEFAULT_BLOCK_LEN, interpret: bool = False) -> jax.Array:
    """One decode step over tempax's KV cache, read in place: row b's query sees its first lengths[b] slots.

    Nothing is copied: the [B, K, S, H] buffer is read as a pool of [B * K * S / page, page, H] pages of a single
    kv head, and each (row, kv head) pair is one row of the kernel, with its G query heads and the pages of its own
    [S, H] block in order.

    Args:
      q_b1nh: [B, 1, N, H] the step's queries.
      k_bksh, v_bksh: [B, K, S, H] bfloat16 cache buffers (`tempax.models.cache.KVCache`), the step's key and
        value already written.
      lengths: [B] int, the slots each row sees (its written slots, the current one included); the caller
        guarantees that these are the row's only visible slots (segment ids 1 below the length, 0 from it on).
      scale, logit_cap: as in `tempax.ops.plain.attention`.
      page: the page the buffer is read in (`page_size(S)` when None; it divides S).
      block_len: slots folded in at a time, at most (`pages_per_block`).
      interpret: run in Pallas's TPU interpret mode (on a CPU).

    Returns:
      [B, 1, N, H] in q's dtype.
    """
    reason = unsupported_reason(q_b1nh, k_bksh, v_bksh, logit_cap=logit_cap)
    if reason is not None:
        raise ValueError(f"paged attention cannot take this decode step: {reason}; use tempax.ops.plain.attention")
    b, _, n, h = q_b1nh.shape
    kh, s = k_bksh.shape[1], k_bksh.shape[2]
    page = page or page_size(s)
    if s % page:
        raise ValueError(f"page {page} does not divide the cache's {s} slots")
    per_row = s // page
    # Row r = b * K + k of the kernel is (row b, kv head k): its pages are r * per_row, ..., its queries the G
    # heads that read kv head k (query head n = k * G + g, as `tempax.ops.plain.attention` groups them).
    pool = lambda x: x.reshape(1, b * kh * per_row, page, h)  # noqa: E731  a reshape of the buffer, no copy
    table = jnp.arange(b * kh * per_row, dtype=jnp.int32).reshape(b * kh, per_row)
    out = paged_attention(q_b1nh.reshape(b * kh, n // kh, h), pool(k_bksh), pool(v_bksh),
                          jnp.repeat(lengths.astype(jnp.int32), kh), table, scale=scale, logit_cap=logit_cap,
                          pages_per_compute_block=pages_per_block(per_row, page, block_len), interpret=interpret)
    return out.reshape(b, 1, n, h)
