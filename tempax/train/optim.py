"""The optimizer's config (`OptimizerConfig`, the recipe's `train.optimizer`), its learning-rate schedule and the
optax optimizer it builds.

The config lives here, beside what it builds, so the schedule and optimizer code can take it as a type without an
import back from `tempax.train.config` (which imports it for `TrainConfig.optimizer`). `make_schedule` gives the
schedule's formulas, `make_optimizer` the weight decay and the moments stored in bfloat16
(`train.memory=bf16_moments`).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

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

    def build(self, total_steps: int, *, moment_dtype: Any = None) -> optax.GradientTransformation:
        """The optax transformation (clipping, then the optimizer with its schedule); `moment_dtype` bfloat16
        stores the optimizer's moments in 2 bytes (see `make_optimizer`)."""
        return make_optimizer(self, total_steps, moment_dtype=moment_dtype)


def warmup_steps_of(cfg: OptimizerConfig, total_steps: int) -> int:
    """W: `warmup_steps` when set, else `warmup_ratio` of the total steps, rounded."""
    if cfg.warmup_steps:
        return cfg.warmup_steps
    return int(round(cfg.warmup_ratio * total_steps))


def make_schedule(cfg: OptimizerConfig, total_steps: int) -> optax.Schedule:
    """The learning rate as a function of the update count.

    Step s counts optimizer updates from 0, total S, warm-up W, peak eta, floor r * eta:

        s < W:            eta * (s + 1) / W                      (linear warm-up; the first update is not at lr 0)
        constant:         eta
        linear:           eta * (1 - (1 - r) * p),               p = (s - W) / max(S - W, 1) clipped to [0, 1]
        cosine:           eta * (r + (1 - r) * (1 + cos(pi p)) / 2)   (Loshchilov & Hutter 2017, SGDR, one cycle)
    """
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
    """True for the parameters weight decay applies to: matrices (ndim >= 2), not norm weights or biases, where
    shrinking towards 0 only hurts (the default; `decay_all` decays every parameter)."""
    return jax.tree.map(lambda p: getattr(p, "ndim", 0) >= 2, params)


def make_optimizer(cfg: OptimizerConfig, total_steps: int, *, moment_dtype: Any = None) -> optax.GradientTransformation:
    """Gradient clipping (optional), then AdamW / Adam / SGD driven by `make_schedule`.

    Weight decay is decoupled (AdamW, Loshchilov & Hutter 2019) and by default skips vectors (`decay_mask`).

    `moment_dtype` bfloat16 (`train.memory=bf16_moments`) stores Adam's two moments, or SGD's momentum, in 2 bytes
    a parameter instead of 4, computed in float32 at every update (`scale_by_adam_low_precision`,
    `trace_low_precision`); stored values are rounded stochastically (`stochastic_round`), because rounding to
    nearest makes a slow moving average stop moving (`scale_by_adam_low_precision` says why and what is lost)."""
    clip, update = optimizer_parts(cfg, total_steps, moment_dtype=moment_dtype)
    return update if clip is None else optax.chain(clip, update)


