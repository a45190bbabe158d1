"""The fused head + cross-entropy equals `causal_lm_loss` on the model's logits: values, metrics and gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from numpy.testing import assert_allclose

from tempax.algorithms.sft.fused import chunk_size
from tempax.algorithms.sft.trainer import make_sft_loss
from tempax.models.decoder import Decoder
from tempax.models.presets import PRESETS
from tests.train.helpers import random_batch


@pytest.mark.parametrize(
    "family, normalize, chunk_len",
    [("llama", "tokens", None), ("qwen2", "tokens", 4), ("gemma2", "sequences", 8), ("qwen3", "tokens", 6)],
    ids=["untied-whole", "tied-chunked", "softcap-sequences", "chunk-not-a-divisor"],
)
def test_fused_loss_matches_plain_loss(family, normalize, chunk_len):
    """tiny-llama has an untied head, tiny-qwen2 a tied one, tiny-gemma2 a final soft-cap (30)."""
    cfg = PRESETS[f"tiny-{family}"]
    cfg = cfg.replace(num_layers=1, layer_types=cfg.layer_types[:1])
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    batch = {k: jnp.asarray(v) for k, v in random_batch(3, 16, seed=2).items()}
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def run(loss_fn):
        def f(p):
            return loss_fn(nnx.merge(graphdef, p, rest), batch)
        (loss, metrics), grads = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
        return loss, metrics, grads

    plain = run(make_sft_loss(normalize))
    fused = run(make_sft_loss(normalize, fused=True, chunk_len=chunk_len))
    assert_allclose(fused[0], plain[0], rtol=1e-5)
    for key in ("nll_sum", "num_tokens", "num_sequences", "token_accuracy", "per_example_loss", "loss_weight"):
        assert_allclose(fused[1][key], plain[1][key], rtol=1e-5, atol=1e-6, err_msg=key)
    for (path, g_fused), g_plain in zip(jax.tree_util.tree_leaves_with_path(fused[2]), jax.tree.leaves(plain[2])):
        assert_allclose(g_fused, g_plain, atol=2e-6, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


def test_chunk_size_is_the_largest_divisor_not_above_the_request():
    assert chunk_size(256, 64) == 64
    assert chunk_size(16, 6) == 4  # 16 = 4 x 4; 5 and 6 do not divide it
    assert chunk_size(255, 64) == 51  # 255 = 3 x 5 x 17
    assert chunk_size(97, 64) == 97  # a prime length: one whole chunk rather than 97 single positions
    assert chunk_size(16, None) == chunk_size(16, 16) == chunk_size(16, 99) == 16
