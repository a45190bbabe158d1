"""Checkpoints written before the decoder stacked its layers (one array per layer, "layers.<i>.<rest>") restore
into the stacked layout ("layers.<rest>", [L, ...]): parameters and the optimizer's moments, values unchanged."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tempax.train.checkpoint import Checkpointer, stack_layers, unstack_layers
from tempax.train.state import TrainState

LAYERS = 3


def _stacked_params() -> dict[str, jax.Array]:
    return {
        "embed_tokens.embedding": jnp.arange(6.0).reshape(2, 3),
        "layers.mlp.up_proj.kernel": jnp.arange(LAYERS * 4.0).reshape(LAYERS, 2, 2) + 100,
        "layers.self_attn.q_proj.kernel": jnp.arange(LAYERS * 6.0).reshape(LAYERS, 3, 2) - 50,
    }


def _per_layer(params: dict[str, jax.Array]) -> dict[str, jax.Array]:
    out = {}
    for key, value in params.items():
        if key.startswith("layers."):
            for i in range(LAYERS):
                out[f"layers.{i}.{key[len('layers.'):]}"] = value[i]
        else:
            out[key] = value
    return out


def _state(params, optimizer, step: int) -> TrainState:
    opt_state = optimizer.init(params)
    grads = jax.tree.map(lambda p: jnp.sin(p), params)  # non-zero, different moments per layer
    _, opt_state = optimizer.update(grads, opt_state, params)
    return TrainState(step=jnp.int32(step), params=params, opt_state=opt_state,
                      rng=jnp.asarray([1, 2], jnp.uint32), bad_step=jnp.int32(-1))


def test_unstack_then_stack_gives_back_the_stacked_arrays():
    stacked = _stacked_params()
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), stacked)
    keys = set(unstack_layers(abstract, LAYERS))
    assert keys == set(_per_layer(stacked))  # 1 + 2 x 3 keys
    back = stack_layers(_per_layer(stacked), abstract)
    for key in stacked:
        np.testing.assert_array_equal(np.asarray(back[key]), np.asarray(stacked[key]))


def test_a_per_layer_checkpoint_restores_stacked_with_its_optimizer_state(tmp_path):
    optimizer = optax.adam(0.1)
    stacked = _stacked_params()
    legacy = _state(_per_layer(stacked), optimizer, step=7)
    saver = Checkpointer(tmp_path / "checkpoints", async_save=False)
    saver.save(legacy)
    saver.wait()
    saver.close()

    expected = _state(stacked, optimizer, step=0)  # the same update on stacked arrays: the moments to expect
    target = jax.tree.map(jnp.zeros_like, expected)
    reader = Checkpointer(tmp_path / "checkpoints", async_save=False)
    restored, _, _ = reader.restore(target)
    reader.close()
    assert int(restored.step) == 7
    for key in stacked:
        np.testing.assert_array_equal(np.asarray(restored.params[key]), np.asarray(stacked[key]))
    got, want = jax.tree.leaves(restored.opt_state), jax.tree.leaves(expected.opt_state)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)

    params_only = Checkpointer(tmp_path / "checkpoints", read_only=True).restore_params(
        jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), stacked))
    for key in stacked:
        np.testing.assert_array_equal(np.asarray(params_only[key]), np.asarray(stacked[key]))
