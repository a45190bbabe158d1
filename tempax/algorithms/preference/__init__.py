"""Preference optimisation (DPO, IPO, hinge, ORPO, SimPO) and reward-model training losses."""

from tempax.algorithms.preference.losses import (
    PREFERENCE_LOSS_NAMES,
    bradley_terry_loss,
    dpo_loss,
    hinge_loss,
    ipo_loss,
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
    "orpo_loss",
    "preference_loss",
    "preference_loss_needs_reference",
    "simpo_loss",
]
