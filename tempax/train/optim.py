"""Learning-rate schedules and the optax optimizer built from an `OptimizerConfig`.

Schedule (step s counts optimizer updates from 0, total S, warm-up W, peak eta, floor r * eta):

    s < W:            eta * (s + 1) / W                      (linear warm-up; the first update is not at lr 0)
    constant:         eta
    linear:           eta * (1 - (1 - r) * p),               p = (s - W) / max(S - W, 1) clipped to [0, 1]
    cosine:           eta * (r + (1 - r) * (1 + cos(pi p)) / 2)   (Loshchilov & Hutter 2017, SGDR, one cycle)

Weight decay is decoupled (AdamW, Loshchilov & Hutter 2019) and by default skips vectors (norm weights, biases),
where shrinking towards 0 only hurts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import optax

if TYPE_CHECKING:  # the config builds its optimizer with this module
    from tempax.train.config import OptimizerConfig


def warmup_steps_of(cfg: OptimizerConfig, total_steps: int) -> int:
    if cfg.warmup_steps:
        return cfg.warmup_steps
    return int(round(cfg.warmup_ratio * total_steps))


def make_schedule(cfg: OptimizerConfig, total_steps: int) -> optax.Schedule:
    """The learning rate as a function of the update count (see the module docstring)."""
    peak, floor = cfg.learning_rate, cfg.min_lr_ratio
    warmup = warmup_steps_of(cfg, total_steps)
    decay_steps = max(total_steps - warmup, 1)

    def schedule(count: jax.Array) -> jax.Array:
        s = jnp.asarray(count, jnp.float32)
        p = jnp.clip((s - warmup) / decay_steps, 0.0, 1.0)
        if cfg.schedule == "constant":
            decayed = jnp.asarray(peak, jnp.float32)
        elif cfg.schedule == "linear":
            decayed = peak * (1.0 - (1.0 - floor) * p)
        else:
            decayed = peak * (floor + (1.0 - floor) * 0.5 * (1.0 + jnp.cos(jnp.pi * p)))
        if warmup == 0:
            return decayed
        return jnp.where(s < warmup, peak * (s + 1.0) / warmup, decayed)

    return schedule


def decay_mask(params: dict) -> dict:
    """True for the parameters weight decay applies to: matrices (ndim >= 2), not norm weights or biases."""
    return jax.tree.map(lambda p: getattr(p, "ndim", 0) >= 2, params)


def make_optimizer(cfg: OptimizerConfig, total_steps: int) -> optax.GradientTransformation:
    """Gradient clipping (optional), then AdamW / Adam / SGD driven by `make_schedule`."""
    schedule = make_schedule(cfg, total_steps)
    mask = None if cfg.decay_all else decay_mask
    if cfg.name == "adamw":
        opt = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=mask)
    elif cfg.name == "adam":
        opt = optax.adam(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
    else:
        parts = []
        if cfg.weight_decay:
            parts.append(optax.add_decayed_weights(cfg.weight_decay, mask=mask))
        parts.append(optax.sgd(schedule, momentum=cfg.momentum or None))
        opt = optax.chain(*parts)
    if cfg.grad_clip_norm is not None:
        opt = optax.chain(optax.clip_by_global_norm(cfg.grad_clip_norm), opt)
    return opt
