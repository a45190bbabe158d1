"""Supervised fine-tuning: next-token cross-entropy (distillation: `tempax.algorithms.distill`)."""

from tempax.algorithms.sft.losses import causal_lm_loss

__all__ = ["causal_lm_loss"]
