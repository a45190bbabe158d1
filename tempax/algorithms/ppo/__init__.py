"""RLHF with PPO (Schulman et al. 2017; Ziegler et al. 2019) on the shared training loop.

    losses.py   pure math: KL-penalised per-token rewards, missing-EOS penalty, adaptive KL controller,
                whitening, the clipped policy loss, approx-KL, explained variance (GAE and the value loss:
                `tempax.rl.losses`)
    model.py    ActorCritic: the policy plus a value head on its trunk, or a critic from the reward model
    config.py   PPOConfig (recipe) and PPOKnobsConfig (the algorithm knobs)
    source.py   PPORollouts (the batch source: rollouts -> mini-batches) and make_ppo_loss (the step's loss)
    main.py     main(PPOConfig): `tempax ppo --config RECIPE.yaml`

Nothing heavy is imported here (the registry reads `ALGORITHMS`); import the pieces from their modules.
"""

from tempax.algorithms.registry import Algorithm, RunModel

ALGORITHMS = (
    Algorithm("ppo", "RLHF with PPO against a trained reward model from a recipe",
              config="tempax.algorithms.ppo.config:PPOConfig", main="tempax.algorithms.ppo.main:main",
              card="Proximal Policy Optimization for RLHF (Schulman et al. 2017; Ziegler et al. 2019): replies "
                   "sampled from the policy, scored by a trained reward model less a KL penalty to the reference, "
                   "advantages from a value head (GAE), clipped policy and value updates.",
              on_policy=True, knobs=("ppo",), renders_chat=True, reference_curve="ppo", listing=50,
              model=RunModel("adapters", "adapters", note="its checkpoints hold the policy with its value head")),
)
