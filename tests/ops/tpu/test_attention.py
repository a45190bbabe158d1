"""Splash attention (`tempax.ops.tpu.attention`) in Pallas interpret mode against `tempax.ops.plain.attention`:
values and gradients with respect to q, k and v, float32 and bfloat16, for every mask the families use."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tempax.ops import plain
from tempax.ops.tpu.attention import attention, block_sizes, supports, unsupported_reason

BF16 = jnp.bfloat16
H = 64  # scale 1/8, a power of two: folding it into q rounds nothing
SCALE = H**-0.5


def _segments(t: int, *rows: list[tuple[int, int]]) -> jax.Array:
    """[len(rows), t] segment ids from (segment, length) runs per row."""
    out = np.zeros((len(rows), t), np.int32)
    for b, runs in enumerate(rows):
        out[b] = np.concatenate([np.full(n, s, np.int32) for s, n in runs])
    return jnp.asarray(out)


T = 256
CASES = {
    # name: (T, N, K, segments [B, T], window, logit_cap, q multiplier)
    "causal": (T, 4, 2, _segments(T, [(1, T)], [(1, T)]), None, None, 1.0),
    "packed": (T, 4, 2, _segments(T, [(1, 100), (2, 100), (3, 56)], [(1, 130), (2, 126)]), None, None, 1.0),
    "left_padding": (T, 4, 2, _segments(T, [(0, 40), (1, 216)], [(0, 129), (1, 100), (2, 27)]), None, None, 1.0),
    # 3 blocks of 128: the window of 100 hides the block of queries 256.. against keys ..127 entirely
    "window": (384, 4, 2, _segments(384, [(1, 384)], [(0, 20), (1, 200), (2, 164)]), 100, None, 1.0),
    "gqa_one_kv_head": (T, 4, 1, _segments(T, [(1, 150), (2, 106)], [(0, 10), (1, 246)]), None, None, 1.0),
    # scores scaled up so that tanh(s / cap) is far from linear
    "softcap": (T, 4, 2, _segments(T, [(1, 100), (2, 156)], [(0, 40), (1, 216)]), None, 5.0, 4.0),
}


def _inputs(t: int, n: int, k: int, multiplier: float, seed: int = 0):
    r = np.random.default_rng(seed)
    b = 2
    q = jnp.asarray(r.standard_normal((b, t, n, H)) * multiplier, jnp.float32)
    kk, v = (jnp.asarray(r.standard_normal((b, t, k, H)), jnp.float32) for _ in range(2))
    return q, kk, v, jnp.asarray(r.standard_normal((b, t, n, H)), jnp.float32)


def _plain(q, k, v, segments, window, cap):
    index = jnp.arange(q.shape[1], dtype=jnp.int32)
    mask = plain.attention_mask(index, index, segments, segments, window)
    return plain.attention(q, k, v, mask, scale=SCALE, logit_cap=cap, kv_layout="bskh")


def _splash(q, k, v, segments, window, cap):
    # 128-blocks, so that the smallest cases already cover several blocks and the kernel's block skipping
    return attention(q, k, v, q_segments=segments, k_segments=segments, scale=SCALE, logit_cap=cap, window=window,
                     sizes=block_sizes(q.shape[1], block=128), interpret=True)


@partial(jax.jit, static_argnums=(0, 6, 7, 8))
def _value_and_grads(fn, q, k, v, c, segments, window, cap, padding_too=False):
    """out and d(sum(out * c))/d(q, k, v), the cotangent c zero at padding positions (a loss that ignores them)
    unless `padding_too`."""
    out, pullback = jax.vjp(lambda q, k, v: fn(q, k, v, segments, window, cap), q, k, v)
    real = (segments != 0)[:, :, None, None] | padding_too
    return out, pullback((c * real).astype(out.dtype))


def _rel_err(got: jax.Array, ref: jax.Array, real: jax.Array | None = None) -> float:
    """max |got - ref| (over real positions) / max |ref|."""
    diff = jnp.abs(got.astype(jnp.float32) - ref.astype(jnp.float32))
    if real is not None:
        diff = jnp.where(real, diff, 0.0)
    return float(jnp.max(diff)) / float(jnp.max(jnp.abs(ref.astype(jnp.float32))))


@pytest.mark.parametrize("name", list(CASES))
def test_float32_matches_plain(name):
    """float32: the kernel's blocked online softmax sums in another order than the plain softmax, so values and
    gradients agree to float32 rounding (1e-5 of the largest entry) at every position of a real segment."""
    t, n, k, segments, window, cap, mult = CASES[name]
    q, kk, v, c = _inputs(t, n, k, mult)
    out, grads = _value_and_grads(_splash, q, kk, v, c, segments, window, cap)
    ref, ref_grads = _value_and_grads(_plain, q, kk, v, c, segments, window, cap)
    real = (segments != 0)[:, :, None, None]
    assert out.dtype == jnp.float32 and out.shape == q.shape
    assert bool(jnp.all(jnp.isfinite(out)))
    assert _rel_err(out, ref, real) < 1e-5
    for got, want in zip(grads, ref_grads):
        assert got.shape == want.shape and got.dtype == jnp.float32
        assert _rel_err(got, want) < 1e-5, name


@pytest.mark.parametrize("name", list(CASES))
def test_bfloat16_matches_plain(name):
    """bfloat16: the kernel and the plain op take the same bf16 q, k, v; each rounds its output (and the plain op
    its probabilities, the kernel p and dS in the backward) to bf16, relative error 2^-9 per rounding, so values
    and gradients agree within 2% of the largest entry; the gradients come back in bf16."""
    t, n, k, segments, window, cap, mult = CASES[name]
    q, kk, v, c = (x.astype(BF16) for x in _inputs(t, n, k, mult))
    out, grads = _value_and_grads(_splash, q, kk, v, c, segments, window, cap)
    ref, ref_grads = _value_and_grads(_plain, q, kk, v, c, segments, window, cap)
    real = (segments != 0)[:, :, None, None]
    assert out.dtype == BF16
    assert _rel_err(out, ref, real) < 2e-2
    for got, want in zip(grads, ref_grads):
        assert got.dtype == BF16
        assert _rel_err(got, want) < 2e-2, name


def test_padding_positions_attend_to_padding():
    """Padding positions (segment 0) come out as attention among the row's padding keys, i.e. the plain op with
    segment 0 renamed to a segment of its own (here 9), values and gradients, with the cotangent nonzero at every
    position; the real positions are unchanged by the renaming."""
    t, n, k, segments, window, cap, mult = CASES["left_padding"]
    q, kk, v, c = _inputs(t, n, k, mult, seed=1)
    renamed = jnp.where(segments == 0, 9, segments)
    out, grads = _value_and_grads(_splash, q, kk, v, c, segments, window, cap, True)
    ref, ref_grads = _value_and_grads(_plain, q, kk, v, c, renamed, window, cap, True)
    assert _rel_err(out, ref) < 1e-5
    for got, want in zip(grads, ref_grads):
        assert _rel_err(got, want) < 1e-5


def test_hand_worked_positions():
    """Where a query sees only itself, p = exp(0) / 1 = 1 exactly, so the output is its kv head's value at that
    position, bit for bit: position 0 of row 1 (the first padding token: no earlier key) and position 100 of
    row 0 (the first token of segment 2). Position 1 of row 1 (padding) sees padding keys 0 and 1 with
    scores s_j = q . k_j / 8, so its output is (e^s0 v0 + e^s1 v1) / (e^s0 + e^s1)."""
    t, n, k, segments, window, cap, mult = CASES["left_padding"]
    segments = segments.at[0].set(_segments(T, [(1, 100), (2, 156)])[0])
    q, kk, v, _ = _inputs(t, n, k, mult, seed=2)
    out = _splash(q, kk, v, segments, None, None)
    group = n // k
    head_of = lambda b, i: jnp.repeat(v[b, i], group, axis=0)  # noqa: E731  query head h reads kv head h // group
    np.testing.assert_array_equal(np.asarray(out[1, 0]), np.asarray(head_of(1, 0)))
    np.testing.assert_array_equal(np.asarray(out[0, 100]), np.asarray(head_of(0, 100)))
    s = np.einsum("nh,jnh->nj", np.asarray(q[1, 1], np.float64),
                  np.repeat(np.asarray(kk[1, :2], np.float64), group, axis=1)) / 8
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    expect = np.einsum("nj,jnh->nh", p, np.repeat(np.asarray(v[1, :2], np.float64), group, axis=1))
    np.testing.assert_allclose(np.asarray(out[1, 1]), expect, rtol=1e-5, atol=1e-6)


def test_default_tiles_divide_the_sequence():
    """block_sizes picks the largest of 512, 256, 128 dividing T: 1024 -> 512, 768 -> 256, 384 -> 128."""
    assert [block_sizes(t).block_q for t in (1024, 768, 384, 128)] == [512, 256, 128, 128]
    assert block_sizes(1024, fused_backward=True).block_q_dq is None


def test_unsupported_arguments_are_named():
    """supports() is False, with the reason named, for what the kernel cannot take; attention() refuses them with
    the reason and the fallback."""
    q = jax.ShapeDtypeStruct((2, 256, 4, 64), jnp.float32)
    kv = jax.ShapeDtypeStruct((2, 256, 2, 64), jnp.float32)
    assert supports(q, kv, kv) and supports(q, kv, kv, window=1, logit_cap=30.0)
    cases = {
        "multiple of 128": (jax.ShapeDtypeStruct((2, 200, 4, 64), jnp.float32),
                            jax.ShapeDtypeStruct((2, 200, 2, 64), jnp.float32)),
        "self-attention only": (q, jax.ShapeDtypeStruct((2, 384, 2, 64), jnp.float32)),
        "head_dim 48": (jax.ShapeDtypeStruct((2, 256, 4, 48), jnp.float32),
                        jax.ShapeDtypeStruct((2, 256, 2, 48), jnp.float32)),
        "split evenly": (jax.ShapeDtypeStruct((2, 256, 4, 64), jnp.float32),
                         jax.ShapeDtypeStruct((2, 256, 3, 64), jnp.float32)),
        "one dtype": (jax.ShapeDtypeStruct((2, 256, 4, 64), BF16), kv),
    }
    for words, (qq, kk) in cases.items():
        reason = unsupported_reason(qq, kk, kk)
        assert reason is not None and words in reason, (words, reason)
        assert not supports(qq, kk, kk)
    assert "window 0" in unsupported_reason(q, kv, kv, window=0)
    segments = jnp.ones((2, 200), jnp.int32)
    with pytest.raises(ValueError, match="multiple of 128.*tempax.ops.plain.attention"):
        attention(jnp.zeros((2, 200, 4, 64)), jnp.zeros((2, 200, 2, 64)), jnp.zeros((2, 200, 2, 64)),
                  q_segments=segments, k_segments=segments, scale=SCALE, interpret=True)



@pytest.mark.heavy
def test_window_switched_per_layer_under_scan():
    """A scanned stack whose layers alternate sliding and full attention passes `window_on` traced: the layer with
    the flag on is the kernel with the window, the other the kernel without it, values and gradients (the flag
    picks one of two compiled kernels under `lax.cond`)."""
    t, n, k, segments, window, cap, mult = CASES["window"]
    q, kk, v, c = _inputs(t, n, k, mult, seed=5)

    def stack(q, kk, v, flags):
        def layer(total, window_on):
            out = attention(q, kk, v, q_segments=segments, k_segments=segments, scale=SCALE, window=window,
                            window_on=window_on, sizes=block_sizes(t, block=128), interpret=True)
            return total + jnp.sum(out * c), out
        return jax.lax.scan(layer, 0.0, flags)

    def unrolled(q, kk, v):
        outs = [_splash(q, kk, v, segments, w, None) for w in (window, None)]
        return sum(jnp.sum(o * c) for o in outs), jnp.stack(outs)

    flags = jnp.array([True, False])
    (_, outs), grads = jax.jit(stack)(q, kk, v, flags), jax.jit(jax.grad(lambda *a: stack(*a)[0], (0, 1, 2)))(
        q, kk, v, flags)
    (_, ref_outs), ref_grads = jax.jit(unrolled)(q, kk, v), jax.jit(jax.grad(lambda *a: unrolled(*a)[0], (0, 1, 2)))(
        q, kk, v)
    assert _rel_err(ref_outs[0], ref_outs[1]) > 1e-2  # the window changes the result
    assert _rel_err(outs, ref_outs) < 1e-6
    for got, want in zip(grads, ref_grads):
        assert _rel_err(got, want) < 1e-6
