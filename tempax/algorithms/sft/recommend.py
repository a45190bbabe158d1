"""When `tempax recommend` proposes SFT or continued pre-training, and with which settings (the records'
`recommend` hooks; the decision procedure is `tempax.algorithms.recommend`)."""

from __future__ import annotations

import math
from typing import Any

from tempax.algorithms.recommend import Recommender, data_section, round_up, size_of
from tempax.data.stats import DataProfile


class SFTRecommender(Recommender):
    """Demonstrations (chats, prompt/completion rows): supervised fine-tuning on the assistant tokens, rows packed
    to a length that holds most examples whole."""

    command = "sft"
    method = "SFT"
    learning_rates = {"full": 2e-5, "lora": 2e-4, "qlora": 2e-4}
    loss_chunk_len = 64  # the fused head's logit chunk (`tempax.models.fused_head`)

    def suits(self, profile: DataProfile) -> tuple[list[str], list[str]] | None:
        if profile.kind not in ("messages", "prompt_completion"):
            return None
        return [
            f"the data holds demonstrations ({profile.kind.replace('_', '/')}; {size_of(profile)}): supervised "
            f"fine-tuning on the assistant tokens ({profile.loss_token_share:.0%} of the tokens carry loss)",
        ], ["with preference pairs of the same domain, DPO after SFT"]

    def packed_len(self, profile: DataProfile) -> int:
        """The row length packing aims at: the 95th-percentile example, so most are trained whole."""
        return profile.p95_tokens

    def seq_len(self, profile: DataProfile, context: int) -> int:
        return min(round_up(max(self.packed_len(profile), 256), 128), 2048, context)

    def items_per_epoch(self, profile: DataProfile, seq_len: int) -> float:
        return profile.total_tokens * 0.8 / seq_len  # packed rows, at a conservative 80% packing

    def epochs(self, profile: DataProfile) -> int:
        """Two passes over a small dataset (< 5M tokens), one over a large one."""
        return 1 if profile.total_tokens >= 5_000_000 else 2

    def schedule(self, profile: DataProfile, batch: int, seq_len: int) -> tuple[int, int]:
        epochs = self.epochs(profile)
        return epochs, max(math.ceil(epochs * profile.total_tokens / (batch * seq_len * 0.9)), 1)

    def sections(self, profile: DataProfile, adaptation: str) -> dict[str, Any]:
        return {"data": data_section(profile, eval_fraction=0.02, train_on="assistant")}


class PretrainRecommender(SFTRecommender):
    """Text without demonstrations or preferences (raw text, question/answer rows whose answers cannot be
    checked): continued pre-training on every token, documents packed and long ones split. It reads any rows as
    text, so it is the fallback when no other method claims the data."""

    command = "pretrain"
    method = "continued pre-training"
    fallback = True

    def suits(self, profile: DataProfile) -> tuple[list[str], list[str]] | None:
        if profile.kind == "qa":
            return [
                f"question/answer rows without a checkable final answer ({size_of(profile)}): no verifiable "
                "reward, so train on question + answer text (continued pre-training on the joined fields)",
            ], ["convert the rows to prompt/completion and run SFT to train on the answers only"]
        return [
            f"the data is raw text ({size_of(profile)}): continued pre-training, every token trained, documents "
            "packed and long ones split",
        ], ["for a new domain vocabulary, `tempax tokenizer extend` first and pre-train the extended model"]

    def packed_len(self, profile: DataProfile) -> int:
        return 1024  # documents have no natural length: long ones are split, short ones packed

    def epochs(self, profile: DataProfile) -> int:
        return 1

    def sections(self, profile: DataProfile, adaptation: str) -> dict[str, Any]:
        data = data_section(profile, eval_fraction=0.02, format="text", train_on="all", overlong="split")
        if profile.kind == "qa":
            data["text_fields"] = ["question", "answer"]
        return {"data": data}


SFT = SFTRecommender()
PRETRAIN = PretrainRecommender()
