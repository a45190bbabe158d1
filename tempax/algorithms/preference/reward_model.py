"""Reward models: a scalar head on the decoder, trained with the Bradley-Terry loss on preference pairs.

    r(x, y) = w . h_last(x, y)

where h_last is the decoder's final-norm hidden state at the last non-padding token of the rendered conversation
(prompt + response through the chat template, exactly as training renders the chosen/rejected sides) and w a
[hidden] vector (Ouyang et al. 2022, InstructGPT; the same pooling as `transformers`' *ForSequenceClassification).
There is no bias: the Bradley-Terry loss -log sigmoid(r_c - r_r - m) sees only reward differences, so a bias
would get no gradient and only shift every score.

A trained reward model is saved as a folder

    config.json, model.safetensors, tokenizer files   the backbone as a Hugging Face causal-LM checkpoint
                                                      (adapters merged), loadable by `load_hf_checkpoint`
    score.safetensors                                 the head, `score.weight` [1, hidden] (HF's name and layout)
    reward_model.json                                 {"format": "tempax-reward-model", "version": 1, ...}

and `load_reward_model(folder)` / `RewardScorer` turn it back into a reward function with the API of
`tempax.rewards` — `fn(prompts, completions, **columns) -> list[float]` — that PPO or best-of-n can call.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tempax.algorithms.preference.batches import pair_mask, per_pair_mean, split_pairs
from tempax.algorithms.preference.losses import bradley_terry_loss
from tempax.errors import CheckpointError, ConfigError
from tempax.models.decoder import Decoder
from tempax.parallel.process import host_array

FORMAT = "tempax-reward-model"
FORMAT_VERSION = 1
HEAD_FILE = "score.safetensors"
META_FILE = "reward_model.json"

# The batch key of an optional per-pair Bradley-Terry margin ([2B], equal on a pair's two rows).
MARGIN = "margin"


def last_token_index(segment_ids: jax.Array) -> jax.Array:
    """[B] index of each row's last non-padding token (0 for an all-padding row).

    Example: segment_ids [[1, 1, 1, 0], [1, 0, 0, 0]] -> [2, 0].
    """
    t = segment_ids.shape[-1]
    idx = jnp.arange(t, dtype=jnp.int32)
    return jnp.max(jnp.where(segment_ids != 0, idx, 0), axis=-1)


class RewardModel(nnx.Module):
    """A decoder backbone and a linear scalar head read at the last non-padding token.

    Call: `rewards = model(tokens, positions=..., segment_ids=...)` -> [B] float32; one sequence per row
    (right- or left-padded; packed rows are not supported).
    """

    def __init__(self, backbone: Decoder, *, rngs: nnx.Rngs, head_init_std: float | None = None):
        self.backbone = backbone
        d = backbone.config.hidden_size
        # std 1/sqrt(d + 1) keeps initial rewards O(1) for a unit-RMS hidden state (final RMSNorm), so the first
        # sigmoid(r_c - r_r) is neither saturated nor exactly 1/2 (ties would score accuracy 0).
        std = 1.0 / math.sqrt(d + 1) if head_init_std is None else head_init_std
        with nnx.use_eager_sharding(False):
            self.score = nnx.Linear(
                d, 1, use_bias=False, param_dtype=jnp.float32, rngs=rngs,
                kernel_init=nnx.with_partitioning(nnx.initializers.normal(std), ("embed", None)),
            )

    @property
    def config(self) -> Any:
        """The backbone's `ModelConfig` (what memory plans, remat and precision switches read and set)."""
        return self.backbone.config

    @config.setter
    def config(self, value: Any) -> None:
        self.backbone.config = value

    def __call__(
        self, tokens: jax.Array, *, positions: jax.Array | None = None, segment_ids: jax.Array | None = None
    ) -> jax.Array:
        if segment_ids is None:
            segment_ids = jnp.ones(tokens.shape, jnp.int32)
        hidden, _ = self.backbone.hidden_states(tokens, positions=positions, segment_ids=segment_ids)
        last = last_token_index(segment_ids)
        h_bd = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
        # The head reads float32 whatever the compute dtype: rewards are compared across a batch and across runs.
        return self.score(h_bd.astype(jnp.float32))[:, 0]


