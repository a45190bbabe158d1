"""A trained reward model as a reward function (`model:RUN_DIR` in a recipe's `rewards.functions`).

`RewardScorer` renders each (prompt, completion) the way reward-model training rendered its pairs and returns
the model's scores, with the API of every reward function here: `fn(prompts, completions, **columns)`.
The model itself and its folder format are `tempax.models.reward_model`.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx

from tempax.errors import ConfigError
from tempax.models.reward_model import RewardModel, load_reward_model, read_meta
from tempax.parallel.process import host_array


def _bucket(n: int, minimum: int = 32) -> int:
    """The next power of two >= n (at least `minimum`): few shapes, so few compilations."""
    return max(minimum, 1 << max(n - 1, 0).bit_length())


class RewardScorer:
    """A reward model as a reward function: `scorer(prompts, completions, **columns) -> list[float]`.

    Each (prompt, completion) is rendered like the training pairs — the prompt as the user turn (or a list of
    chat messages), the completion as the assistant reply, through the tokenizer's chat template — or, with
    `chat=False`, scored as the plain text prompt + completion. Text longer than `max_length` tokens keeps its
    last `max_length` tokens (training cut over-long prompts from the left, too). Rows are scored in batches of
    `batch_size`, padded to power-of-two lengths so a handful of shapes are compiled.

    Use it like any reward function, e.g. `combine_rewards({"rm": scorer}, timeout_s=None)`: pass no timeout (or
    call it once beforehand), since the first call of each padded length compiles the model.

    Args:
      model: the reward model.
      tokenizer: its tokenizer.
      max_length: the longest input in tokens.
      batch_size: rows per forward pass.
      chat: render through the chat template (the default) or score raw text.
    """

    __name__ = "reward_model"  # how reward logs name it (`tempax.rewards.combine_rewards`)

    def __init__(self, model: RewardModel, tokenizer: Any, *, max_length: int = 1024, batch_size: int = 8,
                 chat: bool = True):
        if max_length < 2 or batch_size < 1:
            raise ConfigError(
                f"reward scorer needs max_length >= 2 and batch_size >= 1, got {max_length} and {batch_size}"
            )
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size
        self.chat = chat
        graphdef, state = nnx.split(model)
        self._state = state

        @jax.jit
        def run(state: Any, tokens: jax.Array, segment_ids: jax.Array) -> jax.Array:
            return nnx.merge(graphdef, state)(tokens, segment_ids=segment_ids)

        self._run = run

    @property
    def nbytes(self) -> int:
        """Bytes of the reward model's arrays (what a memory plan counts for holding it)."""
        return sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(self._state))

    @classmethod
    def from_folder(cls, folder: str, *, max_length: int | None = None, **kwargs: Any) -> "RewardScorer":
        """A scorer for a saved reward model; `max_length` defaults to the length it was trained at."""
        max_length = max_length or int(read_meta(folder).get("max_length", 1024))
        model, tokenizer = load_reward_model(folder)
        return cls(model, tokenizer, max_length=max_length, **kwargs)

    def encode(self, prompt: str | list[dict[str, Any]], completion: str | list[dict[str, Any]]) -> list[int]:
        """Token ids of one (prompt, completion): strings are one user / one assistant turn, lists are messages."""
        if not self.chat:
            as_text = lambda v: v if isinstance(v, str) else "".join(m["content"] for m in v)
            ids = self.tokenizer.encode(as_text(prompt) + as_text(completion), add_special_tokens=False)
        else:
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            reply = [{"role": "assistant", "content": completion}] if isinstance(completion, str) else completion
            ids = self.tokenizer.apply_chat_template(messages + list(reply), tokenize=True)
        return list(ids)[-self.max_length :]

    def score_ids(self, sequences: Sequence[Sequence[int]]) -> list[float]:
        """Rewards of already tokenised sequences."""
        out: list[float] = []
        pad = self.tokenizer.pad_id
        for start in range(0, len(sequences), self.batch_size):
            chunk = [list(s)[-self.max_length :] for s in sequences[start : start + self.batch_size]]
            t = min(_bucket(max(len(s) for s in chunk)), self.max_length) if chunk else 1
            tokens = np.full((self.batch_size, t), pad, np.int32)
            segments = np.zeros((self.batch_size, t), np.int32)
            for i, s in enumerate(chunk):
                tokens[i, : len(s)] = s
                segments[i, : len(s)] = 1 if s else 0
            rewards = host_array(self._run(self._state, tokens, segments))  # NumPy in; output may span processes
            out.extend(float(r) for r in rewards[: len(chunk)])
        return out

    def __call__(self, prompts: list[Any], completions: list[str], **columns: Any) -> list[float]:
        """Rewards of (prompt, completion) pairs. A `prompt_messages` column (the prompts as chat messages, as
        GRPO and PPO rollouts pass it) is scored instead of the prompt texts, which are already chat-templated
        there and would otherwise be wrapped in a second user turn."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        if columns.get("prompt_messages") is not None and self.chat:
            prompts = list(columns["prompt_messages"])
        return self.score_ids([self.encode(p, c) for p, c in zip(prompts, completions)])


def reward_model_reward(folder: str, **kwargs: Any) -> RewardScorer:
    """The reward function `(prompts, completions, **columns) -> list[float]` of a saved reward model (for PPO,
    best-of-n or `tempax.rewards.combine_rewards`); keywords go to `RewardScorer`."""
    return RewardScorer.from_folder(folder, **kwargs)
