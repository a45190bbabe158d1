"""The scanned decoder: one layer's code in every program whatever the depth, per-layer differences as data.

Compile time is measured by `bench/compile_time.py` (wall clock belongs in a bench); here the property behind it:
the lowered training step of a 16-layer model holds exactly as many operations as that of a 4-layer one."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tempax.models.cache import KVCache
from tempax.models.decoder import apply_rope, layer_constants, layer_kinds
from tempax.models.lora import LoraConfig, apply_lora, lora_filter
from tests.kit.models import random_ids, tiny_config, tiny_tempax_model


def _step_ops(num_layers: int, *, remat: str, lora: bool) -> int:
    """Operations in the lowered (StableHLO) program of loss + gradient for a model of `num_layers` layers."""
    model = tiny_tempax_model("gemma3", num_layers=num_layers, remat=remat,
                              layer_types=tuple("full" if i % 2 else "sliding" for i in range(num_layers)))
    if lora:
        model = apply_lora(model, LoraConfig(rank=4), rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, lora_filter if lora else nnx.Param, ...)
    tokens = jnp.asarray(random_ids((2, 8), seed=0))

    def loss(params, rest, tokens):
        logits, _ = nnx.merge(graphdef, params, rest)(tokens)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    text = jax.jit(jax.value_and_grad(loss)).lower(params, rest, tokens).as_text()
    return len(re.findall(r"^\s*(%\S+ = |\S+\.\S+ )", text, flags=re.M))


@pytest.mark.parametrize("remat,lora", [("none", False), ("full", True)])
def test_the_training_program_does_not_grow_with_depth(remat, lora):
    assert _step_ops(16, remat=remat, lora=lora) == _step_ops(4, remat=remat, lora=lora)


def test_layer_constants_follow_each_layers_kind():
    """tiny-gemma3 alternates sliding and full layers with a local and a global rotary base: the scanned
    constants say which layer slides, and each layer gets its kind's inverse frequencies."""
    model = tiny_tempax_model("gemma3")
    cfg = model.config
    inv_freq, sliding = layer_constants(cfg)
    kinds = layer_kinds(cfg)
    assert sliding is not None and list(np.asarray(sliding)) == [k == "sliding" for k in kinds]
    local = [i for i, k in enumerate(kinds) if k == "sliding"]
    full = [i for i, k in enumerate(kinds) if k == "full"]
    assert cfg.rope_local is not None and cfg.rope_local.theta != cfg.rope.theta
    np.testing.assert_array_equal(np.asarray(inv_freq[local[0]]), np.asarray(inv_freq[local[-1]]))
    assert not np.allclose(np.asarray(inv_freq[local[0]]), np.asarray(inv_freq[full[0]]))
    llama_freq, llama_sliding = layer_constants(tiny_tempax_model("llama").config)
    assert llama_sliding is None and llama_freq.shape[0] == 3


def test_a_decode_step_writes_only_its_slot_of_the_stacked_cache():
    """A one-token step into a stacked cache [L, B, K, S, H] changes each layer's slot at the write index and
    nothing else."""
    model = tiny_tempax_model("llama")
    cache = KVCache.init(model.config, 2, 6)
    _, cache = model(jnp.asarray(random_ids((2, 3), seed=1)), cache=cache, fresh_cache=True)
    before_k = np.asarray(cache.k)
    _, after = model(jnp.asarray(random_ids((2, 1), seed=2)), cache=cache)
    after_k = np.asarray(after.k)
    assert after_k.shape == (3, 2, model.config.num_kv_heads, 6, model.config.head_dim)
    changed = np.any(after_k != before_k, axis=(1, 2, 4))  # [L, S]
    assert changed[:, 3].all() and not changed[:, :3].any() and not changed[:, 4:].any()


def _decode_loop(num_layers: int, dtype: str) -> tuple[jax.stages.Lowered, tuple[int, ...]]:
    """Four one-token steps in a while loop, the stacked cache carried and donated, as the engine decodes; and the
    cache's [L, B, K, S, H] shape."""
    model = tiny_tempax_model("llama", num_layers=num_layers, dtype=dtype, param_dtype=dtype)
    graphdef, state = nnx.split(model)
    cache = KVCache.init(model.config, 2, 16)

    def decode(state, cache, tokens):
        model = nnx.merge(graphdef, state)

        def step(carry):
            cache, tokens, i = carry
            logits, cache = model(tokens[:, None], cache=cache, last_only=True)
            return cache, jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), i + 1

        return jax.lax.while_loop(lambda carry: carry[2] < 4, step, (cache, tokens, 0))

    lowered = jax.jit(decode, donate_argnums=1).lower(state, cache, jnp.zeros((2,), jnp.int32))
    return lowered, cache.k.shape


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_decode_loop_copies_no_stacked_cache(dtype):
    """XLA's compiled decode loop holds no copy of a [L, B, K, S, H] cache buffer: the layer scan only reads the
    stack and each step's slots are written into it in place after the scan. (Carrying the stack through the scan
    and writing each layer's slot into it made XLA copy the whole stack in every layer: 2 to 4 copies here.)"""
    lowered, shape = _decode_loop(3, dtype)
    text = lowered.compile().as_text()
    assert text.count(" while(") == 2  # the steps and, inside, the layers
    stack = re.escape("[" + ",".join(map(str, shape)) + "]")
    assert re.findall(rf"= \w+{stack}\S* copy\(", text) == []


