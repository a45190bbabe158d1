"""The reward model: tempax's pairs for TRL's RewardTrainer, started from tempax's initial adapters and scalar head,
and the row's metric, the reward model's preference accuracy r(chosen) > r(rejected) on the held-out pairs.

Both models are the same function: tempax's `RewardModel` reads w . h at each sequence's last token with a [1,
hidden] head and no bias (`tempax.models.reward_model`), transformers' *ForSequenceClassification reads its `score`
layer (Linear(hidden, 1, bias=False)) at the rightmost token that is not the pad id, which is the last token
whenever no sequence ends with the pad id (checked by the TRL child). The head tempax's run draws (seed
train.seed + 2) is copied into `score`, and trains beside the adapters on both sides. Both losses are
-log sigmoid(r_c - r_r) averaged over the batch's pairs (TRL's centering term is off, as tempax has none).
"""

from __future__ import annotations

import os
from typing import Any

from bench.trl_sides.common import HEAD_FILE, INITIAL_ADAPTERS, TrlSide, check_lora, ordered, trl_arguments


def initial_reward_model(cfg: Any, out: str) -> str:
    """Writes the adapters (PEFT layout) and the scalar head (`score.safetensors`) tempax's reward-model run starts
    from to OUT/initial_adapters."""
    import numpy as np

    from tempax.algorithms.preference.reward import build_reward_model
    from tempax.models.hf_io import save_safetensors
    from tempax.models.lora import save_adapters

    check_lora(cfg)
    model, _, _ = build_reward_model(cfg)
    folder = save_adapters(model.backbone, os.path.join(out, INITIAL_ADAPTERS))
    kernel = np.asarray(model.score.kernel[...], np.float32)  # [hidden, 1]; transformers stores [1, hidden]
    save_safetensors({"score.weight": np.ascontiguousarray(kernel.T)}, os.path.join(folder, HEAD_FILE))
    return folder


def reward_rows(cfg: Any, base: str) -> tuple[list[dict], dict[str, Any]]:
    """RewardTrainer's rows (each pair's chosen and rejected sequences, prompt included, as tempax tokenised and
    truncated them, in tempax's order) and its arguments."""
    from tempax.algorithms.preference.data import build_preference_data
    from tempax.models.registry import load_tokenizer

    if cfg.reward.margin_field:
        raise SystemExit("bench/learning_trl.py maps a constant reward.margin only, not reward.margin_field")
    data = build_preference_data(cfg.data, load_tokenizer(base), seq_len=cfg.train.seq_len, seed=cfg.train.seed)
    rows = []
    for pair in ordered(cfg, list(data.train), cfg.train.batch_size // 2):
        row: dict[str, Any] = {"chosen_ids": [int(t) for t in pair.chosen.tokens],
                               "rejected_ids": [int(t) for t in pair.rejected.tokens]}
        if cfg.reward.margin:  # TRL subtracts a pair's `margin` inside the sigmoid, as tempax its constant one
            row["margin"] = cfg.reward.margin
        rows.append(row)
    return rows, trl_arguments(cfg, cfg.train.batch_size // 2, max_length=None, disable_dropout=True,
                               center_rewards_coefficient=None)


REWARD_SIDE = TrlSide("Reward", reward_rows, initial=initial_reward_model, reward_head=True)


def reward_model_from(base: str, adapters: str) -> Any:
    """tempax's `RewardModel` of the base with the adapters in `adapters` merged (as a saved reward model is) and
    the head saved beside them."""
    import jax.numpy as jnp
    from flax import nnx
    from safetensors.numpy import load_file

    from tempax.models.lora import load_adapters, merge_lora
    from tempax.models.registry import load
    from tempax.models.reward_model import RewardModel

    model = RewardModel(merge_lora(load_adapters(load(base)[0], adapters)), rngs=nnx.Rngs(0))
    model.score.kernel.set_value(jnp.asarray(load_file(os.path.join(adapters, HEAD_FILE))["score.weight"].T))
    return model


def reward_outcomes(cfg: Any, model: Any, pairs: list[Any], pad_id: int) -> list[bool]:
    """Per pair: does `model` score the chosen sequence above the rejected one? tempax's scoring
    (`reward_scores` on stacked pair batches, as its reward-model runs evaluate)."""
    import jax
    import numpy as np
    from flax import nnx

    from tempax.algorithms.preference.batches import pair_batches
    from tempax.models.reward_model import reward_scores

    graphdef, state = nnx.split(model)

    @jax.jit
    def scores(state: Any, batch: dict[str, Any]) -> jax.Array:
        return reward_scores(nnx.merge(graphdef, state), batch)

    per_batch = max(cfg.train.batch_size // 2, 1)
    correct: list[bool] = []
    for batch in pair_batches(pairs, batch_size=per_batch, seq_len=cfg.train.seq_len, pad_id=pad_id):
        rewards = np.asarray(scores(state, {k: batch[k] for k in ("tokens", "positions", "segment_ids")}))
        correct.extend(bool(c > r) for c, r in zip(rewards[:per_batch], rewards[per_batch:]))
    return correct[: len(pairs)]


def evaluate_reward_accuracy(cfg: Any, base: str, row_dir: str) -> dict[str, list[bool]]:
    """Per held-out pair, the outcome of the starting reward model ("before": tempax's initial head and adapters,
    the same for both sides), of tempax's saved reward model, and of TRL's adapters and head."""
    from tempax.algorithms.preference.data import build_preference_data
    from tempax.models.registry import load_tokenizer
    from tempax.models.reward_model import load_reward_model

    tokenizer = load_tokenizer(base)
    pairs = build_preference_data(cfg.data, tokenizer, seq_len=cfg.train.seq_len, seed=cfg.train.seed).eval
    models = {"before": os.path.join(row_dir, "trl", INITIAL_ADAPTERS),
              "tempax": os.path.join(row_dir, "tempax", "reward_model"), "trl": os.path.join(row_dir, "trl", "adapters")}
    result: dict[str, list[bool]] = {}
    for name, folder in models.items():
        if os.path.isdir(folder):
            model = load_reward_model(folder, with_tokenizer=False)[0] if name == "tempax" else \
                reward_model_from(base, folder)
            result[name] = reward_outcomes(cfg, model, pairs, tokenizer.pad_id)
    return result
