"""Decode-step attention on JAX's paged attention kernel (`tempax.ops.tpu.decode`) in Pallas's TPU interpret mode,
against `tempax.ops.plain.attention` over the cache with the rows' prefixes as their visible keys."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tempax.ops import plain
from tempax.ops.tpu.decode import cache_attention, page_size, pages_per_block, paged_attention, supports
from tempax.ops.tpu.decode import unsupported_reason

BF16 = jnp.bfloat16
H, S = 64, 64
SCALE = H**-0.5


def _cache(b: int, n: int, k: int, seed: int = 0):
    """bf16 cache buffers [B, K, S, H] and float32 queries [B, 1, N, H]."""
    r = np.random.default_rng(seed)
    q = jnp.asarray(r.standard_normal((b, 1, n, H)), jnp.float32)
    kk, v = (jnp.asarray(r.standard_normal((b, k, S, H)), BF16) for _ in range(2))
    return q, kk, v


def _plain(q, k, v, lengths, cap):
    """The plain op over the whole buffer, slots at and past each row's length masked out (segment 0)."""
    segments = (jnp.arange(S)[None] < lengths[:, None]).astype(jnp.int32)
    mask = plain.attention_mask(jnp.array([S - 1]), jnp.arange(S), jnp.ones((q.shape[0], 1), jnp.int32), segments,
                                None)
    return plain.attention(q, k, v, mask, scale=SCALE, logit_cap=cap, kv_layout="bksh")


CASES = {
    # name: (N, K, lengths, logit_cap); lengths cover one slot, mid-page, mid-block, a full cache
    "gqa": (4, 2, [1, 37, 64], None),
    "one_kv_head": (4, 1, [64, 17, 5], None),
    "groups_of_eight": (16, 2, [33, 64, 2], None),
    "softcap": (4, 2, [40, 64, 9], 2.0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_cache_attention_matches_plain(name):
    """float32 queries over a bf16 cache: the kernel loads the bf16 keys and values exactly and computes in float32,
    so it agrees with the plain op on the same values upcast to float32 to float32 rounding (1e-5 of the largest
    entry); with bf16 queries it agrees with the plain op at bf16 (which also rounds p to bf16) within 2%. 16-slot
    pages, two to a block, so rows end mid-page and mid-block."""
    n, k, lengths, cap = CASES[name]
    q, kk, v = _cache(len(lengths), n, k)
    lengths = jnp.asarray(lengths, jnp.int32)
    run = jax.jit(lambda q, kk, v, lengths: cache_attention(q, kk, v, lengths=lengths, scale=SCALE, logit_cap=cap,
                                                            page=16, block_len=32, interpret=True))
    out = run(q, kk, v, lengths)
    ref = _plain(q, kk.astype(jnp.float32), v.astype(jnp.float32), lengths, cap)
    assert out.shape == q.shape and out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5 * float(jnp.max(jnp.abs(ref))), rtol=0)
    out16 = run(q.astype(BF16), kk, v, lengths)
    ref16 = _plain(q.astype(BF16), kk, v, lengths, cap)
    assert out16.dtype == BF16
    err = float(jnp.max(jnp.abs(out16.astype(jnp.float32) - ref16.astype(jnp.float32))))
    assert err <= 2e-2 * float(jnp.max(jnp.abs(ref16.astype(jnp.float32))))


def test_one_visible_slot_returns_its_value():
    """A row of length 1 sees slot 0 only: p = 1, so every query head returns its kv head's value at slot 0,
    exactly (bf16 values are exact in float32)."""
    q, kk, v = _cache(2, 4, 2, seed=3)
    out = cache_attention(q, kk, v, lengths=jnp.array([1, 1]), scale=SCALE, page=16, interpret=True)
    expect = jnp.repeat(v[:, :, 0], 2, axis=1).astype(jnp.float32)  # [B, N, H]: heads 0, 1 read kv head 0
    np.testing.assert_array_equal(np.asarray(out[:, 0]), np.asarray(expect))


def test_page_table_order_is_followed():
    """paged_attention over a shuffled page pool equals the plain op over the pages gathered back in each row's
    table order: the kernel reads row b's slot j from page page_indices[b, j // page]."""
    b, n, k, page, per_row = 2, 4, 2, 16, 4
    r = np.random.default_rng(4)
    pool_k, pool_v = (jnp.asarray(r.standard_normal((k, b * per_row + 3, page, H)), BF16) for _ in range(2))
    table = jnp.asarray(r.permutation(b * per_row + 3)[: b * per_row].reshape(b, per_row), jnp.int32)
    q = jnp.asarray(r.standard_normal((b, n, H)), jnp.float32)
    lengths = jnp.array([50, 21], jnp.int32)
    out = paged_attention(q, pool_k, pool_v, lengths, table, scale=SCALE, pages_per_compute_block=2, interpret=True)
    gather = lambda pool: pool[:, table].reshape(k, b, S, H).swapaxes(0, 1).astype(jnp.float32)  # noqa: E731
    ref = _plain(q[:, None], gather(pool_k), gather(pool_v), lengths, None)[:, 0]
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5 * float(jnp.max(jnp.abs(ref))), rtol=0)


def test_block_and_page_choice():
    """page_size: the largest of 128, 64, 32, 16 dividing S; pages_per_block: the largest divisor of the pages per
    row spanning at most block_len slots (1024 slots in pages of 128: 8 pages, 4 of them span 512)."""
    assert [page_size(s) for s in (1024, 192, 48, 40)] == [128, 64, 16, None]
    assert pages_per_block(8, 128, 512) == 4 and pages_per_block(6, 128, 512) == 3 and pages_per_block(5, 128) == 1


def test_unsupported_arguments_are_named():
    """What the kernel cannot express is refused with the reason, and cache_attention points to the plain op."""
    q = jax.ShapeDtypeStruct((2, 1, 4, 64), BF16)
    kv = jax.ShapeDtypeStruct((2, 2, 64, 64), BF16)
    assert supports(q, kv, kv) and supports(q, kv, kv, window=64)
    cases = {
        "sliding window": dict(window=63),
        "bfloat16 cache": dict(k=jax.ShapeDtypeStruct((2, 2, 64, 64), jnp.float32)),
        "multiple of 16": dict(k=jax.ShapeDtypeStruct((2, 2, 40, 64), BF16)),
        "one query token": dict(q=jax.ShapeDtypeStruct((2, 3, 4, 64), BF16)),
        "split evenly": dict(k=jax.ShapeDtypeStruct((2, 3, 64, 64), BF16)),
    }
    for words, change in cases.items():
        qq, kk = change.get("q", q), change.get("k", kv)
        reason = unsupported_reason(qq, kk, kk, window=change.get("window"))
        assert reason is not None and words in reason, (words, reason)
    with pytest.raises(ValueError, match="bfloat16 cache.*tempax.ops.plain.attention"):
        cache_attention(jnp.zeros((2, 1, 4, 64)), jnp.zeros((2, 2, 64, 64)), jnp.zeros((2, 2, 64, 64)),
                        lengths=jnp.array([1, 1]), scale=SCALE, interpret=True)