def test_the_decode_program_does_not_grow_with_depth():
    def ops(num_layers: int) -> int:
        text = _decode_loop(num_layers, "float32")[0].as_text()
        return len(re.findall(r"^\s*(%\S+ = |\S+\.\S+ )", text, flags=re.M))

    assert ops(12) == ops(3)


def test_a_nope_layer_rotates_nothing_bit_for_bit():
    """tiny-smollm3's layer 3 has no rotary embedding (SmolLM3's NoPE): its scanned inverse frequencies are 0, and
    `apply_rope` with them returns its input exactly (cos 0 = 1, sin 0 = 0), in float32 and bfloat16, compiled, at
    positions up to 99999."""
    inv_freq, _ = layer_constants(tiny_config("smollm3"))
    assert not np.asarray(inv_freq[3]).any() and np.asarray(inv_freq[:3]).all()
    x = np.random.RandomState(0).standard_normal((2, 5, 4, 16)).astype(np.float32)
    positions = jnp.asarray([[0, 1, 2, 3, 99999]] * 2)
    for dtype in (jnp.float32, jnp.bfloat16):
        inputs = jnp.asarray(x, dtype)
        out = jax.jit(apply_rope)(inputs, positions, inv_freq[3])
        assert out.dtype == dtype
        np.testing.assert_array_equal(np.asarray(out.astype(jnp.float32)), np.asarray(inputs.astype(jnp.float32)))


def test_partial_rotary_turns_the_first_features_only():
    """Phi-3's partial rotary, by hand: head_dim 4, one inverse frequency pi/2 (rotary_dim 2), position 1. The pair
    (x0, x1) = (1, 2) turns by pi/2: (x0 cos - x1 sin, x1 cos + x0 sin) = (-2, 1); x2 = 3 and x3 = 4 pass through."""
    x = jnp.asarray([[[[1.0, 2.0, 3.0, 4.0]]]])  # [B=1, T=1, N=1, H=4]
    out = apply_rope(x, jnp.asarray([[1]]), jnp.asarray([np.pi / 2], jnp.float32))
    np.testing.assert_allclose(np.asarray(out)[0, 0, 0], [-2.0, 1.0, 3.0, 4.0], atol=1e-6)
    assert tiny_config("phi3").rotary_dim == 12 and layer_constants(tiny_config("phi3"))[0].shape == (3, 6)


@pytest.mark.needs_torch
@pytest.mark.parametrize("head_dim,truncate,factor", [(64, False, 32.0), (16, True, 8.0), (128, True, 0.5)])
def test_yarn_frequencies_and_attention_factor_are_transformers(head_dim, truncate, factor):
    """YaRN's inverse frequencies and its factor on cos and sin equal transformers' `_compute_yarn_parameters` (within
    float32 rounding) for gpt-oss's settings (no truncation, factor 32: mscale 0.1 ln 32 + 1 = 1.3466), rounded
    ramp ends, and a factor below 1 (mscale 1)."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from tempax.models.config import RopeConfig
    from tempax.models.decoder import rope_attention_factor, rope_inverse_frequencies

    params = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": factor, "beta_fast": 32.0, "beta_slow": 1.0,
              "truncate": truncate, "original_max_position_embeddings": 4096}
    hf = transformers.AutoConfig.for_model("gpt_oss", head_dim=head_dim, num_attention_heads=4, hidden_size=64,
                                           max_position_embeddings=int(4096 * max(factor, 1)),
                                           rope_parameters=params)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](hf)
    rope = RopeConfig(theta=150000.0, scaling="yarn", factor=factor, original_max_position_embeddings=4096,
                      truncate=truncate)
    np.testing.assert_allclose(np.asarray(rope_inverse_frequencies(rope, head_dim)), inv_freq.numpy(), rtol=1e-6)
    assert abs(rope_attention_factor(rope) - attention_factor) < 1e-12
