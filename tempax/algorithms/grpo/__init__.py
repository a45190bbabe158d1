"""Group-relative policy optimisation (GRPO, Dr. GRPO, DAPO, GSPO) and PPO building blocks."""

from tempax.algorithms.grpo.losses import (
    AGGREGATION_MODES,
    IMPORTANCE_LEVELS,
    aggregate_token_loss,
    clipped_surrogate,
    clipped_value_loss,
    dynamic_sampling_keep,
    gae,
    grpo_loss,
    group_advantages,
    gspo_sequence_ratio,
    kl_k3,
    overlong_penalty,
)

__all__ = [
    "AGGREGATION_MODES",
    "IMPORTANCE_LEVELS",
    "aggregate_token_loss",
    "clipped_surrogate",
    "clipped_value_loss",
    "dynamic_sampling_keep",
    "gae",
    "grpo_loss",
    "group_advantages",
    "gspo_sequence_ratio",
    "kl_k3",
    "overlong_penalty",
]
