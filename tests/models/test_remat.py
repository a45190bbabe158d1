"""Per-layer recomputation (`ModelConfig.remat`) on a forward pass with a KV cache: GRPO's and PPO's training
forward runs the prompts into a cache and the completions against it, so remat must apply there, change no
value or gradient, and leave the decoding programs (no differentiation) exactly as they were."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tempax.models.cache import KVCache
from tempax.models.lora import LoraConfig, apply_lora, lora_filter
from tests.kit.models import random_ids, tiny_tempax_model

PROMPT, COMPLETION = 5, 4


def _model(remat: str):
    model = apply_lora(tiny_tempax_model("llama", num_layers=2, remat=remat), LoraConfig(rank=4, alpha=8),
                       rngs=nnx.Rngs(1))
    for _, var in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)):
        var.set_value(var.get_value() + 0.05)  # lora_b starts at zero: give every adapter a gradient path
    return model


def _cached_objective(model, prompt, completion):
    """A prompt pass into a cache, then the completion against it (as `tempax.rl.logprobs.completion_hidden`)."""
    cache = KVCache.init(model.config, prompt.shape[0], PROMPT + COMPLETION)
    hidden_p, cache = model.hidden_states(prompt, cache=cache)
    hidden_c, _ = model.hidden_states(completion, cache=cache)
    return jnp.mean(model.logits(hidden_p[:, -1:]) ** 2) + jnp.mean(model.logits(hidden_c) ** 2)


@pytest.mark.heavy
@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_with_a_cache_gives_the_same_loss_and_gradients(remat):
    prompt = jnp.asarray(random_ids((2, PROMPT), seed=1))
    completion = jnp.asarray(random_ids((2, COMPLETION), seed=2))

    def run(remat_name):
        graphdef, lora, rest = nnx.split(_model(remat_name), lora_filter, ...)
        value_and_grad = jax.value_and_grad(
            lambda lora: _cached_objective(nnx.merge(graphdef, lora, rest), prompt, completion))
        # The backward recomputes each layer (a `remat2` equation in the scanned layer body) exactly when remat is
        # on: one per pass (prompt, completion), whatever the depth.
        recomputed = str(jax.make_jaxpr(value_and_grad)(lora)).count("remat2[")
        assert recomputed == (0 if remat_name == "none" else 2), recomputed
        loss, grads = jax.jit(value_and_grad)(lora)
        return float(loss), [np.asarray(g) for g in jax.tree.leaves(grads)]

    (loss, grads), (loss_r, grads_r) = run("none"), run(remat)
    assert loss_r == pytest.approx(loss, rel=1e-5)
    assert len(grads) == len(grads_r) == 7 * 2  # 7 adapted projections x (A, B), each stacked over 2 layers
    for a, b in zip(grads, grads_r):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    assert min(float(np.abs(g).max()) for g in grads) > 0


def _compiled_text(model, tokens, cache) -> str:
    graphdef, state = nnx.split(model)

    def step(state, tokens, cache):
        return nnx.merge(graphdef, state)(tokens, cache=cache, last_only=True)

    text = jax.jit(step).lower(state, tokens, cache).compile().as_text()
    # Names and source locations (metadata, the stack-frame tables at the end) differ; the operations may not.
    text = re.sub(r", metadata=\{[^}]*\}", "", text.split("\nFileNames")[0])
    return re.sub(r"^HloModule \S+", "HloModule m", text)


def test_decoding_under_a_remat_config_compiles_to_the_same_program():
    """Without differentiation jax.checkpoint adds nothing: prefill and a one-token decode step compile to the
    same optimised HLO under remat full as under none (the sampler decodes with the trainer's remat view)."""
    cache = KVCache.init(_model("none").config, 2, PROMPT + 1)
    for tokens in (jnp.asarray(random_ids((2, PROMPT), seed=3)), jnp.asarray(random_ids((2, 1), seed=4))):
        plain, remat = (_compiled_text(_model(r), tokens, cache) for r in ("none", "full"))
        assert remat == plain
