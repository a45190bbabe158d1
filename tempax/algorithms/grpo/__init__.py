"""Group-relative policy optimisation (GRPO, Dr. GRPO, DAPO, GSPO) and PPO building blocks.

    losses.py   pure math: group advantages, clipped surrogate, GSPO ratio, k3 KL, aggregation, grpo_loss
    config.py   GRPOConfig (recipe) and GRPOSettings (the algorithm knobs and variants)
    rollout.py  prompts -> groups of completions -> rewards -> advantages -> a fixed-shape batch
    learner.py  the loss function for the shared train step (log-probs of the sampled completions)
    source.py   rollouts of the current policy as a batch source for Trainer.fit (GRPOSource) and its hooks
    trainer.py  main(GRPOConfig): `tempax grpo --config RECIPE.yaml`

The learner, source, config and trainer names are imported lazily (they pull in the training core and the generator).
"""

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

_LAZY = {
    "GRPOConfig": "config", "GRPOSettings": "config", "VARIANTS": "config",
    "completion_logprobs": "learner", "make_grpo_loss": "learner",
    "GRPOSource": "source", "make_grpo_trainer": "source", "grpo_hooks": "source",
    "PromptSampler": "rollout", "Rollout": "rollout", "build_batch": "rollout", "encode_prompts": "rollout",
    "sample_rollout": "rollout",
    "main": "trainer",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"tempax.algorithms.grpo.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'tempax.algorithms.grpo' has no attribute {name!r}")


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
    *_LAZY,
]
