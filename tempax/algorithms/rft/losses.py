"""RFT's loss: the SFT next-token loss on the kept completions, each token weighted by its completion's weight.

    L = sum_{b,t} w_bt m_bt nll_bt / max(1, sum_{b,t} w_bt m_bt),     nll_bt = -log p(y_bt | y_<bt)

m is the assistant-only mask (the completion's tokens, its stop token included; never the prompt) and w the
weight of the completion a token belongs to (`selection.completion_weights`). With every weight 1 this is SFT's
token-mean cross-entropy (`causal_lm_loss`, normalize='tokens'): rejection-sampling fine-tuning (STaR, Zelikman
et al. 2022; ReST-EM, Singh et al. 2023; RFT, Yuan et al. 2023) is maximum likelihood on the policy's own
accepted samples. The denominator is reported as `loss_weight`, so gradient accumulation over micro-batches
reproduces the full-batch loss exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def weighted_sft_loss(
    token_logp_bt: jax.Array, loss_mask_bt: jax.Array, weight_bt: jax.Array
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The loss of the module docstring from per-token log-probs [batch, time] of the targets, the 0/1
    assistant-only mask and the per-token weights (all [batch, time]). The denominator is at least 1 (as in the
    fused SFT loss the trainer uses), so an all-zero mask gives 0.

    Returns (loss, metrics): `loss`, `loss_weight` (sum w m), `num_tokens` (sum m)."""
    coef = loss_mask_bt.astype(jnp.float32) * weight_bt.astype(jnp.float32)
    total = jnp.sum(coef)
    loss = -jnp.sum(coef * token_logp_bt) / jnp.maximum(total, 1.0)
    return loss, {"loss": loss, "loss_weight": total, "num_tokens": jnp.sum(loss_mask_bt.astype(jnp.float32))}
