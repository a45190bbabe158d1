"""Training and prefill attention on a TPU: JAX's splash attention kernel with tempax's masks.

Splash attention computes `tempax.ops.plain.attention` blockwise, the way FlashAttention does, so the [T, S] scores
never reach HBM and the blocks the static causal or window mask hides are skipped. `attention` keeps the formulas,
the paper it implements and where it differs from the plain op; `unsupported_reason` names what the kernel cannot
take, where the op table uses the plain op.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

# Splash lays key blocks along the 128 lanes of a TPU vector register and compares segment ids a block at a time,
# so sequence blocks (and therefore T) are multiples of 128.
LANES = 128
# head_dim is the minor axis of every q, k, v block; the families tempax runs use 64, 128 and 256.
HEAD_DIM_MULTIPLE = 64
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
DEFAULT_BLOCK = 512


def unsupported_reason(q_btnh: jax.Array, k_bskh: jax.Array, v_bskh: jax.Array, *, window: int | None = None,
                       logit_cap: float | None = None) -> str | None:
    """Why the splash kernel cannot compute this self-attention, or None when it can (S != T, T not a multiple of
    128, a head_dim that is not a multiple of 64, mixed or other dtypes); the op table uses the plain op there.
    Reads only shapes and dtypes (tracers and `jax.ShapeDtypeStruct`s work): q [B, T, N, H], k and v [B, S, K, H]."""
    if q_btnh.ndim != 4 or k_bskh.ndim != 4 or v_bskh.ndim != 4:
        return f"q, k and v must be [B, T, N, H] and [B, S, K, H]; got {q_btnh.shape}, {k_bskh.shape}, {v_bskh.shape}"
    b, t, n, h = q_btnh.shape
    if k_bskh.shape != v_bskh.shape:
        return f"k {k_bskh.shape} and v {v_bskh.shape} differ in shape"
    kb, s, kh, kd = k_bskh.shape
    if kb != b or kd != h:
        return f"k {k_bskh.shape} does not match q {q_btnh.shape} in batch or head_dim"
    if s != t:
        return f"self-attention only: {s} keys for {t} queries (the kernel's masks index keys as queries)"
    if t % LANES:
        return f"T = {t} is not a multiple of {LANES} (the kernel's sequence block)"
    if kh == 0 or n % kh:
        return f"{n} query heads do not split evenly over {kh} kv heads"
    if h % HEAD_DIM_MULTIPLE:
        return f"head_dim {h} is not a multiple of {HEAD_DIM_MULTIPLE}"
    dtypes = {jnp.dtype(q_btnh.dtype), jnp.dtype(k_bskh.dtype), jnp.dtype(v_bskh.dtype)}
    if len(dtypes) != 1 or not dtypes <= set(DTYPES):
        return f"q, k and v must share one dtype of float32 or bfloat16; got {sorted(d.name for d in dtypes)}"
    if window is not None and window < 1:
        return f"window {window} must be at least 1 (a query always sees itself)"
    if logit_cap is not None and logit_cap <= 0:
        return f"logit_cap {logit_cap} must be positive"
    return None


def supports(q_btnh: jax.Array, k_bskh: jax.Array, v_bskh: jax.Array, *, window: int | None = None,
             logit_cap: float | None = None) -> bool:
    """Whether `attention` applies to these arguments (`unsupported_reason` is None)."""
    return unsupported_reason(q_btnh, k_bskh, v_bskh, window=window, logit_cap=logit_cap) is None


def block_sizes(t: int, *, block: int = DEFAULT_BLOCK, fused_backward: bool = False) -> splash.BlockSizes:
    """Square tiles for a sequence of T (a multiple of 128): the largest of `block`, 256, 128 that divides T, for
    the forward pass and both backward kernels. `fused_backward` computes dq inside the dk/dv kernel (one pass
    over the blocks instead of two, at the cost of a [T / block, T, H] float32 dq buffer summed afterwards)."""
    size = next((c for c in (block, 256, LANES) if c <= t and t % c == 0), LANES)
    sizes = dict(block_q=size, block_kv=size, block_kv_compute=size, block_q_dkv=size, block_kv_dkv=size,
                 block_kv_dkv_compute=size, use_fused_bwd_kernel=fused_backward)
    if not fused_backward:
        sizes.update(block_q_dq=size, block_kv_dq=size)
    return splash.BlockSizes(**sizes)


def splash_kernel(t: int, n: int, window: int | None, logit_cap: float | None, sizes: splash.BlockSizes,
            interpret: bool) -> splash.SplashAttentionKernel:
    """The splash kernel for one [N, T, H] x [K, T, H] sequence. Its block maps come from the static causal (or
    causal window) mask, worked out on the host when a program is traced (splash keeps the last few in a cache of
    its own); the kernel object holds them as arrays of the trace, so it is built per trace, never kept."""
    if window is None or window >= t:  # a window as long as the sequence hides nothing the causal mask shows
        mask = splash_mask.CausalMask((t, t))
    else:  # j in [i - (window - 1), i]: i - j < window and j <= i
        mask = splash_mask.LocalMask((t, t), window_size=(window - 1, 0), offset=0)
    return splash.make_splash_mha(splash_mask.MultiHeadMask([mask] * n), block_sizes=sizes, head_shards=1,
                                  q_seq_shards=1, attn_logits_soft_cap=logit_cap, interpret=interpret)


def attention(q_btnh: jax.Array, k_bskh: jax.Array, v_bskh: jax.Array, *, q_segments: jax.Array,
              k_segments: jax.Array, scale: float, logit_cap: float | None = None, window: int | None = None,
              window_on: jax.Array | None = None, sizes: splash.BlockSizes | None = None,
              interpret: bool = False) -> jax.Array:
    """Causal, segment-masked (and sliding-window) grouped-query self-attention on the splash kernel.

    Args:
      q_btnh: [B, T, N, H] queries (query index i = position i of the row).
      k_bskh, v_bskh: [B, T, K, H] keys and values (K divides N; query head n reads kv head n // (N / K)).
      q_segments, k_segments: [B, T] int segment ids (packed rows; 0 is padding).
      scale: the score scale (usually head_dim ** -0.5).
      logit_cap: Gemma 2's soft-cap of the scores, or None.
      window: query i sees key j only when i - j < window, or None.
      window_on: a traced bool scalar saying whether `window` applies (a scanned layer stack that mixes full and
        sliding layers), or None for always. The window is part of the kernel's static mask, so both kernels are
        compiled and `lax.cond` runs the one the flag picks.
      sizes: the kernel's tiles (`block_sizes(T)` when None).
      interpret: run the kernel in Pallas's interpret mode (on a CPU).

    Returns:
      [B, T, N, H] in q's dtype: `tempax.ops.plain.attention` at every position of a nonzero segment; at padding
      positions, attention over the row's padding keys (below). Differentiable in q, k and v.

    The function is `tempax.ops.plain.attention` for self-attention (q_index = k_index = arange(T)):

        out[b, i, n] = sum_j p[b, n, i, j] v[b, j, n // G]     p[b, n, i, :] = softmax_j(masked(softcap(s)))
        s[b, n, i, j] = scale * q[b, i, n] . k[b, j, n // G]   (G = N / K query heads share a kv head)

    where query i sees key j when j <= i, segment(j) == segment(i) and (with a window) i - j < window, and
    softcap(s) = cap * tanh(s / cap) (Gemma 2). Splash attention ("sparse flash attention",
    `jax.experimental.pallas.ops.tpu.splash_attention`) computes it the way FlashAttention does (Dao et al., 2022,
    "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness"): blocks of queries against blocks
    of keys with a running max m and normaliser l, so the [T, S] scores never reach HBM,

        m' = max(m, rowmax(s_blk))    l' = e^(m - m') l + rowsum(e^(s_blk - m'))
        o' = e^(m - m') o + e^(s_blk - m') v_blk

    and out = o / l at the last block; the backward pass recomputes p from the saved log-sum-exp m + log l
    (dq, dk and dv kernels under the kernel's custom VJP). The causal and window masks are static, so the kernel skips
    every key block they hide entirely (about half the work for causal masks, more for short windows); the segment
    mask is compared per element from the segment ids.

    What we do differently from the plain op:

    * the scale is folded into q before the kernel (which has no scale argument): scale * (q . k) = (scale q) . k,
      exact for a power-of-two scale (head_dim 64, 256) and one rounding of q in its dtype otherwise;
    * padding positions (segment 0) come out as attention over the row's padding keys under the same causal and
      window rule, as if segment 0 were one more segment; the plain op gives them a uniform distribution over every
      key instead. Both are finite, and neither reaches a real position: a query of segment s != 0 never sees a key
      of segment 0, so every real position's output, and every gradient through a loss that ignores padding
      positions, is the plain op's;
    * scores, softmax and the p v product accumulate in float32 inside the kernel, as the plain op does; the output
      is in q's dtype.
    """
    reason = unsupported_reason(q_btnh, k_bskh, v_bskh, window=window, logit_cap=logit_cap)
    if reason is not None:
        raise ValueError(f"splash attention cannot take these arguments: {reason}; use tempax.ops.plain.attention")
    t, n = q_btnh.shape[1], q_btnh.shape[2]
    cap, sizes = None if logit_cap is None else float(logit_cap), sizes or block_sizes(t)
    heads_first = lambda x: x.swapaxes(1, 2)  # noqa: E731  [B, T, heads, H] -> [B, heads, T, H], the kernel's layout
    q = heads_first((q_btnh * jnp.asarray(scale, jnp.float32)).astype(q_btnh.dtype))
    k, v = heads_first(k_bskh), heads_first(v_bskh)
    segments = splash.SegmentIds(q=q_segments.astype(jnp.int32), kv=k_segments.astype(jnp.int32))

    def run(window: int | None) -> jax.Array:
        kernel = splash_kernel(t, n, window, cap, sizes, bool(interpret))
        return jax.vmap(kernel)(q, k, v, segments)  # one sequence per call

    if window is None or window_on is None:
        return heads_first(run(window))
    return heads_first(jax.lax.cond(jnp.asarray(window_on, bool), lambda: run(window), lambda: run(None)))
