"""Training attention at bfloat16 (`tempax.ops.cpu.attention`, reached through `tempax.ops.attention` with bf16
q, k, v): values and gradients against float32 autodiff of the float32 path, with every mask the families use,
and compiled products that keep bf16 operands (XLA:CPU's bf16 kernels, no float32 upcast)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tempax.ops import attention
from tests.ops.cpu.test_matmul import _dot_operand_types

BF16 = jnp.bfloat16
B, T, N, K, H = 2, 8, 4, 2, 8
# Row 0: two packed examples (5 + 3 tokens); row 1: two left-padding tokens, then one example of 6.
SEGMENTS = jnp.array([[1, 1, 1, 1, 1, 2, 2, 2], [0, 0, 1, 1, 1, 1, 1, 1]], jnp.int32)
INDEX = jnp.arange(T, dtype=jnp.int32)


def _inputs(seed: int = 0):
    r = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(r.standard_normal(s), BF16) for s in ((B, T, N, H), (B, T, K, H), (B, T, K, H)))
    return q, k, v, jnp.asarray(r.standard_normal((B, T, N, H)), jnp.float32)


def _loss(q, k, v, c, *, window=None, cap=None):
    out = attention(q, k, v, q_index=INDEX, k_index=INDEX, q_segments=SEGMENTS, k_segments=SEGMENTS,
                    scale=H**-0.5, logit_cap=cap, window=window)
    return jnp.sum(jnp.sin(out.astype(jnp.float32)) * c)


@pytest.mark.parametrize("window, cap", [(None, None), (3, None), (None, 1.5), (3, 1.5)])
def test_values_and_gradients_match_float32_autodiff(window, cap):
    """The same bf16-rounded q, k, v through the bf16 path and (upcast) through float32 autodiff: the bf16 path
    rounds the probabilities, d scores and outputs to bf16 (relative error <= 2^-9 each) and sums in float32, so
    the loss and every gradient are within 2% of the float32 ones (max abs difference over max abs value); the
    gradients come back in bf16, and padding queries (segment 0) get exactly zero d q in both."""
    q, k, v, c = _inputs()
    f32 = [a.astype(jnp.float32) for a in (q, k, v)]
    loss = jax.value_and_grad(partial(_loss, window=window, cap=cap), (0, 1, 2))
    (loss32, grads32), (loss16, grads16) = loss(*f32, c), loss(q, k, v, c)
    assert abs(float(loss16) - float(loss32)) <= 2e-2 * abs(float(loss32))
    for ref, got in zip(grads32, grads16):
        assert got.dtype == BF16 and got.shape == ref.shape
        err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - ref)))
        assert err <= 2e-2 * float(jnp.max(jnp.abs(ref))), (err, float(jnp.max(jnp.abs(ref))))
    assert float(jnp.max(jnp.abs(grads16[0][1, :2]))) == 0.0 == float(jnp.max(jnp.abs(grads32[0][1, :2])))


def test_masked_keys_get_no_weight():
    """A query at index 5 of row 0 starts segment 2, so it sees only itself: its output is v at index 5 (its kv
    head's), whatever the other keys hold, exactly up to the bf16 rounding of p = 1 (exact) times v."""
    q, k, v, _ = _inputs(1)
    out = attention(q, k, v, q_index=INDEX, k_index=INDEX, q_segments=SEGMENTS, k_segments=SEGMENTS, scale=H**-0.5)
    expect = jnp.repeat(v[0, 5], N // K, axis=0)  # [N, H]: query heads 0, 1 read kv head 0; 2, 3 read kv head 1
    np.testing.assert_array_equal(np.asarray(out[0, 5], np.float32), np.asarray(expect, np.float32))


def test_all_products_compile_to_bf16_dots():
    """Forward and backward (q k^T, p v, d p, d q, d k, d v; soft-capped, so the scores are also recomputed)
    compile to dots whose operands are all bf16. The float32-cotangent backward of the cache layout's einsums
    (`kv_heads_first`, the inference path this change leaves alone) does not, which is what the custom VJP changes."""
    q, k, v, c = _inputs()
    dots = _dot_operand_types(jax.grad(partial(_loss, window=3, cap=1.5), (0, 1, 2)), q, k, v, c)
    assert len(dots) >= 6 and all(d == ("bf16", "bf16") for d in dots), dots

    def cache_layout_loss(q, k, v):
        out = attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), q_index=INDEX, k_index=INDEX, q_segments=SEGMENTS,
                        k_segments=SEGMENTS, scale=H**-0.5, kv_heads_first=True)
        return jnp.sum(jnp.sin(out.astype(jnp.float32)) * c)

    assert any(d != ("bf16", "bf16") for d in _dot_operand_types(jax.grad(cache_layout_loss, (0, 1, 2)), q, k, v))


@pytest.mark.heavy
def test_whole_gemma2_gradients_at_bf16_track_float32():
    """The tiny Gemma 2 (logit soft-cap 50, sliding window 4 on layers 0 and 2, GQA 4/2) on the packed and padded
    rows above: the loss at bf16 compute (attention through the custom VJP,
    float32 master weights) is within 1% of float32's and every weight's gradient within 5% in relative L2 norm
    (bf16 rounds activations to 8 significant bits; measured: loss 1.2e-4, gradients at most 2.4%)."""
    from flax import nnx

    from tempax.train.state import training_view
    from tests.kit.models import random_ids, tiny_tempax_model

    model = tiny_tempax_model("gemma2")
    tokens = jnp.asarray(random_ids((B, T)))

    def loss_and_grads(precision):
        view = training_view(model, precision=precision)

        def loss(m):
            logits, _ = m(tokens, segment_ids=SEGMENTS)
            logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
            picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
            return -jnp.sum(picked * (SEGMENTS[:, 1:] != 0)) / jnp.sum(SEGMENTS[:, 1:] != 0)

        value, grads = nnx.jit(nnx.value_and_grad(loss))(view)
        return float(value), jax.tree.leaves(nnx.to_pure_dict(grads))

    (l32, g32), (l16, g16) = loss_and_grads("fp32"), loss_and_grads("bf16")
    assert abs(l16 - l32) <= 1e-2 * abs(l32)
    errs = [float(jnp.linalg.norm(got - ref) / jnp.linalg.norm(ref)) for ref, got in zip(g32, g16)]
    assert all(got.dtype == jnp.float32 for got in g16)
    assert max(errs) <= 5e-2, errs