def reward_scores(model: RewardModel, batch: dict[str, jax.Array]) -> jax.Array:
    """[R] rewards of the rows of a (stacked preference) batch."""
    return model(batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"])


@dataclass(frozen=True)
class RewardLoss:
    """`loss_fn(model, batch) -> (loss, metrics)` of reward-model training on stacked preference batches.

        L = mean over real pairs of -log sigmoid(r_c - r_r - m)

    m is `margin` (a constant) plus, when the batch carries it, the per-pair `margin` key (e.g. how strongly
    the rater preferred the chosen response; Touvron et al. 2023, Llama 2). Metrics: loss, chosen_reward,
    rejected_reward, reward_margin, accuracy (r_c > r_r), loss_weight (real pairs).
    """

    margin: float = 0.0

    def __call__(self, model: RewardModel, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
        rc, rr = split_pairs(reward_scores(model, batch))
        m = jnp.full(rc.shape, self.margin, jnp.float32)
        if MARGIN in batch:
            m = m + split_pairs(batch[MARGIN])[0]
        return per_pair_mean(
            lambda chosen, rejected, margin: bradley_terry_loss(chosen, rejected, margin=margin),
            {"chosen": rc, "rejected": rr, "margin": m},
            pair_mask(batch),
        )


# ---------------------------------------------------------------------------------------------- save / load


def save_reward_model(
    model: RewardModel, folder: str, *, tokenizer: Any = None, extra: dict[str, Any] | None = None
) -> str:
    """Writes the folder described in the module docstring.

    A backbone with LoRA adapters (or a quantized QLoRA base) is saved merged — W + (alpha / r) A B, dequantized —
    so the folder is a plain checkpoint that loads without knowing how it was trained.

    Args:
      model: the reward model.
      folder: where to write (created).
      tokenizer: a `Tokenizer` (or Hugging Face tokenizer) saved next to the weights, so the folder is
        self-contained.
      extra: more fields for reward_model.json (e.g. `max_length`, the length it was trained at).
    """
    from tempax.models.hf_io import save_hf_checkpoint, save_safetensors
    from tempax.models.lora import LoraLinear, merge_lora
    from tempax.models.quant import QuantizedLinear

    backbone = model.backbone
    if any(isinstance(m, (LoraLinear, QuantizedLinear)) for _, m in nnx.iter_modules(backbone)):
        backbone = merge_lora(backbone)
    os.makedirs(folder, exist_ok=True)
    save_hf_checkpoint(backbone, folder, tokenizer=tokenizer)
    kernel = np.asarray(jax.device_get(model.score.kernel[...]), np.float32)  # [D, 1]
    save_safetensors({"score.weight": np.ascontiguousarray(kernel.T)}, os.path.join(folder, HEAD_FILE))
    meta = {"format": FORMAT, "version": FORMAT_VERSION, "pooling": "last_token", "hidden_size": kernel.shape[0]}
    meta.update(extra or {})
    with open(os.path.join(folder, META_FILE), "w") as f:
        json.dump(meta, f, indent=2)
    return folder


def is_reward_model_folder(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, META_FILE))


def read_meta(folder: str) -> dict[str, Any]:
    """The reward_model.json of a saved reward model.

    Raises:
      CheckpointError: the folder is not a tempax reward model, or of a newer format version.
    """
    meta_path = os.path.join(folder, META_FILE)
    if not os.path.isfile(meta_path):
        raise CheckpointError(
            f"{folder} is not a tempax reward model (no {META_FILE}); pass the folder `tempax reward-model` "
            "saved (<run_dir>/reward_model)."
        )
    with open(meta_path) as f:
        meta = json.load(f)
    if meta.get("format") != FORMAT or int(meta.get("version", 0)) > FORMAT_VERSION:
        raise CheckpointError(f"{meta_path}: unsupported reward-model format {meta.get('format')!r} "
                              f"version {meta.get('version')!r}; this tempax reads version {FORMAT_VERSION}.")
    return meta


def load_reward_model(folder: str, *, with_tokenizer: bool = True) -> tuple[RewardModel, Any]:
    """(RewardModel, Tokenizer or None) from a folder written by `save_reward_model`.

    Raises:
      CheckpointError: the folder is not a tempax reward model or its head does not fit the backbone.
    """
    from safetensors.numpy import load_file

    from tempax.models.hf_io import load_hf_checkpoint

    read_meta(folder)
    backbone = load_hf_checkpoint(folder, progress=False)
    model = RewardModel(backbone, rngs=nnx.Rngs(0))
    weight = load_file(os.path.join(folder, HEAD_FILE)).get("score.weight")
    d = backbone.config.hidden_size
    if weight is None or weight.shape != (1, d):
        shape = None if weight is None else weight.shape
        raise CheckpointError(f"{folder}/{HEAD_FILE}: expected score.weight of shape (1, {d}), got {shape}")
    model.score.kernel.set_value(jnp.asarray(weight.T, jnp.float32))
    tokenizer = None
    if with_tokenizer:
        from tempax.models.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(folder)
    return model, tokenizer


# ---------------------------------------------------------------------------------------------- scoring


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
