"""The decode layout (`Decoder(..., decode_layout=True)`): the modules' logits, for every family, with adapters on
top and with a quantized base."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from numpy.testing import assert_allclose

from tempax.models.cache import KVCache
from tempax.ops.cpu.lm_head import table_on_left
from tempax.models.lora import LoraConfig, apply_lora, disable_adapters
from tests.kit.models import random_ids, tiny_tempax_model


def test_table_on_left_is_x_times_transposed_weight():
    x = jnp.asarray([[1.0, 2.0], [3.0, -1.0]])
    w_out_in = jnp.asarray([[1.0, 0.0], [0.5, 2.0], [-1.0, 1.0]])  # 3 outputs, 2 inputs
    # row 0: [1, 0.5 + 4, -1 + 2]; row 1: [3, 1.5 - 2, -3 - 1]
    assert_allclose(table_on_left(x, w_out_in), [[1.0, 4.5, 1.0], [3.0, -0.5, -4.0]])
    assert table_on_left(x[None], w_out_in).shape == (1, 2, 3)


def _decode_logits(model, use_layout: bool) -> np.ndarray:
    """Prefill 5 tokens of 2 rows, then 3 single-token decode steps; logits of every step [3, 2, V]."""
    cache = KVCache.init(model.config, 2, 16)
    _, cache = model(jnp.asarray(random_ids((2, 5), vocab=100, seed=1)), cache=cache)
    out = []
    for step in range(3):
        token = jnp.asarray(random_ids((2, 1), vocab=100, seed=10 + step))
        logits, cache = model(token, cache=cache, last_only=True, decode_layout=use_layout)
        out.append(np.asarray(logits[:, -1]))
    return np.stack(out)


@pytest.mark.parametrize(("family", "tied"), [("llama", True), ("llama", False), ("qwen2", None), ("qwen3", None),
                                              ("gemma2", None), ("gemma3", None)])
def test_decode_layout_gives_the_modules_logits(family, tied):
    """Every family's differences (q/k/v biases, qk-norm, tied or untied head, post-norms, soft-caps)."""
    changes = {} if tied is None else {"tie_word_embeddings": tied}
    model = tiny_tempax_model(family, seed=3, **changes)
    assert_allclose(_decode_logits(model, True), _decode_logits(model, False), atol=2e-5, rtol=1e-5)


@pytest.mark.heavy
def test_lora_adapters_apply_with_the_decode_layout():
    model = tiny_tempax_model("llama", seed=4, tie_word_embeddings=True)
    model = apply_lora(model, LoraConfig(rank=4, alpha=8), rngs=nnx.Rngs(5))
    # Non-zero B so the adapters change the output.
    for path, var in nnx.iter_graph(model):
        if isinstance(var, nnx.LoRAParam) and path[-1] == "lora_b":
            var.set_value(jax.random.normal(jax.random.key(len(path)), var.shape) * 0.1)
    with_adapters = _decode_logits(model, True)
    assert_allclose(with_adapters, _decode_logits(model, False), atol=2e-5, rtol=1e-5)
    with disable_adapters(model):
        without = _decode_logits(model, True)
        assert_allclose(without, _decode_logits(model, False), atol=2e-5, rtol=1e-5)
    assert np.abs(with_adapters - without).max() > 1e-3  # the adapters did change the output


@pytest.mark.heavy
def test_quantized_base_gives_the_modules_logits_with_the_decode_layout():
    model = apply_lora(
        tiny_tempax_model("llama", seed=6, tie_word_embeddings=True),
        LoraConfig(rank=4, quantize_base="nf4", block_size=32), rngs=nnx.Rngs(7),
    )
    assert_allclose(_decode_logits(model, True), _decode_logits(model, False), atol=2e-5, rtol=1e-5)
