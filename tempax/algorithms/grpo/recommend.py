"""When `tempax recommend` proposes GRPO, and with which settings (the record's `recommend` hook; the decision
procedure is `tempax.algorithms.recommend`)."""

from __future__ import annotations

import math
import os
from typing import Any

from tempax.algorithms.recommend import Recommender, reference_copy_bytes, round_up, size_of
from tempax.data.stats import DataProfile
from tempax.models.config import ModelConfig

CHECKABLE_MIN_FRACTION = 0.9  # share of qa rows with a checkable answer for GRPO
GROUP_SIZE = 8  # completions sampled per prompt


class GRPORecommender(Recommender):
    """Question/answer rows whose answers a checker can verify (GSM8K's "#### <number>"): RL with a verifiable
    reward, prompts sampled in groups."""

    command = "grpo"
    method = "GRPO"
    unit = " prompts"
    batch = 4
    rows_per_item = GROUP_SIZE
    learning_rates = {"full": 1e-6, "lora": 5e-5, "qlora": 5e-5}
    evaluates_loss = False  # it evaluates by generating on held-out problems

    def suits(self, profile: DataProfile) -> tuple[list[str], list[str]] | None:
        if profile.kind != "qa" or profile.checkable_fraction < CHECKABLE_MIN_FRACTION:
            return None
        return [
            f"the data holds prompts with checkable answers ({profile.checkable_fraction:.0%} of {size_of(profile)} "
            "end in '#### <number>'): a verifiable reward (format + answer correctness) lets RL optimise what is "
            "measured, with GRPO (Shao et al. 2024) needing no value model or reward model",
            "GRPO learns only where some of a prompt's samples are right: a model that never solves a problem "
            "gets no signal; watch groups/zero_spread_frac",
        ], [
            "SFT on the worked answers first (a warm-start teaching the answer format, as `tempax demo` does), "
            "then GRPO from that checkpoint: needed when the base model almost never gets the format right",
        ]

    @staticmethod
    def lengths(profile: DataProfile) -> tuple[int, int]:
        """(prompt length, completion length): the task's prompt adds a system turn on the answer format (~100
        tokens) to the question; a completion gets three quarters of a long example."""
        longest = min(profile.p95_tokens, 1024)
        return round_up(longest * 0.5 + 128, 64), round_up(longest * 0.75, 64)

    def seq_len(self, profile: DataProfile, context: int) -> int:
        return min(sum(self.lengths(profile)), context)

    def extra_bytes(self, model: ModelConfig, adaptation: str, rows: int, seq_len: int) -> int:
        kv_cache = 2 * model.num_layers * model.num_kv_heads * model.head_dim * rows * seq_len * 4  # float32 K, V
        return reference_copy_bytes(model, adaptation) + kv_cache

    def schedule(self, profile: DataProfile, batch: int, seq_len: int) -> tuple[int, int]:
        return 1, max(min(math.ceil(profile.rows / batch), 500), 1)

    def sections(self, profile: DataProfile, adaptation: str) -> dict[str, Any]:
        path = profile.path
        folder = path if os.path.isdir(path) else os.path.dirname(path)
        has_test = os.path.isfile(os.path.join(folder, "test.jsonl"))
        prompt_len, completion = self.lengths(profile)
        return {"task": {"name": "gsm8k", "source": folder if has_test else path},
                "grpo": {"beta": 0.04, "temperature": 1.0, "group_size": GROUP_SIZE, "max_prompt_len": prompt_len,
                         "max_new_tokens": completion},
                "eval": {"num_problems": 200 if has_test else 0}}

    def hyperparameters(self, profile: DataProfile) -> dict[str, Any]:
        prompt_len, completion = self.lengths(profile)
        return {"group_size": GROUP_SIZE, "max_prompt_len": prompt_len, "max_new_tokens": completion, "beta": 0.04}


GRPO = GRPORecommender()
