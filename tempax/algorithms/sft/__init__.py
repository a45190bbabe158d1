"""Supervised fine-tuning: next-token cross-entropy and logit distillation."""

from tempax.algorithms.sft.losses import causal_lm_loss, distillation_loss

__all__ = ["causal_lm_loss", "distillation_loss"]
