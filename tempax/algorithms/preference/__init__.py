"""Preference optimisation (DPO, IPO, hinge, ORPO, SimPO), KTO on unpaired feedback, and reward models.

  losses          pure losses of log-probs / rewards (`preference_loss`, `bradley_terry_loss`, ...)
  batches         stacked [2B, T] batches -> per-sequence log-probs, per-pair losses; reference log-probs and
                  margins stored with the pairs
  data            the `data:` recipe section of preference runs and its reports
  trainer         `DPOConfig`, `DPOLoss`, `main` — `tempax dpo`
  kto             `KTOConfig`, `KTOLoss`, `main` — `tempax kto`
  reward_trainer  `RewardModelConfig`, `RewardLoss`, `main` — `tempax reward-model` (the model itself:
                  `tempax.models.reward_model`; as a reward function: `tempax.rewards.reward_model`)

The trainers are not imported here (they pull in the training core); import them from their modules.
"""

from tempax.algorithms.preference.losses import (
    PREFERENCE_LOSS_NAMES,
    bradley_terry_loss,
    dpo_loss,
    hinge_loss,
    ipo_loss,
    kto_loss,
    orpo_loss,
    preference_loss,
    preference_loss_needs_reference,
    simpo_loss,
)

__all__ = [
    "PREFERENCE_LOSS_NAMES",
    "bradley_terry_loss",
    "dpo_loss",
    "hinge_loss",
    "ipo_loss",
    "kto_loss",
    "orpo_loss",
    "preference_loss",
    "preference_loss_needs_reference",
    "simpo_loss",
]
