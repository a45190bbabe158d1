"""`ModelConfig.attention_impl`: `jax.nn.dot_product_attention` in place of tempax's einsum attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tempax.errors import ConfigError
from tempax.ops import attention, attention_mask
from tempax.ops.plain import library_attention
from tests.kit.models import tiny_config, tiny_tempax_model


@pytest.mark.parametrize("window", [None, 3])
def test_same_result_as_tempax_attention_with_packing_padding_and_windows(window):
    """Two rows, 9 query heads over 3 kv heads: row 0 packs segments 1, 1, 1, 2, 2, 2, 2, 0 (one padding position,
    masked out entirely), row 1 is one segment; causal, and a 3-key window in the second case."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((2, 8, 9, 16), (2, 8, 3, 16), (2, 8, 3, 16)))
    segments = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0], [1] * 8], jnp.int32)
    index = jnp.arange(8)
    where = dict(q_index=index, k_index=index, q_segments=segments, k_segments=segments, scale=0.25, window=window)
    ours = attention(q, k, v, **where)
    mask = attention_mask(index, index, segments, segments, window)
    theirs = library_attention(q, k, v, mask, scale=0.25, implementation="xla")
    assert np.isfinite(np.asarray(theirs)).all()
    np.testing.assert_allclose(np.asarray(theirs), np.asarray(ours), atol=1e-5, rtol=1e-5)


@pytest.mark.heavy
def test_a_model_trains_the_same_with_either_attention():
    """The tiny Llama with attention_impl='xla': the logits within 1e-5 of 'tempax', the gradient of their sum
    within 1e-4."""
    tokens = jnp.asarray(np.arange(24).reshape(2, 12) % 50 + 3, jnp.int32)

    def logits_and_grad(model):
        graphdef, state = nnx.split(model)

        def total(s):
            return nnx.merge(graphdef, s)(tokens)[0].sum()

        return nnx.merge(graphdef, state)(tokens)[0], jax.grad(total)(state)

    base = tiny_tempax_model("llama")
    graphdef, state = nnx.split(base)
    other = nnx.merge(nnx.graphdef(tiny_tempax_model("llama", attention_impl="xla")), state)
    (a, ga), (b, gb) = logits_and_grad(base), logits_and_grad(other)
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-5)
    for x, y in zip(jax.tree.leaves(gb), jax.tree.leaves(ga)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-4, rtol=1e-4)


def test_soft_capped_models_must_keep_tempax_attention():
    with pytest.raises(ConfigError, match="soft-capping"):
        tiny_config("gemma2").replace(attention_impl="xla")
    with pytest.raises(ConfigError, match="attention_impl 'flash'"):
        tiny_config("llama").replace(attention_impl="flash")


def test_attention_sinks_by_hand():
    """One query head over two keys (scale 1): scores q . k = 0 and ln 2, the head's sink ln 3. The softmax's
    denominator is e^0 + e^ln2 + e^ln3 = 1 + 2 + 3 = 6, so the weights are 1/6 and 2/6 (they sum to 1/2, the
    sink takes the rest) and the output is (1/6) v0 + (2/6) v1 = (1/6) [6, 0] + (1/3) [0, 3] = [1, 1]. A query
    that sees no key at all (padding) gives all its weight to the sink: output 0. Every backend's column takes the
    plain op, so the result is the same under the CPU's."""
    ln2, ln3 = float(np.log(2.0)), float(np.log(3.0))
    q = jnp.array([[[[1.0, 0.0]], [[1.0, 0.0]]]])  # [B=1, T=2, N=1, H=2]
    k = jnp.array([[[[0.0, 0.0]], [[ln2, 0.0]]]])  # [B=1, S=2, K=1, H=2]
    v = jnp.array([[[[6.0, 0.0]], [[0.0, 3.0]]]])
    index = jnp.arange(2)
    segments = jnp.array([[1, 1]], jnp.int32)
    out = attention(q, k, v, q_index=jnp.array([1, 1]), k_index=index, q_segments=jnp.array([[1, 0]], jnp.int32),
                    k_segments=segments, scale=1.0, sinks=jnp.array([ln3]))
    np.testing.assert_allclose(np.asarray(out)[0, 0, 0], [1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out)[0, 1, 0], [0.0, 0.0], atol=1e-30)


def test_attention_sinks_need_tempax_attention():
    with pytest.raises(ConfigError, match="attention sinks"):
        tiny_config("gpt_oss").replace(attention_impl="xla")
