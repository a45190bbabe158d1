"""`tempax.ops`: which variant runs where, and the plain and CPU variants of every op computing the same function.

On this machine the CPU variant is what runs; `use_variant("plain")` traces the default (any other backend's)
implementations here too, so each op is compared, value and gradients, on the same inputs. Inputs are built from
`np.linspace` and `sin`, not drawn at random. Float32 results agree to float rounding (the two variants sum in
different orders); bf16 ones to bf16 rounding of p, ds and the products (8 significant bits).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from numpy.testing import assert_allclose

from tempax import ops
from tempax.models.cache import KVCache
from tempax.models.decoder import lm_head_of
from tempax.ops import use_variant, variant
from tests.kit.models import random_ids, tiny_config, tiny_tempax_model

BF16 = jnp.bfloat16


def _array(shape: tuple[int, ...], scale: float = 1.0, phase: float = 0.0, dtype=jnp.float32) -> jax.Array:
    """A deterministic, non-uniform array: scale * sin(linspace + phase)."""
    n = int(np.prod(shape))
    return jnp.asarray(scale * np.sin(np.linspace(0.0, 7.0, n) + phase).reshape(shape), dtype)


def _both(fn: Callable, *args):
    """jit(fn)(*args) traced under the plain and then the CPU variant."""
    out = []
    for name in ("plain", "cpu"):
        with use_variant(name):
            out.append(jax.jit(fn)(*args))
    return out


def _close(plain, cpu, rtol: float, atol: float = 0.0) -> None:
    for p, c in zip(jax.tree.leaves(plain), jax.tree.leaves(cpu), strict=True):
        assert p.dtype == c.dtype and p.shape == c.shape
        assert_allclose(np.asarray(p, np.float32), np.asarray(c, np.float32), rtol=rtol, atol=atol)


def test_the_variant_is_the_backends_unless_forced():
    """The test process runs on XLA:CPU, so the CPU variant (and the tied head on the left in decode steps) is
    chosen; `use_variant` forces either one for its block only; an unknown name is refused."""
    assert jax.default_backend() == "cpu" and variant() == "cpu" and ops.table_on_left_in_decode()
    with use_variant("plain"):
        assert variant() == "plain" and not ops.table_on_left_in_decode()
    assert variant() == "cpu"
    with pytest.raises(ValueError, match="'plain' or 'cpu'"):
        with use_variant("gpu"):  # type: ignore[arg-type]
            pass


def test_the_choice_is_made_when_a_function_is_traced():
    """The same jitted function traced under each variant: the CPU one writes the gated MLP's gradient by hand
    (a custom VJP in its program), the plain one leaves it to autodiff."""
    gate, up = _array((2, 3)), _array((2, 3), phase=1.0)
    grad = jax.grad(lambda g, u: jnp.sum(ops.gated(g, u, "silu")), argnums=(0, 1))
    texts = {}
    for name in ("plain", "cpu"):
        with use_variant(name):
            texts[name] = str(jax.make_jaxpr(grad)(gate, up))
    assert "custom_vjp" in texts["cpu"] and "custom_vjp" not in texts["plain"]


@pytest.mark.parametrize("dtype", [jnp.float32, BF16], ids=["float32", "bf16"])
def test_projection_and_gated_agree(dtype):
    """x [2, 3, 8] @ W [8, 6] (float32 master under bf16 x) and silu(gate) * up: value, d x and d W. bf16: the
    same bf16 products summed in float32 in another order, so the float32 weight gradients agree to 1e-5."""
    x, w = _array((2, 3, 8), dtype=dtype), _array((8, 6), 0.5, phase=0.3)
    cot = _array((2, 3, 6), phase=2.0)

    def loss(x, w):
        y = ops.matmul(x, w)
        return jnp.sum(y.astype(jnp.float32) * cot) + jnp.sum(ops.gated(y, y * 2, "gelu_tanh").astype(jnp.float32))

    plain, cpu = _both(jax.value_and_grad(loss, (0, 1)), x, w)
    _close(plain, cpu, rtol=1e-5 if dtype == jnp.float32 else 1e-2, atol=1e-6)
    assert plain[1][1].dtype == jnp.float32  # the master's gradient stays float32 in both


@pytest.mark.parametrize("window, cap", [(None, None), (3, 1.5)])
@pytest.mark.parametrize("dtype", [jnp.float32, BF16], ids=["float32", "bf16"])
def test_training_attention_agrees(dtype, window, cap):
    """q [2, 8, 4, 8] over k, v [2, 8, 2, 8]: row 0 packs segments 1 (5 tokens) and 2 (3), row 1 has two padding
    tokens. bf16: the CPU variant's custom VJP rounds p and ds to bf16 where autodiff of the einsum rounds other
    intermediates, so the two agree to bf16's precision (2% of the largest gradient)."""
    q, k, v = _array((2, 8, 4, 8), dtype=dtype), _array((2, 8, 2, 8), phase=1.0, dtype=dtype), _array(
        (2, 8, 2, 8), phase=2.0, dtype=dtype)
    segments = jnp.array([[1, 1, 1, 1, 1, 2, 2, 2], [0, 0, 1, 1, 1, 1, 1, 1]], jnp.int32)
    index = jnp.arange(8, dtype=jnp.int32)
    cot = _array((2, 8, 4, 8), phase=3.0)

    def loss(q, k, v):
        out = ops.attention(q, k, v, q_index=index, k_index=index, q_segments=segments, k_segments=segments,
                            scale=8**-0.5, logit_cap=cap, window=window)
        return jnp.sum(out.astype(jnp.float32) * cot)

    plain, cpu = _both(jax.value_and_grad(loss, (0, 1, 2)), q, k, v)
    if dtype == jnp.float32:
        _close(plain, cpu, rtol=1e-5, atol=1e-6)
    else:
        for p, c in zip(jax.tree.leaves(plain), jax.tree.leaves(cpu)):
            assert p.dtype == c.dtype
            err = float(jnp.max(jnp.abs(p.astype(jnp.float32) - c.astype(jnp.float32))))
            assert err <= 2e-2 * float(jnp.max(jnp.abs(c.astype(jnp.float32))))


