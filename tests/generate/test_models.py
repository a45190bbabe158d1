"""The sampler on adapted and sharded models: LoRA / QLoRA without merging, and parameters on 8 devices."""

from __future__ import annotations

import functools
import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from numpy.testing import assert_allclose, assert_array_equal

from tempax.generate import generate
from tempax.models.lora import LoraConfig, apply_lora, lora_layers
from tempax.parallel import make_mesh, shard_params, use_mesh
from tests.generate.test_generate import GREEDY, PROMPTS, SAMPLED


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, ids):
    return nnx.merge(graphdef, state)(ids)[0][0]


@pytest.mark.parametrize("quantize_base", [None, "nf4"], ids=["lora", "qlora"])
def test_generation_uses_adapters_without_merging(model, quantize_base):
    """Adapters with non-zero B (and, for QLoRA, an NF4 base) change the model; generating from it (left in
    train mode, adapter dropout 0.5 configured) gives the tokens and log-probs of the adapted model's own
    eval-mode forward pass: adapters applied, dropout off."""
    cfg = LoraConfig(rank=4, alpha=8.0, dropout=0.5, quantize_base=quantize_base)
    adapted = apply_lora(model, cfg, rngs=nnx.Rngs(1))
    for i, (_, layer) in enumerate(lora_layers(adapted)):
        layer.lora_b[...] = jax.random.normal(jax.random.key(i), layer.lora_b.shape) * 0.5
    prompt = PROMPTS[1]
    result = generate(adapted, None, [prompt], GREEDY)
    base = generate(model, None, [prompt], GREEDY)
    adapted.eval()
    ids = list(prompt) + result.token_ids[0].tolist()
    logits = np.asarray(_forward(*nnx.split(adapted), jnp.asarray([ids])))[len(prompt) - 1: -1]
    assert_array_equal(result.token_ids[0], logits.argmax(-1))
    expected = np.asarray(jax.nn.log_softmax(logits, -1))[np.arange(12), result.token_ids[0]]
    assert_allclose(result.logprobs[0], expected, atol=1e-4)
    assert np.abs(result.logprobs[0] - base.logprobs[0]).max() > 1e-2


def test_sharded_model_gives_the_unsharded_samples(model, caplog):
    """Parameters split over a (data 2, fsdp 2, tensor 2) mesh of 8 CPU devices, generation under `use_mesh`:
    same tokens and log-probs as on one device (2 prompts x 2 samples from one shared, sharded prefill)."""
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8, set by conftest)")
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    sharded = nnx.clone(model)
    nnx.update(sharded, shard_params(nnx.state(sharded), mesh))
    kernel = sharded.layers.mlp.gate_proj.kernel[...]
    assert len(kernel.sharding.device_set) == 8
    config = SAMPLED.replace(temperature=1.0, n=2)  # 2 prompts x 2 samples: 4 rows over data x fsdp = 4
    expected = generate(model, None, PROMPTS[:2], config)
    caplog.set_level(logging.WARNING)
    with use_mesh(mesh), jax.log_compiles(True):
        got = generate(sharded, None, PROMPTS[:2], config)
    # compiled ahead from abstract values (engine.DecodeRun._compile_ahead), with the shardings the calls then
    # bring: each program compiles exactly once
    compiled = [m.group(1) for r in caplog.records
                if (m := re.search(r"XLA compilation of jit\((_prefill|_decode)\)", r.getMessage()))]
    assert compiled == ["_prefill", "_decode"]
    assert_array_equal(got.token_ids, expected.token_ids)
    assert_allclose(got.logprobs, expected.logprobs, atol=1e-4)
