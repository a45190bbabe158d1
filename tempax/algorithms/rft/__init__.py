"""Rejection-sampling fine-tuning (RFT / STaR / ReST-EM / expert iteration): sample k completions per problem with
the current policy, keep those the checker accepts (deduplicated, capped per problem), fine-tune on them with the
SFT loss, repeat.

    selection.py  pure: accept / dedup / cap masks and per-completion loss weights
    losses.py     pure: the weighted SFT loss
    config.py     RFTConfig (recipe) and RFTSettings (the algorithm knobs)
    source.py     rounds of the current policy's accepted samples as a batch source for Trainer.fit (RFTSource)
    trainer.py    main(RFTConfig): `tempax rft --config RECIPE.yaml`
"""

from tempax.algorithms.rft.losses import weighted_sft_loss
from tempax.algorithms.rft.selection import (
    WEIGHTINGS,
    Selection,
    accept_mask,
    cap_mask,
    completion_weights,
    dedup_mask,
    normalize_completion,
    select_completions,
)

__all__ = [
    "WEIGHTINGS", "Selection", "accept_mask", "cap_mask", "completion_weights", "dedup_mask",
    "normalize_completion", "select_completions", "weighted_sft_loss",
]
