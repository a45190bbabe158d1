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