def test_decode_step_attention_and_tied_head_agree():
    """One query per row over a [2, 2, 6, 8] cache (kv heads first) of which the first 4 slots are written, with
    a 3-key window; and the tied head h @ E^T against E @ h^T."""
    q = _array((2, 1, 4, 8))
    k, v = _array((2, 2, 6, 8), phase=1.0), _array((2, 2, 6, 8), phase=2.0)
    k_segments = jnp.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]], jnp.int32)
    step = partial(ops.attention, q_index=jnp.array([3], jnp.int32), k_index=jnp.arange(6, dtype=jnp.int32),
                   q_segments=jnp.ones((2, 1), jnp.int32), k_segments=k_segments, scale=8**-0.5, window=3,
                   kv_heads_first=True)
    _close(*_both(step, q, k, v), rtol=1e-6, atol=1e-7)
    h, table = _array((2, 1, 8)), _array((16, 8), phase=0.5)
    on_left = ops.tied_lm_head(h, table, table_on_left=True)
    assert_allclose(np.asarray(on_left), np.asarray(ops.tied_lm_head(h, table)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("vocab_major", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("dtype", [jnp.float32, BF16], ids=["float32", "bf16"])
def test_fused_head_forms_agree(dtype, vocab_major):
    """h [2, 12, 8] through a head of 16 tokens (a float32 master under bf16 h), soft-capped at 5, chunks of 4:
    loss, d h and d W of the plain forms (exp(z - lse), dL/dW in the head's layout) and XLA:CPU's."""
    h = _array((2, 12, 8), dtype=dtype)
    w = _array((16, 8) if vocab_major else (8, 16), 0.5, phase=0.7)
    targets = jnp.asarray(np.arange(24).reshape(2, 12) * 5 % 16, jnp.int32)
    mask = jnp.ones((2, 12), jnp.int32).at[1, -3:].set(0)

    def loss(h, w):
        return ops.fused_causal_lm_loss(h, w, targets, mask, vocab_major=vocab_major, chunk_len=4, softcap=5.0)[0]

    plain, cpu = _both(jax.value_and_grad(loss, (0, 1)), h, w)
    _close(plain, cpu, rtol=1e-5 if dtype == jnp.float32 else 1e-2, atol=1e-6 if dtype == jnp.float32 else 1e-3)
    assert plain[1][1].dtype == jnp.float32


@pytest.mark.heavy
@pytest.mark.parametrize("family", ["qwen2", "gemma2"])
def test_whole_model_agrees_across_variants(family):
    """The tiny Qwen2 (tied head) and Gemma 2 (soft-caps, a sliding and a full layer), float32, two layers each:
    the fused SFT-style loss and every weight's gradient within 1e-5 (relative) between the variants, and a prefill
    plus two decode steps give the same logits (decode steps with the CPU variant's tied head on the left)."""
    model = tiny_tempax_model(family, num_layers=2, layer_types=tiny_config(family).layer_types[:2])
    tokens = jnp.asarray(random_ids((2, 8)))
    segments = jnp.array([[1, 1, 1, 1, 1, 2, 2, 2], [0, 0, 1, 1, 1, 1, 1, 1]], jnp.int32)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p):
        m = nnx.merge(graphdef, p, rest)
        hidden, _ = m.hidden_states(tokens, segment_ids=segments)
        head, vocab_major = lm_head_of(m, master=True)
        return ops.fused_causal_lm_loss(hidden, head, jnp.roll(tokens, -1, 1), segments != 0, vocab_major=vocab_major,
                                        softcap=m.config.final_logit_softcap)[0]

    _close(*_both(jax.value_and_grad(loss), params), rtol=1e-5, atol=1e-7)

    def decode(p):
        m = nnx.merge(graphdef, p, rest)
        cache = KVCache.init(m.config, 2, 12)
        logits, cache = m(tokens, segment_ids=segments, cache=cache, last_only=True)
        out = [logits]
        for i in range(2):
            logits, cache = m(tokens[:, i:i + 1], cache=cache, last_only=True,
                              decode_layout=ops.table_on_left_in_decode())
            out.append(logits)
        return jnp.concatenate(out, axis=1)

    _close(*_both(decode, params), rtol=1e-5, atol=1e-5)


def test_the_table_has_every_backend_for_every_op_and_backend_picks_its_column():
    """One row per op, one column per backend; `use_backend` forces a column (the TPU one runs Pallas kernels
    interpreted on a CPU), and an unknown backend is refused."""
    assert all(set(row) == set(ops.BACKENDS) for row in ops.IMPLEMENTATIONS.values())
    assert ops.backend() == "cpu" and ops.implementation("gated") is ops.IMPLEMENTATIONS["gated"]["cpu"]
    with ops.use_backend("tpu"):
        assert ops.backend() == "tpu" and variant() == "plain" and not ops.table_on_left_in_decode()
    with pytest.raises(ValueError, match="unknown ops backend"):
        with ops.use_backend("npu"):  # type: ignore[arg-type]
            pass


def test_the_tpu_column_runs_splash_where_it_applies_and_the_plain_op_elsewhere():
    """Self-attention of 128 positions with head_dim 64 takes the splash kernel under the TPU column (a
    pallas_call in the program) and matches the plain op; head_dim 16 is outside the kernel's limits and takes the
    plain op (no pallas_call), with the same result as the plain column."""
    def run(h: int):
        q = _array((1, 128, 2, h), 0.5)
        k, v = _array((1, 128, 1, h), 0.5, phase=1.0), _array((1, 128, 1, h), phase=2.0)
        index = jnp.arange(128)
        segments = jnp.ones((1, 128), jnp.int32)

        def attend(q, k, v):
            return ops.attention(q, k, v, q_index=index, k_index=index, q_segments=segments, k_segments=segments,
                                 scale=h ** -0.5)

        out = {}
        for name in ("plain", "tpu"):
            with ops.use_backend(name):
                out[name] = (attend(q, k, v), str(jax.make_jaxpr(attend)(q, k, v)))
        return out

    wide, narrow = run(64), run(16)
    assert "pallas_call" in wide["tpu"][1] and "pallas_call" not in wide["plain"][1]
    assert_allclose(np.asarray(wide["tpu"][0]), np.asarray(wide["plain"][0]), atol=1e-5)
    assert "pallas_call" not in narrow["tpu"][1]
    assert_allclose(np.asarray(narrow["tpu"][0]), np.asarray(narrow["plain"][0]), atol=1e-6)
