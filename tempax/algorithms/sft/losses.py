"""Supervised fine-tuning losses: pure functions of logits, targets and masks (distillation losses live in
`tempax.algorithms.distill.losses`).

The loss returns `(scalar_loss, metrics)`; metrics are float32 arrays (scalars unless the key says
`per_example`). Sums and counts are reported alongside means so a train step that accumulates micro-batches can
recombine them exactly (the mean of micro-batch means is not the batch mean when token counts differ).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tempax.errors import ConfigError
from tempax.models.logprobs import masked_mean, masked_sum, token_logprobs

SFT_NORMALIZATIONS = ("tokens", "sequences")


def causal_lm_loss(
    logits_btv: jax.Array,
    targets_bt: jax.Array,
    loss_mask_bt: jax.Array,
    *,
    normalize: str = "tokens",
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Negative log-likelihood of the targets at masked positions (maximum-likelihood language modelling).

        nll_t = -log p(y_t | y_<t)
        normalize='tokens':    L = sum_{b,t} m_bt nll_bt / sum_{b,t} m_bt
        normalize='sequences': L = mean over rows with >= 1 masked token of (sum_t m_bt nll_bt / sum_t m_bt)

    'tokens' weights every supervised token equally (long answers dominate); 'sequences' weights every example
    equally. Rows with no masked token (batch padding) are left out of both, and an all-empty batch gives 0.

    Args:
      logits_btv: [batch, time, vocab] logits; position t predicts `targets_bt[:, t]` (see
        `tempax.models.logprobs.shift_for_next_token`).
      targets_bt: [batch, time] token ids.
      loss_mask_bt: [batch, time] 1 where the target is supervised.
      normalize: 'tokens' or 'sequences'.

    Returns:
      (loss, metrics) with metrics `loss`, `nll_sum` (sum of masked nll), `num_tokens`, `num_sequences` (rows with
      a supervised token), `token_accuracy` (argmax == target over masked positions) and `per_example_loss`
      ([batch] mean nll per row, 0 for empty rows).
    """
    if normalize not in SFT_NORMALIZATIONS:
        raise ConfigError(f"unknown SFT loss normalization {normalize!r}; choose one of {SFT_NORMALIZATIONS}")
    nll_bt = -token_logprobs(logits_btv, targets_bt)
    mask = loss_mask_bt.astype(jnp.float32)
    tokens_b = jnp.sum(mask, axis=-1)
    per_example = masked_mean(nll_bt, mask, axis=-1)
    has_tokens_b = (tokens_b > 0).astype(jnp.float32)
    num_sequences = jnp.sum(has_tokens_b)
    if normalize == "tokens":
        loss = masked_mean(nll_bt, mask)
    else:
        loss = jnp.sum(per_example * has_tokens_b) / jnp.maximum(num_sequences, 1.0)
    correct_bt = (jnp.argmax(logits_btv, axis=-1) == targets_bt).astype(jnp.float32)
    metrics = {
        "loss": loss,
        "nll_sum": masked_sum(nll_bt, mask),
        "num_tokens": jnp.sum(tokens_b),
        "num_sequences": num_sequences,
        "token_accuracy": masked_mean(correct_bt, mask),
        "per_example_loss": per_example,
    }
    return loss, metrics
