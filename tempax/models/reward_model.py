"""Reward models: a scalar head on the decoder (trained by `tempax reward-model` with the Bradley-Terry loss).

    r(x, y) = w . h_last(x, y)

where h_last is the decoder's final-norm hidden state at the last non-padding token of the rendered conversation
(prompt + response through the chat template, exactly as training renders the chosen/rejected sides) and w a
[hidden] vector (Ouyang et al. 2022, InstructGPT; the same pooling as `transformers`' *ForSequenceClassification).
There is no bias: the Bradley-Terry loss -log sigmoid(r_c - r_r - m) sees only reward differences, so a bias would
get no gradient and only shift every score. Saved and loaded as a folder (`save_reward_model`); used as a reward
function by `tempax.rewards.reward_model.RewardScorer`.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tempax.errors import CheckpointError
from tempax.models.decoder import Decoder
from tempax.models.hf_io import load_hf_checkpoint, save_hf_checkpoint, save_safetensors
from tempax.models.lora import LoraExperts, LoraLinear, merge_lora
from tempax.models.quant import QuantizedLinear
from tempax.models.tokenizer import load_tokenizer

FORMAT = "tempax-reward-model"
FORMAT_VERSION = 1
HEAD_FILE = "score.safetensors"
META_FILE = "reward_model.json"

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


# ---------------------------------------------------------------------------------------------- save / load


def save_reward_model(
    model: RewardModel, folder: str, *, tokenizer: Any = None, extra: dict[str, Any] | None = None
) -> str:
    """Writes the reward model's folder:

        config.json, model.safetensors, tokenizer files   the backbone as a Hugging Face causal-LM checkpoint
                                                          (adapters merged), loadable by `load_hf_checkpoint`
        score.safetensors                                 the head, `score.weight` [1, hidden] (HF's name and layout)
        reward_model.json                                 {"format": "tempax-reward-model", "version": 1, ...}

    `load_reward_model(folder)` reads it back.

    A backbone with LoRA adapters (or a quantized QLoRA base) is saved merged — W + (alpha / r) A B, dequantized —
    so the folder is a plain checkpoint that loads without knowing how it was trained.

    Args:
      model: the reward model.
      folder: where to write (created).
      tokenizer: a `Tokenizer` (or Hugging Face tokenizer) saved next to the weights, so the folder is
        self-contained.
      extra: more fields for reward_model.json (e.g. `max_length`, the length it was trained at).
    """
    backbone = model.backbone
    if any(isinstance(m, (LoraLinear, LoraExperts, QuantizedLinear)) for _, m in nnx.iter_modules(backbone)):
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


# The folder a `tempax reward-model` run saves its reward model in (`reward.save_dir`'s default).
RUN_FOLDER = "reward_model"


def reward_model_folder(path: str) -> str:
    """The saved reward model of `path`: the folder itself, or `<run_dir>/reward_model` of a training run.

    Raises:
      CheckpointError: neither holds one; the message says which command writes it.
    """
    inner = os.path.join(path, RUN_FOLDER)
    if is_reward_model_folder(path) or not os.path.isdir(path):
        return path  # `read_meta` names what is missing
    if is_reward_model_folder(inner):
        return inner
    if os.path.isfile(os.path.join(path, "config.yaml")):  # a training run's directory
        raise CheckpointError(
            f"{path} holds no saved reward model (no {RUN_FOLDER}/{META_FILE}): a `tempax reward-model` run writes "
            f"it when it finishes (finish this one with `tempax reward-model --config {path}/config.yaml`); a run of "
            "another command trained no reward model"
        )
    return path


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
        tokenizer = load_tokenizer(folder)
    return model, tokenizer
