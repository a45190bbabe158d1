"""Group-relative policy optimisation (GRPO, Dr. GRPO, DAPO, GSPO) on the shared RL layer (`tempax.rl`).

    losses.py      pure math: grpo_loss, token aggregation, GSPO's sequence ratio, dynamic sampling, entropy bonus
    config.py      GRPOConfig (recipe) and GRPOKnobsConfig (the algorithm knobs and variants)
    objective.py   the loss function for the shared train step (log-probs of the sampled completions)
    plan.py        GRPOPlan: what a run derives from its recipe once (rollout options, the environment, passes)
    source.py      rollouts of the current policy as a batch source for Trainer.fit (GRPOSource) and its hooks
    main.py        main(GRPOConfig): `tempax grpo --config RECIPE.yaml`

Rollouts, advantage estimators, completion log-probs, the clipped surrogate and the KL estimator are shared with
PPO and live in `tempax.rl`. Nothing heavy is imported here (the registry reads `ALGORITHMS`); import the
pieces from their modules.
"""

from tempax.algorithms.registry import Algorithm

ALGORITHMS = (
    Algorithm("grpo", "GRPO / DAPO / GSPO with verifiable rewards from a recipe",
              config="tempax.algorithms.grpo.config:GRPOConfig", main="tempax.algorithms.grpo.main:main",
              card="Group Relative Policy Optimization (Shao et al. 2024): groups of completions sampled per "
                   "prompt and scored by reward functions, each completion's advantage its reward relative to its "
                   "group's, a clipped policy-gradient step (variants: Dr. GRPO, DAPO, GSPO).",
              on_policy=True, knobs=("grpo",), renders_chat=True, reference_curve="grpo",
              recommend="tempax.algorithms.grpo.recommend:GRPO", listing=30),
)
