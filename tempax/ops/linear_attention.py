"""Gated DeltaNet's pieces as functions of arrays: the causal depthwise convolution before it, and the gated
delta rule itself, chunked (prefill, training) and one token at a time (decoding).

Both respect packed sequences: a token whose `reset` flag is set starts from an empty state and sees no earlier
input through the convolution, so rows packed with several documents, or left-padded, give each document what it
would get alone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / sqrt(sum(x^2) + eps) over the last axis, in float32 (the form of the FLA kernels that Qwen3.5 uses)."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def causal_depthwise_conv(x_btc: jax.Array, weight_ck: jax.Array, taps_btk: jax.Array,
                          history_bkc: jax.Array | None = None) -> jax.Array:
    """y_t = sum_j w[:, K-1-j] * x_(t, j) over j = 0..K-1, a channel-wise causal convolution of kernel K, where
    x_(t, j) is the input `taps_btk`[b, t, j] points at: an index into the K-1 history inputs followed by x (the
    j-th input before x_t in its own sequence, padding skipped), or -1 for none (the term is left out).

    x_btc: [B, T, C]; weight_ck: [C, K] (a `Conv1d(groups=C)` weight without its middle axis); history_bkc:
    the K-1 inputs before x (a decoding cache's) or None (zeros). Returns [B, T, C] in x's dtype (no
    activation). Without padding or documents, taps[b, t, j] = K-1 + t - j: the plain causal convolution."""
    b, t, c = x_btc.shape
    k = weight_ck.shape[1]
    if history_bkc is None:
        history_bkc = jnp.zeros((b, k - 1, c), x_btc.dtype)
    inputs = jnp.concatenate([history_bkc.astype(x_btc.dtype), x_btc], axis=1).astype(jnp.float32)
    out = jnp.zeros((b, t, c), jnp.float32)
    for j in range(k):  # K is 4: four gathers of rows
        tap = taps_btk[:, :, j]
        term = jnp.take_along_axis(inputs, jnp.maximum(tap, 0)[:, :, None], axis=1)
        out = out + jnp.where((tap >= 0)[:, :, None], term * weight_ck[:, k - 1 - j].astype(jnp.float32), 0.0)
    return out.astype(x_btc.dtype)


def conv_taps(segments: jax.Array, history: int) -> tuple[jax.Array, jax.Array]:
    """Where each token's convolution inputs are: (taps [B, T, history + 1], the index of its j-th previous input
    of the same sequence in the `history` inputs followed by the call's T, padding (segment 0) skipped, or -1;
    last [B, history], the indices of the inputs a cache keeps after the call, oldest first: those of the row's
    last real token and the history - 1 before it, or -1).

    segments: [B, history + T], the history's segment (its sequence's, or -1 for none) then the call's."""
    b, n = segments.shape
    index = jnp.arange(n)
    real = segments != 0
    rank = jnp.cumsum(real, axis=1) - 1  # a real input's place among the row's real inputs
    rows = jnp.arange(b)[:, None]
    of_rank = jnp.full((b, n), -1, jnp.int32).at[rows, jnp.where(real, rank, n)].set(
        jnp.broadcast_to(index, (b, n)), mode="drop")

    def lag(j: int, places: jax.Array, own: jax.Array) -> jax.Array:
        before = places - j
        source = jnp.where(before >= 0, jnp.take_along_axis(of_rank, jnp.maximum(before, 0), axis=1), -1)
        source_segment = jnp.take_along_axis(segments, jnp.maximum(source, 0), axis=1)
        return jnp.where((source >= 0) & (source_segment == own), source, -1)

    call = slice(history, n)
    taps = jnp.stack([lag(j, rank[:, call], segments[:, call]) for j in range(history + 1)], axis=-1)
    taps = jnp.where(real[:, call, None], taps, -1)  # padding reads nothing (its output is never used)
    last_place = jnp.max(jnp.where(real, rank, -1), axis=1, keepdims=True)  # [B, 1]
    last_index = jnp.where(last_place >= 0, jnp.take_along_axis(of_rank, jnp.maximum(last_place, 0), axis=1), 0)
    last_segment = jnp.take_along_axis(segments, last_index, axis=1)
    kept = jnp.concatenate([lag(j, last_place, last_segment) for j in range(history - 1, -1, -1)], axis=1) \
        if history else jnp.zeros((b, 0), jnp.int32)
    return taps, kept


