"""The TRL sides of bench/learning_trl.py's rows, one module per kind of row:

    common.py        what every row shares: TRL's optimiser settings from tempax's config, tempax's learning rate
                     per update, tempax's initial adapters, tempax's visiting order, and the TRL training child
    preference.py    DPO and KTO: tempax's pairs / unpaired rows for DPOTrainer and KTOTrainer; implicit-reward
                     accuracy on the held-out pairs
    sft.py           SFT: tempax's packed rows for SFTTrainer; per-example held-out loss
    reward_model.py  the reward model: tempax's pairs and initial head for RewardTrainer; reward accuracy on the
                     held-out pairs

Functions that build a row's inputs or score its models import tempax (and JAX); the TRL child imports only
torch, transformers, peft and TRL, so its process time is TRL's own.
"""
