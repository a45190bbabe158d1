"""RMSNorm (`tempax.models.norm`) against numbers worked out by hand."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from tempax.models.norm import RMSNorm, rms_normalized


def test_rms_normalized_divides_by_the_root_mean_square():
    """x = [3, 4]: mean(x^2) = (9 + 16) / 2 = 12.5; with eps 0.5, sqrt(13) = 3.6056 -> [0.83205, 1.10940].
    x = [1, -1]: mean 1, eps 0 -> unchanged."""
    y = rms_normalized(jnp.asarray([[3.0, 4.0], [1.0, -1.0]], jnp.bfloat16), 0.5)
    assert y.dtype == jnp.float32  # computed in float32 whatever the input
    np.testing.assert_allclose(np.asarray(y[0]), [3 / 13 ** 0.5, 4 / 13 ** 0.5], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(rms_normalized(jnp.asarray([1.0, -1.0]), 0.0)), [1.0, -1.0])


def test_weight_scales_or_offsets_and_output_keeps_the_input_dtype():
    """x = [3, 4], eps 0.5 -> [0.83205, 1.10940]; weight [2, 0.5] -> [1.66410, 0.55470]; Gemma's offset,
    (1 + w) with w = [1, -0.5], gives the same; a fresh norm is the identity scale (w = 1, or 0 with offset)."""
    x = jnp.asarray([3.0, 4.0])
    with nnx.use_eager_sharding(False):  # names only, as the decoder builds its layers
        plain = RMSNorm(2, eps=0.5, offset=False, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
        gemma = RMSNorm(2, eps=0.5, offset=True, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(np.asarray(plain(x)), np.asarray(gemma(x)), rtol=1e-7)
    np.testing.assert_allclose(np.asarray(plain(x)), [3 / 13 ** 0.5, 4 / 13 ** 0.5], rtol=1e-6)
    plain.weight[...] = jnp.asarray([2.0, 0.5])
    gemma.weight[...] = jnp.asarray([1.0, -0.5])
    expected = [2 * 3 / 13 ** 0.5, 0.5 * 4 / 13 ** 0.5]
    np.testing.assert_allclose(np.asarray(plain(x)), expected, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gemma(x)), expected, rtol=1e-6)
    assert plain(x.astype(jnp.bfloat16)).dtype == jnp.bfloat16
