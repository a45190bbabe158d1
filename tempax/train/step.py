"""The one train step every algorithm uses: gradients, micro-batch accumulation, clipping, the optimizer update,
non-finite detection and sharding constraints, parameterised by a loss function.

An algorithm supplies only

    loss_fn(model, batch) -> (loss, metrics)

`make_train_step` says what `batch`, `loss` and `metrics` must be so that micro-batch accumulation is exact, and
how a mixture of experts' router loss joins every algorithm's loss here.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from tempax.train.offload import StreamedUpdate
from tempax.models.moe import with_router_aux_loss
from tempax.train.state import ModelParts, Params, TrainState

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]
LossFn = Callable[[nnx.Module, Batch], tuple[jax.Array, Metrics]]

LOSS_WEIGHT = "loss_weight"


def _is_summed(name: str) -> bool:
    return name.startswith("num_") or name.endswith("_sum")


def split_micro_batches(batch: Batch, num_micro: int) -> Batch:
    """[B, ...] -> [n, B / n, ...] with micro-batch i holding rows i, i + n, ...

    Micro-batch i takes rows i, i + n, i + 2n, ... of the global batch (n = number of micro-batches): every
    device's contiguous block of rows then holds rows of every micro-batch, so all devices work on every pass.
    """

    def one(x: jax.Array) -> jax.Array:
        b = x.shape[0]
        return x.reshape(b // num_micro, num_micro, *x.shape[1:]).swapaxes(0, 1)

    return jax.tree.map(one, batch)


def merge_micro_outputs(x: jax.Array) -> jax.Array:
    """Inverse of `split_micro_batches` for a stacked per-row output [n, B / n, ...] -> [B, ...]."""
    return x.swapaxes(0, 1).reshape(-1, *x.shape[2:])


def _weighted_loss_and_grads(
    loss_fn: LossFn, parts: ModelParts, params: Params, rest: Any, batch: Batch, num_micro: int,
    grad_sharding: Any = None,
) -> tuple[jax.Array, Params, Metrics, jax.Array]:
    """Weighted sums over micro-batches: (sum w L, sum w grad, combined metrics, sum w)."""

    def loss_of(p: Params, micro: Batch) -> tuple[jax.Array, Metrics]:
        loss, metrics = with_router_aux_loss(loss_fn)(parts.merge(p, rest), micro)
        return loss, metrics

    grad_fn = jax.value_and_grad(loss_of, has_aux=True)

    def one(micro: Batch) -> tuple[jax.Array, Params, Metrics, jax.Array]:
        (loss, metrics), grads = grad_fn(params, micro)
        w = jnp.asarray(metrics.get(LOSS_WEIGHT, 1.0), jnp.float32)
        grads = jax.tree.map(lambda g: (g * w).astype(jnp.float32), grads)
        return loss * w, grads, metrics, w

    if num_micro == 1:
        # One pass: the loss is already the batch mean; weighting and un-weighting would only add rounding.
        (loss, metrics), grads = grad_fn(params, batch)
        return loss, grads, metrics, jnp.ones((), jnp.float32)

    micro_batches = split_micro_batches(batch, num_micro)
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    if grad_sharding is not None:
        zeros = jax.lax.with_sharding_constraint(zeros, grad_sharding)

    def body(carry, micro):
        loss_acc, grad_acc, w_acc = carry
        wloss, grads, metrics, w = one(micro)
        grad_acc = jax.tree.map(jnp.add, grad_acc, grads)
        scalars = {k: v for k, v in metrics.items() if jnp.ndim(v) == 0}
        weighted = {k: (v if _is_summed(k) or k == LOSS_WEIGHT else v * w) for k, v in scalars.items()}
        per_row = {k: v for k, v in metrics.items() if jnp.ndim(v) > 0}
        return (loss_acc + wloss, grad_acc, w_acc + w), (weighted, per_row)

    init = (jnp.zeros((), jnp.float32), zeros, jnp.zeros((), jnp.float32))
    (wloss, grads, wsum), (weighted, per_row) = jax.lax.scan(body, init, micro_batches)
    metrics = {k: jnp.sum(v, axis=0) for k, v in weighted.items()}
    metrics = {k: (v if _is_summed(k) or k == LOSS_WEIGHT else v / jnp.maximum(wsum, 1e-30)) for k, v in metrics.items()}
    metrics.update({k: merge_micro_outputs(v) for k, v in per_row.items()})
    return wloss, grads, metrics, wsum


def global_norm(tree: Any) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


def make_train_step(
    loss_fn: LossFn,
    parts: ModelParts,
    optimizer: optax.GradientTransformation,
    *,
    num_micro_batches: int = 1,
    schedule: optax.Schedule | None = None,
    grad_sharding: Any = None,
    streamed: StreamedUpdate | None = None,
) -> Callable[[TrainState, Any, Batch], tuple[TrainState, Metrics]]:
    """The (unjitted) step `(state, rest, batch) -> (new_state, metrics)`; jit it with donation (see `Trainer`).

    Args:
      loss_fn: `loss_fn(model, micro_batch) -> (loss, metrics)` (below).
      parts: how to rebuild the model from trainable params and the rest.
      optimizer: the optax transformation (clipping included).
      num_micro_batches: gradient-accumulation passes per step; the batch's leading dim must divide by it.
      schedule: reported as metrics["lr"] when given.
      grad_sharding: sharding of the gradient accumulator (the params' shardings), so FSDP keeps it split.
      streamed: the update of a state partly in host memory (`tempax.train.offload`): the forward pass reads its
        device copy of the weights and the optimizer runs one parameter at a time; None: all on the device.

    The metrics always include `loss`, `grad_norm` (before clipping), `nonfinite` (1 when this step was
    skipped) and, with a schedule, `lr` (the rate this update used).

    `loss_fn(model, batch) -> (loss, metrics)`: `batch` is a dict of arrays with a leading batch dimension (one
    micro-batch) and `loss` is a scalar mean over that micro-batch. To make accumulation exact,
    `metrics["loss_weight"]` (optional, default 1) says how much the micro-batch counts: the step combines
    micro-batches i as

        L = sum_i w_i L_i / sum_i w_i,        grad L = sum_i w_i grad L_i / sum_i w_i

    so a token-mean loss that reports w_i = its number of supervised tokens gives exactly the full-batch token mean
    (the mean of micro-batch means would over-weight short micro-batches). Scalar metrics are combined the same
    way, except keys named `num_*` or `*_sum`, which are summed; non-scalar metrics (e.g. `per_example_loss`
    [rows]) are concatenated back to the global batch order.

    A mixture-of-experts model's router load-balancing loss joins every algorithm's loss here, not in the algorithm
    (`tempax.models.moe.with_router_aux_loss`): its metrics `moe_aux_loss` and `moe_max_load` are reported, and
    `router_aux_loss_coef` times it is trained where `MoeConfig.train_aux_loss` says so.
    """

    def step(state: TrainState, rest: Any, batch: Batch) -> tuple[TrainState, Metrics]:
        weights = state.params if streamed is None else streamed.device_params(state.params)
        wloss, grads, metrics, wsum = _weighted_loss_and_grads(
            loss_fn, parts, weights, rest, batch, num_micro_batches, grad_sharding
        )
        scale = jnp.where(wsum > 0, 1.0 / jnp.maximum(wsum, 1e-30), 0.0)
        loss = wloss * scale
        grads = jax.tree.map(lambda g: g * scale, grads)
        grad_norm = global_norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        # A non-finite step (and every step after it) keeps the previous values, so no NaN reaches the
        # parameters, the optimizer moments or a checkpoint; the loop reads bad_step and stops with a message.
        ok = finite & (state.bad_step < 0)
        if streamed is not None and streamed.placement.offloaded:
            new_params, new_opt = streamed.apply(grads, state.opt_state, state.params, ok)
        else:
            updates, new_opt = optimizer.update(grads, state.opt_state, state.params)
            keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)
            new_params = keep(optax.apply_updates(state.params, updates), state.params)
            new_opt = keep(new_opt, state.opt_state)
        new_state = state.replace(
            step=state.step + 1,
            params=new_params,
            opt_state=new_opt,
            bad_step=jnp.where((state.bad_step < 0) & ~finite, state.step, state.bad_step),
        )
        out = dict(metrics)
        out.pop(LOSS_WEIGHT, None)
        out["loss"] = loss
        out["grad_norm"] = grad_norm
        out["nonfinite"] = (~finite).astype(jnp.int32)
        if schedule is not None:
            out["lr"] = jnp.asarray(schedule(state.step), jnp.float32)
        return new_state, out

    return step


def make_eval_step(
    loss_fn: LossFn, parts: ModelParts, streamed: StreamedUpdate | None = None
) -> Callable[[Params, Any, Batch], Metrics]:
    """`(params, rest, batch) -> metrics` without gradients; metrics carry `loss_weight` for averaging batches.
    `streamed`: the weights live in host memory and are brought to the device as the train step brings them."""

    def step(params: Params, rest: Any, batch: Batch) -> Metrics:
        if streamed is not None:
            params = streamed.device_params(params)
        loss, metrics = with_router_aux_loss(loss_fn)(parts.merge(params, rest), batch)
        out = {k: v for k, v in metrics.items() if jnp.ndim(v) == 0}
        out["loss"] = loss
        out[LOSS_WEIGHT] = jnp.asarray(metrics.get(LOSS_WEIGHT, 1.0), jnp.float32)
        return out

    return step


def average_eval_metrics(results: list[dict[str, float]]) -> dict[str, float]:
    """Combines per-batch eval metrics with their `loss_weight` (sums for `num_*` / `*_sum`)."""
    if not results:
        return {}
    total = sum(r.get(LOSS_WEIGHT, 1.0) for r in results)
    out: dict[str, float] = {}
    for key in results[0]:
        if key == LOSS_WEIGHT:
            continue
        if _is_summed(key):
            out[key] = float(sum(r[key] for r in results))
        else:
            out[key] = float(sum(r[key] * r.get(LOSS_WEIGHT, 1.0) for r in results) / max(total, 1e-30))
    return out
