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

from tempax.algorithms.registry import Algorithm, RunModel

ALGORITHMS = (
    Algorithm("dpo", "preference tuning (DPO, IPO, hinge, ORPO, SimPO) from a recipe",
              config="tempax.algorithms.preference.dpo:DPOConfig",
              main="tempax.algorithms.preference.dpo:main",
              card="Direct Preference Optimization (Rafailov et al. 2023) or a variant of its loss (IPO, hinge, "
                   "ORPO, SimPO): the policy's log-probability margin between chosen and rejected replies, "
                   "relative to a frozen reference, pushed up; no reward model, no sampling.",
              knobs=("dpo",), renders_chat=True, reference_curve="dpo",
              recommend="tempax.algorithms.preference.recommend:DPO", listing=20),
    Algorithm("kto", "KTO on unpaired desirable / undesirable feedback from a recipe",
              config="tempax.algorithms.preference.kto:KTOConfig", main="tempax.algorithms.preference.kto:main",
              card="Kahneman-Tversky Optimization (Ethayarajh et al. 2024): unpaired desirable and undesirable "
                   "replies, each pushed above or below a reference point (a KL estimate to the frozen reference) "
                   "through a prospect-theory value function.",
              knobs=("kto",), renders_chat=True, reference_curve="kto", listing=20),
    Algorithm("reward-model", "train a Bradley-Terry reward model from a recipe",
              config="tempax.algorithms.preference.reward:RewardModelConfig",
              main="tempax.algorithms.preference.reward:main",
              card="A Bradley-Terry reward model (Ouyang et al. 2022): a scalar head on the language model, "
                   "trained so that chosen replies score above rejected ones; its scores rank replies and reward "
                   "PPO.",
              knobs=("reward",), renders_chat=True, reference_curve="reward_model", listing=20,
              model=RunModel("none", note="it scores replies and has no policy to generate with or train; score "
                             "with `tempax score {run_dir}`, reward with `model:{run_dir}` in rewards.functions, "
                             "or pass its model.source ({source}) for a policy")),
)