def optimizer_parts(
    cfg: OptimizerConfig, total_steps: int, *, moment_dtype: Any = None
) -> tuple[optax.GradientTransformation | None, optax.GradientTransformation]:
    """(clipping or None, the rest): `make_optimizer` is `optax.chain(clipping, rest)` (the rest alone without
    clipping). The rest is elementwise, one parameter at a time, so it can be applied to a part of the parameters
    with the matching part of its state: how an update streams host-resident state through the device one
    parameter at a time (`tempax.train.offload`) after clipping by the norm of all gradients."""
    schedule = make_schedule(cfg, total_steps)
    mask = None if cfg.decay_all else decay_mask
    low = moment_dtype is not None and jnp.dtype(moment_dtype) != jnp.float32
    if cfg.name == "adamw" and not low:
        opt = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=mask)
    elif cfg.name == "adam" and not low:
        opt = optax.adam(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
    elif cfg.name in ("adamw", "adam"):
        # optax.adamw's and optax.adam's own chains with the moments in low precision: the state has their
        # structure, so a checkpoint of either kind restores into the other (the moments cast).
        parts = [scale_by_adam_low_precision(cfg.b1, cfg.b2, cfg.eps, moment_dtype=moment_dtype)]
        if cfg.name == "adamw":
            parts.append(optax.add_decayed_weights(cfg.weight_decay, mask))
        parts.append(optax.scale_by_learning_rate(schedule))
        opt = optax.chain(*parts)
    else:
        parts = []
        if cfg.weight_decay:
            parts.append(optax.add_decayed_weights(cfg.weight_decay, mask=mask))
        if low and cfg.momentum:
            parts.append(optax.chain(trace_low_precision(cfg.momentum, moment_dtype=moment_dtype),
                                     optax.scale_by_learning_rate(schedule)))
        else:
            parts.append(optax.sgd(schedule, momentum=cfg.momentum or None))
        opt = optax.chain(*parts)
    clip = optax.clip_by_global_norm(cfg.grad_clip_norm) if cfg.grad_clip_norm is not None else None
    return clip, opt


# --------------------------------------------------------------------------------------------------------------
# Optimizer state in low precision


def stochastic_round(x: jax.Array, dtype: Any, seed: jax.Array | int) -> jax.Array:
    """float32 `x` rounded to bfloat16 (`dtype`) up or down at random, so that E[result] = x.

    A float32 is a bfloat16 plus 16 more mantissa bits. Adding 16 uniform random bits to those and truncating
    rounds the magnitude up with probability (dropped bits) / 2^16, i.e. exactly in proportion to how far x lies
    from the bfloat16 below it: unbiased, for either sign (the sign bit is untouched), and less than one
    bfloat16 step (at most 2^-7 relative) from x. Infinities stay infinite and NaNs stay NaN (Gupta et al. 2015,
    "Deep Learning with Limited Numerical Precision"; Zamirai et al. 2020, "Revisiting BFloat16 Training").

    The random bits are a hash of each element's index and `seed` (a uint32), elementwise integer arithmetic
    that the compiler fuses into the rounding: a random-number generator's output would be an array as large as
    the parameter, materialised beside it (for a 1B-parameter model, gigabytes the update does not need).
    """
    if jnp.dtype(dtype) != jnp.bfloat16:
        return x.astype(dtype)
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    index = jax.lax.iota(jnp.uint32, math.prod(x.shape)).reshape(x.shape)
    noise = _mix(index ^ _mix(jnp.asarray(seed, jnp.uint32))) >> 16
    finite = jnp.isfinite(x)
    rounded = jnp.where(finite, (bits + noise) & jnp.uint32(0xFFFF0000), bits)
    return jax.lax.bitcast_convert_type(rounded, jnp.float32).astype(jnp.bfloat16)


def _mix(x: jax.Array) -> jax.Array:
    """A 32-bit integer hash whose output bits each flip with about half the input bit flips (Wellons'
    "lowbias32"): consecutive indices give unrelated bits."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def _leaf_seeds(tree: Any, base: jax.Array) -> Any:
    """A seed per leaf, from the leaf's path in the tree (not its position): the same parameter draws the same
    numbers whether the whole tree or a part of it is updated (`optimizer_parts`)."""
    def one(path: Any, _: Any) -> jax.Array:
        return _mix(base ^ jnp.uint32(zlib.crc32(jax.tree_util.keystr(path).encode())))

    return jax.tree_util.tree_map_with_path(one, tree)


def _round_seed(seed: int, count: jax.Array, salt: int) -> jax.Array:
    """The base seed of one update's rounding: (`seed`, the update count, which moment)."""
    offset = jnp.uint32((salt * 0x85EBCA6B + seed) & 0xFFFFFFFF)
    return _mix(_mix(jnp.asarray(count, jnp.uint32) * jnp.uint32(0x9E3779B1) + offset))


def scale_by_adam_low_precision(
    b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, *, moment_dtype: Any = jnp.bfloat16, seed: int = 0
) -> optax.GradientTransformation:
    """Adam's scaling (Kingma & Ba 2015) with both moments stored in `moment_dtype` (bfloat16) and computed in
    float32:

        m_t = b1 m_{t-1} + (1 - b1) g,   v_t = b2 v_{t-1} + (1 - b2) g^2          (float32, from the stored values)
        update = m_t / (1 - b1^t) / (sqrt(v_t / (1 - b2^t)) + eps)               (from the float32 m_t, v_t)
        stored m_t, v_t = stochastic_round(m_t), stochastic_round(v_t)

    Why stochastic rounding: bfloat16 keeps 8 significant bits, so neighbouring values lie 2^-8 to 2^-7 (0.4% to
    0.8%) apart, and under rounding to nearest a stored value only moves when the change is at least half of
    that, 0.2% of itself or more. Adam's second moment changes by (1 - b2) = 0.1% of itself a step when the
    gradients keep their size: rounded to nearest, v would stop following the gradients altogether (and m too
    once b1 > 0.998). Rounded stochastically each stored moment is right on average, so the moving averages
    follow the gradients as in float32.

    What is lost: each stored moment carries a random error of less than one bfloat16 step (under 0.8%
    relative), fresh at every step; the update divides m by sqrt(v), so it inherits about the same relative
    noise per parameter, small beside the gradient noise of a mini-batch. The state is 4 bytes a parameter
    instead of 8. The random bits come from (`seed`, the step count, the parameter's path), so a resumed run rounds as
    the uninterrupted one. The state is optax's `ScaleByAdamState`, so code that maps over optax states (shardings,
    checkpoints) treats it as Adam's.
    """

    def init(params: Any) -> optax.ScaleByAdamState:
        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, moment_dtype), params)
        return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=zeros, nu=zeros)

    def update(updates: Any, state: optax.ScaleByAdamState, params: Any = None) -> tuple[Any, Any]:
        del params
        count = optax.safe_increment(state.count)
        g32 = jax.tree.map(lambda g: g.astype(jnp.float32), updates)
        mu = jax.tree.map(lambda m, g: b1 * m.astype(jnp.float32) + (1 - b1) * g, state.mu, g32)
        nu = jax.tree.map(lambda v, g: b2 * v.astype(jnp.float32) + (1 - b2) * jnp.square(g), state.nu, g32)
        t = count.astype(jnp.float32)
        out = jax.tree.map(lambda m, v, g: (m / (1 - b1 ** t) / (jnp.sqrt(v / (1 - b2 ** t)) + eps)).astype(g.dtype),
                           mu, nu, updates)
        mu_keys = _leaf_seeds(mu, _round_seed(seed, count, 0))
        nu_keys = _leaf_seeds(nu, _round_seed(seed, count, 1))
        stored_mu = jax.tree.map(lambda m, k: stochastic_round(m, moment_dtype, k), mu, mu_keys)
        stored_nu = jax.tree.map(lambda v, k: stochastic_round(v, moment_dtype, k), nu, nu_keys)
        return out, optax.ScaleByAdamState(count=count, mu=stored_mu, nu=stored_nu)

    return optax.GradientTransformation(init, update)