def _heads_to_value_heads(x: jax.Array, num_value_heads: int) -> jax.Array:
    """[B, T, Hk, d] -> [B, T, Hv, d]: each key head serves Hv / Hk consecutive value heads."""
    return jnp.repeat(x, num_value_heads // x.shape[2], axis=2)


def gated_delta_rule_recurrent(q: jax.Array, k: jax.Array, v: jax.Array, log_decay: jax.Array, beta: jax.Array,
                               reset: jax.Array, state: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule token by token (Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with
    Delta Rule", 2024, eq. 10), with q and k L2-normalised and q scaled by dk^-1/2:

        S_t = a_t S_{t-1} (I - b_t k_t k_t^T) + b_t k_t v_t^T,   a_t = exp(g_t) (0 when `reset`_t),
        o_t = S_t^T q_t.

    q, k: [B, T, Hk, dk]; v: [B, T, Hv, dv]; log_decay g, beta b: [B, T, Hv]; reset: [B, T] bool; state:
    [B, Hv, dk, dv] float32 before the first token (None: zeros). Returns (o [B, T, Hv, dv] float32, the state
    after the last token)."""
    hv = v.shape[2]
    q = l2_normalize(_heads_to_value_heads(q, hv)) * (q.shape[-1] ** -0.5)
    k = l2_normalize(_heads_to_value_heads(k, hv))
    v, log_decay, beta = v.astype(jnp.float32), log_decay.astype(jnp.float32), beta.astype(jnp.float32)
    if state is None:
        state = jnp.zeros((v.shape[0], hv, k.shape[-1], v.shape[-1]), jnp.float32)

    def step(s, xs):
        q_t, k_t, v_t, g_t, b_t, r_t = xs
        s = s * jnp.where(r_t[:, None], 0.0, jnp.exp(g_t))[:, :, None, None]
        remembered = jnp.einsum("bhkv,bhk->bhv", s, k_t)
        s = s + jnp.einsum("bhk,bhv->bhkv", k_t, (v_t - remembered) * b_t[:, :, None])
        return s, jnp.einsum("bhkv,bhk->bhv", s, q_t)

    time_major = [jnp.moveaxis(a, 1, 0) for a in (q, k, v, log_decay, beta, reset)]
    state, out = jax.lax.scan(step, state, time_major)
    return jnp.moveaxis(out, 0, 1), state


# The triangular inverse's products and its use: float32 products on every backend (a TPU's default precision rounds
# float32 operands to bfloat16, and the inverse's rounds of products would compound it).
_EXACT = jax.lax.Precision.HIGHEST


def _diagonal_blocks(x: jax.Array, size: int) -> jax.Array:
    """[..., n, n] -> [..., n / size, size, size]: the blocks on x's diagonal."""
    *batch, n, _ = x.shape
    m = n // size
    x = jnp.swapaxes(x.reshape(*batch, m, size, m, size), -3, -2).reshape(*batch, m * m, size, size)
    return x[..., :: m + 1, :, :]


@jax.custom_jvp
def unit_lower_inverse(strict: jax.Array) -> jax.Array:
    """(I + L)^-1 for L the strictly lower triangle of `strict` [..., C, C] (what is on and above its diagonal is
    ignored): the inverses of the 1 x 1 diagonal blocks (1) merged pairwise into those of 2 x 2, 4 x 4, ... blocks,
    [[A, 0], [M, B]]^-1 = [[A^-1, 0], [-B^-1 M A^-1, B^-1]]: log2 C rounds of batched products, the blocked form
    of forward substitution (no power series of L, whose terms grow and cancel in float32). The chunked delta
    rule's `T`.

    Not `jax.scipy.linalg.solve_triangular`: on CPU that is jaxlib's LAPACK kernel, which splits a batch of
    matrices over XLA:CPU's intra-op thread pool and blocks its own pool thread until the parts are done (jaxlib
    0.10's `ParallelBatchMap`). When as many such solves as the pool has threads run at once, as the independent
    solves of a training step's forward and backward passes can, every pool thread waits for work queued behind
    it and the step never ends (a 2-core host: the first step of `tempax sft` on tiny-qwen3-5 hung at 0% CPU)."""
    c = strict.shape[-1]
    size = 1 << max(c - 1, 0).bit_length()  # C rounded up to a power of two; the padding is an identity block
    lower = jnp.tril(strict, -1)
    if size != c:
        lower = jnp.pad(lower, [(0, 0)] * (lower.ndim - 2) + [(0, size - c)] * 2)
    batch = lower.shape[:-2]
    inverse = jnp.ones((*batch, size, 1, 1), lower.dtype)  # [..., blocks, s, s]: the diagonal blocks' inverses
    s = 1
    while s < size:
        pairs = inverse.reshape(*batch, size // (2 * s), 2, s, s)
        first, second = pairs[..., 0, :, :], pairs[..., 1, :, :]
        below = _diagonal_blocks(lower, 2 * s)[..., s:, :s]  # M of each diagonal block twice the size
        merged = -jnp.matmul(jnp.matmul(second, below, precision=_EXACT), first, precision=_EXACT)
        top = jnp.concatenate([first, jnp.zeros_like(first)], axis=-1)
        inverse = jnp.concatenate([top, jnp.concatenate([merged, second], axis=-1)], axis=-2)
        s *= 2
    return inverse.reshape(*batch, size, size)[..., :c, :c]


@unit_lower_inverse.defjvp
def _unit_lower_inverse_jvp(primals, tangents):
    """d(I + L)^-1 = -T dL T, T = (I + L)^-1: two products, linear in dL, so the backward pass is two products too
    (-T^T g T^T, kept to the strict lower triangle) and keeps T alone from the forward pass."""
    (strict,), (strict_dot,) = primals, tangents
    inverse = unit_lower_inverse(strict)
    dot = jnp.tril(strict_dot, -1).astype(inverse.dtype)
    return inverse, -jnp.matmul(jnp.matmul(inverse, dot, precision=_EXACT), inverse, precision=_EXACT)


def gated_delta_rule_chunked(q: jax.Array, k: jax.Array, v: jax.Array, log_decay: jax.Array, beta: jax.Array,
                             reset: jax.Array, state: jax.Array | None = None,
                             chunk_size: int = 64) -> tuple[jax.Array, jax.Array]:
    """`gated_delta_rule_recurrent`'s outputs and final state, computed a chunk of C tokens at a time (the chunked
    form of Gated DeltaNet, Yang et al. 2024, sec. 3.3, after DeltaNet's WY/UT representation, Yang et al.,
    "Parallelizing Linear Transformers with the Delta Rule over Sequence Length", 2024).

    Within a chunk, with c_i the cumulative log decay and D_ij = exp(c_i - c_j) for j <= i (0 across a reset):
    T = (I + strictly_lower(diag(b) K K^T * D))^-1, U = T diag(b) V, W = T diag(b) (K * exp(c)); then per chunk
    V' = U - W S, O = (Q * exp(c)) S + (Q K^T * D) V', S <- exp(c_last) S + (K * exp(c_last - c))^T V'. The
    terms reading S before the chunk are dropped after a reset in it. Matmuls of C x C blocks instead of T
    sequential outer products; the scan runs T / C steps."""
    bsz, t, _, dk = k.shape
    hv, dv = v.shape[2], v.shape[3]
    q = l2_normalize(_heads_to_value_heads(q, hv)) * (dk ** -0.5)
    k = l2_normalize(_heads_to_value_heads(k, hv))
    v, log_decay, beta = v.astype(jnp.float32), log_decay.astype(jnp.float32), beta.astype(jnp.float32)
    if state is None:
        state = jnp.zeros((bsz, hv, dk, dv), jnp.float32)
    pad = (-t) % chunk_size
    if pad:  # trailing tokens that change nothing: no input (b = 0, k = v = 0) and no decay (g = 0)
        widths = lambda a: [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2)  # noqa: E731
        q, k, v, log_decay, beta = (jnp.pad(a, widths(a)) for a in (q, k, v, log_decay, beta))
        reset = jnp.pad(reset, [(0, 0), (0, pad)])
    n = (t + pad) // chunk_size

    def chunks(a: jax.Array) -> jax.Array:  # [B, T, H, ...] -> [N, B, H, C, ...]
        a = a.reshape(bsz, n, chunk_size, *a.shape[2:])
        return jnp.moveaxis(jnp.moveaxis(a, 1, 0), 2, 3) if a.ndim == 5 else jnp.moveaxis(a, 1, 0).swapaxes(2, 3)

    q, k, v, g, b = chunks(q), chunks(k), chunks(v), chunks(log_decay), chunks(beta)
    epoch = jnp.cumsum(reset.reshape(bsz, n, chunk_size).astype(jnp.int32), axis=-1)  # resets so far in the chunk
    epoch = jnp.moveaxis(epoch, 1, 0)[:, :, None, :]  # [N, B, 1, C]
    cum = jnp.cumsum(g, axis=-1)  # [N, B, H, C]
    lower = jnp.tril(jnp.ones((chunk_size, chunk_size), bool))
    alive = lower & (epoch[..., :, None] == epoch[..., None, :])  # j <= i, no reset in (j, i]
    decay = jnp.where(alive, jnp.exp(jnp.where(alive, cum[..., :, None] - cum[..., None, :], 0.0)), 0.0)
    reads_before = epoch == 0  # [N, B, 1, C]: the state before the chunk reaches position i
    k_beta, v_beta = k * b[..., None], v * b[..., None]
    strictly = jnp.einsum("...ik,...jk->...ij", k_beta, k) * decay * (1.0 - jnp.eye(chunk_size))
    inverse = unit_lower_inverse(strictly)  # T
    apply = lambda rhs: jnp.matmul(inverse, rhs, precision=_EXACT)  # noqa: E731
    new_values = apply(v_beta)
    reads = jnp.where(reads_before, jnp.exp(cum), 0.0)[..., None]  # [N, B, H, C, 1]
    k_reads = apply(k_beta * reads)
    attn = jnp.einsum("...ik,...jk->...ij", q, k) * decay
    q_reads = q * reads
    last = cum[..., -1:]
    to_end = jnp.where(alive[..., -1, :], jnp.exp(last - cum), 0.0)[..., None]  # position i's weight at the end
    chunk_decay = jnp.where(reads_before[..., -1], jnp.exp(last[..., 0]), 0.0)[..., None, None]

    def step(s, xs):
        u, w, qr, a, kk, cd = xs
        v_new = u - jnp.einsum("bhck,bhkv->bhcv", w, s)
        out = jnp.einsum("bhck,bhkv->bhcv", qr, s) + jnp.einsum("bhij,bhjv->bhiv", a, v_new)
        s = s * cd + jnp.einsum("bhck,bhcv->bhkv", kk, v_new)
        return s, out

    state, out = jax.lax.scan(step, state, (new_values, k_reads, q_reads, attn, k * to_end, chunk_decay))
    out = jnp.moveaxis(out, 0, 1).swapaxes(2, 3).reshape(bsz, n * chunk_size, hv, dv)  # [B, T', Hv, dv]
    return out[:, :t], state
