"""Group-relative policy optimisation (GRPO, Dr. GRPO, DAPO, GSPO) on the shared RL layer (`tempax.rl`).

    losses.py      pure math: grpo_loss, token aggregation, GSPO's sequence ratio, dynamic sampling, entropy bonus
    config.py      GRPOConfig (recipe) and GRPOSettings (the algorithm knobs and variants)
    objective.py   the loss function for the shared train step (log-probs of the sampled completions)
    source.py      rollouts of the current policy as a batch source for Trainer.fit (GRPOSource) and its hooks
    trainer.py     main(GRPOConfig): `tempax grpo --config RECIPE.yaml`

Rollouts, advantage estimators, completion log-probs, the clipped surrogate and the KL estimator are shared with
PPO and live in `tempax.rl`. The config, objective, source and trainer names are imported lazily (they pull in
the training core and the generator).
"""

from tempax.algorithms.grpo.losses import (
    AGGREGATION_MODES,
    IMPORTANCE_LEVELS,
    aggregate_token_loss,
    dynamic_sampling_keep,
    entropy_bonus,
    grpo_loss,
    gspo_sequence_ratio,
)

_LAZY = {
    "GRPOConfig": "config", "GRPOSettings": "config", "VARIANTS": "config",
    "make_grpo_loss": "objective",
    "GRPOSource": "source", "make_grpo_trainer": "source", "grpo_hooks": "source",
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
    "dynamic_sampling_keep",
    "entropy_bonus",
    "grpo_loss",
    "gspo_sequence_ratio",
    *_LAZY,
]
