"""Preference optimisation (DPO, IPO, hinge, ORPO, SimPO), KTO on unpaired feedback, and reward models.

  losses          pure losses of log-probs / rewards (`preference_loss`, `bradley_terry_loss`, ...)
  batches         stacked [2B, T] batches -> per-sequence log-probs, per-pair losses; reference log-probs and
                  margins stored with the pairs
  data            the `data:` recipe section of preference runs and its reports
  dpo             `DPOConfig`, `DPOLoss`, `main` — `tempax dpo`
  kto             `KTOConfig`, `KTOLoss`, `main` — `tempax kto`
  reward          `RewardModelConfig`, `RewardLoss`, `main` — `tempax reward-model` (the model itself:
                  `tempax.models.reward_model`; as a reward function: `tempax.rewards.reward_model`)

Nothing heavy is imported here (the registry reads `ALGORITHMS`); import the pieces from their modules.
"""

from tempax.algorithms.registry import Algorithm

ALGORITHMS = (
    Algorithm("dpo", "preference tuning (DPO, IPO, hinge, ORPO, SimPO) from a recipe",
              config="tempax.algorithms.preference.dpo:DPOConfig",
              main="tempax.algorithms.preference.dpo:main",
              knobs=("dpo",), renders_chat=True, reference_curve="dpo"),
    Algorithm("kto", "KTO on unpaired desirable / undesirable feedback from a recipe",
              config="tempax.algorithms.preference.kto:KTOConfig", main="tempax.algorithms.preference.kto:main",
              knobs=("kto",), renders_chat=True, reference_curve="kto"),
    Algorithm("reward-model", "train a Bradley-Terry reward model from a recipe",
              config="tempax.algorithms.preference.reward:RewardModelConfig",
              main="tempax.algorithms.preference.reward:main",
              knobs=("reward",), renders_chat=True, reference_curve="reward_model"),
)
