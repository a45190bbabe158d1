"""The optimizer's config (`OptimizerConfig`, the recipe's `train.optimizer`), its learning-rate schedule and the
optax optimizer it builds.

The config lives here, beside what it builds, so the schedule and optimizer code can take it as a type without an
import back from `tempax.train.config` (which imports it for `TrainConfig.optimizer`).

Schedule (step s counts optimizer updates from 0, total S, warm-up W, peak eta, floor r * eta):

    s < W:            eta * (s + 1) / W                      (linear warm-up; the first update is not at lr 0)
    constant:         eta
    linear:           eta * (1 - (1 - r) * p),               p = (s - W) / max(S - W, 1) clipped to [0, 1]
    cosine:           eta * (r + (1 - r) * (1 + cos(pi p)) / 2)   (Loshchilov & Hutter 2017, SGDR, one cycle)

Weight decay is decoupled (AdamW, Loshchilov & Hutter 2019) and by default skips vectors (norm weights, biases),
where shrinking towards 0 only hurts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import jax
import jax.numpy as jnp
import optax

from tempax.configlib import help_field
from tempax.errors import ConfigError


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer and its learning-rate schedule (AdamW with warm-up then cosine decay by default)."""

    name: Literal["adamw", "adam", "sgd"] = help_field("Optimizer: adamw (decoupled weight decay), adam or sgd.", "adamw")
    learning_rate: float = help_field("Peak learning rate (reached at the end of warm-up).", 1e-5)
    schedule: Literal["constant", "cosine", "linear"] = help_field(
        "Decay after warm-up: constant, cosine (to min_lr_ratio * peak) or linear (to min_lr_ratio * peak).",
        "cosine",
    )
    warmup_steps: int = help_field("Linear warm-up steps from 0 to the peak; takes precedence over warmup_ratio.", 0)
    warmup_ratio: float = help_field("Warm-up as a fraction of total steps (used when warmup_steps is 0).", 0.0)
    min_lr_ratio: float = help_field("Final learning rate of cosine/linear decay as a fraction of the peak.", 0.0)
    b1: float = help_field("Adam beta1.", 0.9)
    b2: float = help_field("Adam beta2.", 0.999)
    eps: float = help_field("Adam epsilon.", 1e-8)
    weight_decay: float = help_field("Decoupled weight decay (adamw) or L2 (sgd).", 0.01)
    decay_all: bool = help_field(
        "Apply weight decay to every parameter; false skips vectors (norm weights, biases) as is customary.", False
    )
    momentum: float = help_field("SGD momentum.", 0.0)
    grad_clip_norm: float | None = help_field("Clip the global gradient norm to this value; null disables.", 1.0)

    def validate(self) -> None:
        if self.learning_rate < 0:
            raise ConfigError(f"learning_rate must be >= 0, got {self.learning_rate}")
        if self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.grad_clip_norm is not None and self.grad_clip_norm <= 0:
            raise ConfigError(f"grad_clip_norm must be > 0 or null, got {self.grad_clip_norm}")

    def schedule_fn(self, total_steps: int) -> optax.Schedule:
        return make_schedule(self, total_steps)

    def build(self, total_steps: int) -> optax.GradientTransformation:
        """The optax transformation (clipping, then the optimizer with its schedule)."""
        return make_optimizer(self, total_steps)


def warmup_steps_of(cfg: OptimizerConfig, total_steps: int) -> int:
    """W: `warmup_steps` when set, else `warmup_ratio` of the total steps, rounded."""
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
