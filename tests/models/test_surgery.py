"""Layer pruning: keeping every layer reproduces the model; keeping a subset copies exactly those layers."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from numpy.testing import assert_allclose, assert_array_equal

from tempax.errors import ConfigError
from tempax.models.decoder import layer_kinds
from tempax.models.lora import LoraConfig, apply_lora
from tempax.models.surgery import keep_layers, layer_selection
from tests.kit.models import random_ids, tiny_tempax_model


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_keeping_all_layers_equals_the_model(family):
    """Same logits to float precision (the same arrays, so exactly), for a family with per-layer sliding windows."""
    model = tiny_tempax_model(family, seed=3)
    tokens = jnp.asarray(random_ids((2, 9)))
    pruned = keep_layers(model, range(model.config.num_layers))
    assert pruned.config == model.config
    assert_allclose(pruned(tokens)[0], model(tokens)[0], rtol=0, atol=0)


def test_kept_layers_are_the_chosen_ones_with_their_attention_kind():
    """gemma3 tiny has layer types (sliding, full, sliding, full); keeping [1, 2] gives (full, sliding), and the
    new layer j holds old layer [1, 2][j]'s weights; embeddings and final norm are the same arrays."""
    model = tiny_tempax_model("gemma3", seed=1)
    pruned = keep_layers(model, [1, 2])
    assert pruned.config.num_layers == 2
    assert pruned.config.layer_types == ("full", "sliding")
    assert layer_kinds(pruned.config) == ("full", "sliding")
    for j, i in enumerate([1, 2]):
        assert_array_equal(pruned.layers.mlp.up_proj.kernel[...][j], model.layers.mlp.up_proj.kernel[...][i])
        assert_array_equal(pruned.layers.self_attn.q_proj.kernel[...][j],
                           model.layers.self_attn.q_proj.kernel[...][i])
    assert_array_equal(pruned.embed_tokens.embedding[...], model.embed_tokens.embedding[...])
    assert_array_equal(pruned.norm.weight[...], model.norm.weight[...])
    assert model.config.num_layers == 4  # the original is unchanged
    assert np.isfinite(np.asarray(pruned(jnp.asarray(random_ids((1, 5))))[0])).all()


def test_layer_selection_spellings_and_errors():
    assert layer_selection("every 3", 30) == tuple(range(0, 30, 3))
    assert len(layer_selection("every 3", 30)) == 10
    assert layer_selection("first 2", 5) == (0, 1)
    assert layer_selection("last 2", 5) == (3, 4)
    assert layer_selection("all", 3) == (0, 1, 2)
    assert layer_selection([0, -1], 4) == (0, 3)
    with pytest.raises(ConfigError, match="out of range"):
        layer_selection([0, 7], 4)
    with pytest.raises(ConfigError, match="twice"):
        layer_selection([1, 1], 4)
    with pytest.raises(ConfigError, match="not a layer selection"):
        layer_selection("every third", 4)
    with pytest.raises(ConfigError, match="no layer"):
        layer_selection([], 4)


def test_adapters_are_refused():
    model = apply_lora(tiny_tempax_model(), LoraConfig(rank=2), rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="plain decoder"):
        keep_layers(model, [0])
