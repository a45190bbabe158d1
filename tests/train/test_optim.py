"""Learning-rate schedules and optimizer construction, against hand-computed values."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from numpy.testing import assert_allclose

from tempax.train.config import OptimizerConfig
from tempax.train.optim import decay_mask, make_schedule


def lr_at(cfg, total, steps):
    schedule = make_schedule(cfg, total)
    return [float(schedule(jnp.asarray(s))) for s in steps]


def test_warmup_then_cosine():
    """peak 1, W = 4, S = 14, floor 0.1: warm-up 1/4, 2/4, 3/4, 4/4; then p = (s - 4) / 10 and
    lr = 0.1 + 0.9 (1 + cos(pi p)) / 2: s=4 -> 1.0, s=9 -> 0.55, s=14 -> 0.1 (and stays there)."""
    cfg = OptimizerConfig(learning_rate=1.0, warmup_steps=4, schedule="cosine", min_lr_ratio=0.1)
    assert_allclose(lr_at(cfg, 14, [0, 1, 2, 3, 4, 9, 14, 20]), [0.25, 0.5, 0.75, 1.0, 1.0, 0.55, 0.1, 0.1],
                    rtol=1e-6)


def test_linear_and_constant_and_warmup_ratio():
    """linear, peak 2, no warm-up, S = 4, floor 0: 2, 1.5, 1, 0.5, 0. warmup_ratio 0.25 of 8 = 2 steps: 1, 2, 2."""
    cfg = OptimizerConfig(learning_rate=2.0, schedule="linear")
    assert_allclose(lr_at(cfg, 4, range(5)), [2.0, 1.5, 1.0, 0.5, 0.0], rtol=1e-6)
    cfg = OptimizerConfig(learning_rate=2.0, schedule="constant", warmup_ratio=0.25)
    assert_allclose(lr_at(cfg, 8, [0, 1, 2, 7]), [1.0, 2.0, 2.0, 2.0], rtol=1e-6)


def test_weight_decay_skips_vectors_and_clipping_applies():
    """AdamW's first update is lr * sign(g) (m/sqrt(v) = g/|g|) plus lr * wd * w on matrices only; the clip to
    norm 1 of g = (3, 4) * 10 leaves the direction, so the sign is unchanged."""
    params = {"w": jnp.ones((2, 2)), "b": jnp.ones((2,))}
    assert decay_mask(params) == {"w": True, "b": False}
    cfg = OptimizerConfig(learning_rate=0.1, schedule="constant", weight_decay=0.5, grad_clip_norm=1.0)
    opt = cfg.build(10)
    grads = {"w": jnp.full((2, 2), 30.0), "b": jnp.array([30.0, 40.0])}
    updates, _ = opt.update(grads, opt.init(params), params)
    assert_allclose(updates["b"], [-0.1, -0.1], rtol=1e-5)
    assert_allclose(updates["w"], np.full((2, 2), -0.1 - 0.1 * 0.5), rtol=1e-5)
    assert math.isclose(float(make_schedule(cfg, 10)(0)), 0.1, rel_tol=1e-6)


# ---------------------------------------------------------------------------------------------- bf16 moments


def test_stochastic_round_is_unbiased_and_exact_on_bfloat16_values():
    """1 + 2^-10 lies an eighth of the way from 1 to the next bfloat16, 1 + 2^-7 (7 stored mantissa bits): it
    rounds to 1 + 2^-7 with probability 1/8, so the mean of many draws is 1 + 2^-10; a value bfloat16 holds
    exactly (-1.5) never moves; infinities stay."""
    import jax

    from tempax.train.optim import stochastic_round

    x = jnp.full((200_000,), 1 + 2**-10, jnp.float32)
    r = np.asarray(stochastic_round(x, jnp.bfloat16, 0).astype(jnp.float32))
    assert set(np.unique(r)) == {1.0, 1 + 2**-7}
    assert_allclose(r.mean(), 1 + 2**-10, rtol=2e-5)
    exact = stochastic_round(jnp.array([-1.5, jnp.inf, -jnp.inf]), jnp.bfloat16, 1)
    assert exact.dtype == jnp.bfloat16
    assert_allclose(np.asarray(exact.astype(jnp.float32)), [-1.5, np.inf, -np.inf])


def test_bf16_moments_keep_adams_state_structure_and_first_update():
    """The bf16 state is optax.adamw's (a checkpoint of either restores into the other) in bfloat16, and the
    first update, made from the float32 moments of this step, is AdamW's exactly: lr * sign(g) = -0.1 (weight
    decay 0 on a vector)."""
    import jax

    from tempax.train.optim import make_optimizer

    cfg = OptimizerConfig(learning_rate=0.1, schedule="constant", weight_decay=0.1, grad_clip_norm=None)
    params = {"w": jnp.ones((2, 3)), "b": jnp.ones((3,))}
    plain, low = make_optimizer(cfg, 10), make_optimizer(cfg, 10, moment_dtype=jnp.bfloat16)
    s_plain, s_low = plain.init(params), low.init(params)
    assert jax.tree.structure(s_plain) == jax.tree.structure(s_low)
    assert {x.dtype for x in jax.tree.leaves(s_low[0].mu)} == {jnp.dtype(jnp.bfloat16)}
    grads = {"w": jnp.full((2, 3), 3.0), "b": jnp.array([1.0, -2.0, 0.5])}
    u_plain, _ = plain.update(grads, s_plain, params)
    u_low, _ = low.update(grads, s_low, params)
    assert_allclose(u_low["b"], [-0.1, 0.1, -0.1], rtol=1e-4)  # float32's 1 - 0.999 and sqrt, within 1e-5
    assert_allclose(u_low["b"], u_plain["b"], rtol=1e-6)
    assert_allclose(u_low["w"], u_plain["w"], rtol=1e-6)


def test_bf16_second_moment_follows_slow_averages_where_round_to_nearest_stalls():
    """Adam's v with b2 = 0.999 and g = 1 from v = 1/2: v_t = 1 - (1/2) 0.999^t, 1 - 0.5 * 0.999^200 = 0.9091
    after 200 steps. Rounded to nearest bfloat16 every step, v never moves: its step, (1 - v) / 1000 = 0.0005,
    is below half of bfloat16's spacing at 0.5 (2^-9 = 0.00195). Rounded stochastically it tracks the float32
    value (averaged over 1000 parameters, within 0.5%)."""
    import jax

    from tempax.train.optim import scale_by_adam_low_precision

    opt = scale_by_adam_low_precision(b1=0.9, b2=0.999, moment_dtype=jnp.bfloat16)
    params = {"w": jnp.zeros((1000,))}
    state = opt.init(params)
    state = state._replace(nu={"w": jnp.full((1000,), 0.5, jnp.bfloat16)})
    grads = {"w": jnp.ones((1000,))}
    step = jax.jit(lambda s: opt.update(grads, s)[1])
    nearest = jnp.full((1000,), 0.5, jnp.float32)
    for _ in range(200):
        state = step(state)
        nearest = (0.999 * nearest + 0.001).astype(jnp.bfloat16).astype(jnp.float32)
    assert_allclose(np.asarray(nearest), 0.5)
    assert_allclose(float(jnp.mean(state.nu["w"].astype(jnp.float32))), 1 - 0.5 * 0.999**200, rtol=5e-3)


def test_sgd_momentum_in_bf16_matches_float32_momentum():
    """SGD with momentum 0.9, lr 1, g = 1: updates -1, -1.9, -2.71 (t_k = 0.9 t_{k-1} + 1), in bf16 state too
    (each is within one bfloat16 step of the float32 value)."""
    from tempax.train.optim import make_optimizer

    cfg = OptimizerConfig(name="sgd", learning_rate=1.0, schedule="constant", momentum=0.9, weight_decay=0.0,
                          grad_clip_norm=None)
    opt = make_optimizer(cfg, 10, moment_dtype=jnp.bfloat16)
    params = {"w": jnp.zeros((4,))}
    state = opt.init(params)
    got = []
    for _ in range(3):
        updates, state = opt.update({"w": jnp.ones((4,))}, state, params)
        got.append(float(updates["w"][0]))
    assert_allclose(got, [-1.0, -1.9, -2.71], rtol=2**-7)
