"""When `tempax recommend` proposes DPO, and with which settings (the record's `recommend` hook; the decision
procedure is `tempax.algorithms.recommend`)."""

from __future__ import annotations

import math
import os
from typing import Any

from tempax.algorithms.recommend import Recommender, data_section, reference_copy_bytes, round_up, size_of
from tempax.data.stats import DataProfile
from tempax.models.config import ModelConfig


class DPORecommender(Recommender):
    """Preference pairs: DPO learns from the comparison directly, with no reward model and no sampling."""

    command = "dpo"
    method = "DPO"
    unit = " pairs"
    batch = 8
    rows_per_item = 2  # chosen and rejected
    learning_rates = {"full": 5e-7, "lora": 5e-5, "qlora": 5e-5}

    def suits(self, profile: DataProfile) -> tuple[list[str], list[str]] | None:
        if profile.kind != "preference":
            return None
        return [
            f"the data holds preference pairs (chosen / rejected; {size_of(profile)}): learn from the comparison "
            "directly with DPO (Rafailov et al. 2023), which needs no reward model and no sampling",
        ], [
            "reward model + PPO: `tempax reward-model` on these pairs, then PPO against it; it can keep improving "
            "past the fixed pairs with fresh samples, but holds policy, reference, reward and value models and is "
            "far more expensive and fragile; this command writes the DPO recipe only",
            "other DPO-family losses on the same recipe: dpo.loss=ipo | hinge | orpo | simpo",
        ]

    def seq_len(self, profile: DataProfile, context: int) -> int:
        return min(round_up(profile.p95_tokens, 128), 2048, context)

    def items_per_epoch(self, profile: DataProfile, seq_len: int) -> float:
        return profile.rows * 0.98  # the held-out 2% are not trained on

    def extra_bytes(self, model: ModelConfig, adaptation: str, rows: int, seq_len: int) -> int:
        return reference_copy_bytes(model, adaptation)

    def schedule(self, profile: DataProfile, batch: int, seq_len: int) -> tuple[int, int]:
        return 1, max(math.ceil(profile.rows / batch), 1)

    def sections(self, profile: DataProfile, adaptation: str) -> dict[str, Any]:
        # Held-out pairs: the folder's test split when it has one, else 2% of the rows (never the default
        # eval_path, which is HH-RLHF's test file whatever the data).
        held = ({"eval_path": profile.path, "eval_split": "test"} if profile.split and _has_split(profile.path, "test")
                else {"eval_path": None, "eval_fraction": 0.02})
        return {"data": data_section(profile, **held, max_eval_rows=200, overlong="truncate"),
                "dpo": {"loss": "sigmoid", "beta": 0.1,
                        "reference": "adapters_off" if adaptation != "full" else "batch"}}

    def hyperparameters(self, profile: DataProfile) -> dict[str, Any]:
        return {"beta": 0.1, "loss": "sigmoid"}


def _has_split(folder: str, split: str) -> bool:
    return os.path.isdir(folder) and any(n.split(".", 1)[0] == split for n in os.listdir(folder))


DPO = DPORecommender()
