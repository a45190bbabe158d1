"""GRPO's loss function for the shared train step: the policy's log-probs of the sampled completions
(`tempax.rl.logprobs.completion_logprobs`, each prompt run once for its group) and `grpo_loss` on them.

The batches come from `tempax.algorithms.grpo.source.GRPOSource` (rollouts of the current policy) and the loop is
`Trainer.fit`; this module only turns a model and a batch into `(loss, metrics)`.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from tempax.algorithms.grpo.config import GRPOKnobsConfig
from tempax.algorithms.grpo.losses import entropy_bonus as entropy_bonus_term
from tempax.algorithms.grpo.losses import grpo_loss
from tempax.models.logprobs import masked_mean
from tempax.rl.logprobs import Batch, completion_logprobs
from tempax.rl.staleness import truncated_importance_weights


def make_grpo_loss(
    settings: GRPOKnobsConfig, *, entropy_bonus: bool = False
) -> Callable[[nnx.Module, Batch], tuple[jax.Array, dict[str, jax.Array]]]:
    """`loss_fn(model, batch)` for `tempax.train.Trainer`: `grpo_loss` on the batch of `build_batch`.

    `old_logp` is used when the batch holds it (num_iterations > 1), else pi_old = stop_gradient(pi); `ref_logp`
    when it holds it (beta > 0). `loss_weight` is the token count for 'token_mean' and the number of non-empty
    completions otherwise, so gradient accumulation over prompt micro-batches reproduces the full-batch loss.

    The knobs the collapse guard may change during a run travel in the batch as per-row values (traced, so the
    step is compiled once): `temperature`, `eps_high` and `entropy_coef` [P]; a batch without them uses
    `settings`. A batch of possibly stale rollouts (rollout workers with `max_staleness` > 0) holds the sampler's
    log-probs `sampler_logp` [P, G, T]; each token's clipped term is then weighted by the truncated importance
    weight min(pi_prox / mu, is_cap) (`tempax.rl.staleness`), pi_prox being `old_logp` when the batch holds it
    and the current policy with a stopped gradient otherwise. The entropy bonus (`losses.entropy_bonus`) is part of the loss when `settings.entropy_coef > 0` or
    `entropy_bonus` is set (the guard may switch it on); its entropy then keeps its gradient.
    """
    token_weighted = settings.loss_aggregation == "token_mean"
    with_bonus = entropy_bonus or settings.entropy_coef > 0

    def knob(batch: Batch, name: str, default: float) -> jax.Array | float:
        return batch[name][0] if name in batch else default

    def loss_fn(model: nnx.Module, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        logp, entropy = completion_logprobs(
            model, batch, temperature=knob(batch, "temperature", settings.temperature),
            with_entropy=settings.log_entropy or with_bonus, entropy_gradient=with_bonus,
        )
        p, g, t = logp.shape
        flat = lambda x: None if x is None else x.reshape(p * g, t)  # noqa: E731
        mask = flat(batch["completion_mask"])
        weights = None
        if "sampler_logp" in batch:
            proximal = flat(batch["old_logp"]) if "old_logp" in batch else jax.lax.stop_gradient(flat(logp))
            weights = truncated_importance_weights(proximal, flat(batch["sampler_logp"]), mask, cap=settings.is_cap)
        loss, metrics = grpo_loss(
            flat(logp), flat(batch.get("old_logp")), flat(batch.get("ref_logp")),
            batch["advantages"].reshape(p * g), mask,
            beta=settings.beta, eps_low=settings.epsilon, eps_high=knob(batch, "eps_high", settings.eps_high),
            aggregation=settings.loss_aggregation, importance=settings.importance_sampling, max_len=t,
            token_weights=weights,
        )
        metrics = dict(metrics)
        if with_bonus:
            bonus, bonus_metrics = entropy_bonus_term(
                flat(entropy), mask, coef=knob(batch, "entropy_coef", settings.entropy_coef),
                aggregation=settings.loss_aggregation, max_len=t,
            )
            loss = loss + bonus
            metrics.update(bonus_metrics)
        if entropy is not None:
            metrics["entropy"] = masked_mean(jax.lax.stop_gradient(flat(entropy)), mask)
        rows = jnp.sum((jnp.sum(mask, axis=-1) > 0).astype(jnp.float32))
        metrics["loss_weight"] = metrics["num_tokens"] if token_weighted else rows
        return loss, metrics

    loss_fn.has_entropy_bonus = with_bonus  # type: ignore[attr-defined] - what the guard's entropy_bonus needs
    return loss_fn