class LowPrecisionTraceState(NamedTuple):
    """SGD's momentum buffer in a low-precision dtype and the update count (the rounding's random stream)."""

    count: jax.Array
    trace: Any


def trace_low_precision(decay: float, *, moment_dtype: Any = jnp.bfloat16, seed: int = 0) -> optax.GradientTransformation:
    """SGD's momentum, t = decay t + g (optax.trace without Nesterov), kept in `moment_dtype` and computed in
    float32, the stored buffer rounded stochastically (see `scale_by_adam_low_precision` for why)."""

    def init(params: Any) -> LowPrecisionTraceState:
        return LowPrecisionTraceState(jnp.zeros([], jnp.int32),
                                      jax.tree.map(lambda p: jnp.zeros(p.shape, moment_dtype), params))

    def update(updates: Any, state: LowPrecisionTraceState, params: Any = None) -> tuple[Any, Any]:
        del params
        count = optax.safe_increment(state.count)
        trace = jax.tree.map(lambda t, g: decay * t.astype(jnp.float32) + g.astype(jnp.float32), state.trace, updates)
        keys = _leaf_seeds(trace, _round_seed(seed, count, 2))
        stored = jax.tree.map(lambda t, k: stochastic_round(t, moment_dtype, k), trace, keys)
        return jax.tree.map(lambda t, g: t.astype(g.dtype), trace, updates), LowPrecisionTraceState(count, stored)

    return optax.GradientTransformation(init, update)
