"""RLHF with PPO (Schulman et al. 2017; Ziegler et al. 2019) on the shared training loop.

    losses.py   pure math: KL-penalised per-token rewards, missing-EOS penalty, adaptive KL controller, GAE,
                whitening, clipped policy and value losses, approx-KL, explained variance
    model.py    ActorCritic: the policy plus a value head on its trunk, or a critic from the reward model
    config.py   PPOConfig (recipe) and PPOSettings (the algorithm knobs)
    source.py   PPORollouts (the batch source: rollouts -> mini-batches) and make_ppo_loss (the step's loss)
    trainer.py  main(PPOConfig): `tempax ppo --config RECIPE.yaml`

Only the math is imported eagerly; the rest pulls in the training core and the generator.
"""

from tempax.algorithms.ppo.losses import (
    adaptive_kl_coef,
    approx_kl,
    explained_variance,
    kl_penalized_rewards,
    last_token_mask,
    missing_eos_penalty,
    ppo_loss,
    ppo_policy_loss,
    whiten,
)

_LAZY = {
    "PPOConfig": "config", "PPOSettings": "config", "ActorCritic": "model", "policy_and_values": "model",
    "trainable_filter": "model", "PPORollouts": "source", "make_ppo_loss": "source", "main": "trainer",
    "evaluate_policy": "trainer",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"tempax.algorithms.ppo.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'tempax.algorithms.ppo' has no attribute {name!r}")


__all__ = [
    "adaptive_kl_coef", "approx_kl", "explained_variance", "kl_penalized_rewards",
    "last_token_mask", "missing_eos_penalty", "ppo_loss", "ppo_policy_loss", "whiten", *_LAZY,
]
