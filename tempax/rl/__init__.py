"""The RL layer GRPO and PPO share, below the algorithms and above the training core and the generator.

    rollout.py     prompts -> groups of sampled completions -> rewards -> advantages -> a fixed-shape batch
    advantages.py  pure math: advantage estimators (GRPO, Dr. GRPO, RLOO, REINFORCE++), multi-reward combination
    losses.py      pure math: clipped surrogate, k3 KL, DAPO's overlong penalty, GAE, clipped value loss
    logprobs.py    completion log-probs of a policy, each prompt run once for its group
    throughput.py  the generation / training time split of an on-policy step

An algorithm adds its loss and batch source on top (`tempax.algorithms.grpo`, `tempax.algorithms.ppo`).
"""
