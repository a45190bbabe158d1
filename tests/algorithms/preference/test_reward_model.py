"""Reward models: last-token pooling, the Bradley-Terry loss over stacked batches with margins, learning a synthetic
preference (full weights, LoRA, QLoRA), save/load, and the scorer as a reward function."""

from __future__ import annotations

import glob
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tempax.algorithms.preference.reward import MARGIN, RewardLoss
from tempax.models.reward_model import RewardModel, last_token_index, load_reward_model, save_reward_model
from tempax.rewards.reward_model import RewardScorer, reward_model_reward
from tempax.algorithms.preference.reward import RewardModelConfig, main, prepare
from tempax.configlib import from_dict, load_config
from tempax.data.packing import pad_examples
from tempax.data.preference import PreferenceOptions, collate_pairs, tokenize_preference_rows
from tempax.errors import CheckpointError
from tempax.rewards import combine_rewards
from tests.algorithms.preference.test_dpo import SEQ, SMALL, synthetic_rows, write_jsonl
from tests.kit.models import tiny_tempax_model
from tests.kit.tokenizers import tiny_chat_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(scope="module")
def tok():
    return tiny_chat_tokenizer()


@pytest.fixture(scope="module")
def files(tmp_path_factory, tok):
    d = tmp_path_factory.mktemp("rm")
    tok.hf.save_pretrained(str(d / "tok"))
    train = synthetic_rows(64, seed=0)
    for i, row in enumerate(train):
        row["gap"] = float(i % 3)  # a per-pair margin column
    return {
        "tok": str(d / "tok"),
        "train": write_jsonl(str(d / "train.jsonl"), train),
        "test": write_jsonl(str(d / "test.jsonl"), synthetic_rows(24, seed=1)),
    }


def rm_cfg(files: dict, run_dir: str, **sections) -> RewardModelConfig:
    cfg = {
        "model": {"source": "preset:tiny-llama", "tokenizer": files["tok"], "overrides": dict(SMALL)},
        "data": {"path": files["train"], "eval_path": files["test"]},
        "train": {"steps": 24, "batch_size": 16, "seq_len": SEQ, "run_dir": run_dir, "progress_bar": False,
                  "tensorboard": False, "mesh": {"num_devices": 1}, "checkpoint": {"save_at_end": False},
                  "optimizer": {"learning_rate": 1e-2, "schedule": "constant"}},
    }
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) and key in cfg else value
    return from_dict(RewardModelConfig, cfg)


def tiny_reward_model(seed: int = 0) -> RewardModel:
    return RewardModel(tiny_tempax_model("llama", seed=seed, **SMALL), rngs=nnx.Rngs(seed + 1))


@nnx.jit
def rewards_of(model, batch):
    return model(batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"])


# ---------------------------------------------------------------------------------------------- pooling and loss


def test_last_token_index_hand_example():
    """segment_ids [[1,1,1,0],[1,0,0,0],[0,0,0,0]]: last real tokens at 2 and 0; an all-padding row gives 0."""
    seg = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    assert last_token_index(seg).tolist() == [2, 0, 0]


def test_reward_is_read_at_the_last_real_token(tok):
    """Invariance: a sequence's reward is the same alone, right-padded in a batch, or with different tokens in its
    padding; changing its last real token changes it."""
    model = tiny_reward_model()
    pairs, _ = tokenize_preference_rows(synthetic_rows(3, 7), tok, PreferenceOptions(max_length=SEQ))
    examples = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    batch = pad_examples(examples, seq_len=SEQ, pad_id=tok.pad_id)
    r = np.asarray(rewards_of(model, batch))
    noisy = dict(batch, tokens=np.where(batch["segment_ids"] > 0, batch["tokens"], 7).astype(np.int32))
    np.testing.assert_allclose(np.asarray(rewards_of(model, noisy)), r, rtol=1e-6, atol=1e-6)
    wide = pad_examples(examples[::-1], seq_len=2 * SEQ, pad_id=tok.pad_id)
    np.testing.assert_allclose(np.asarray(rewards_of(model, wide))[::-1], r, rtol=1e-5, atol=1e-5)
    last = int(last_token_index(jnp.asarray(batch["segment_ids"]))[0])
    changed = dict(batch, tokens=batch["tokens"].copy())
    changed["tokens"][0, last] = (changed["tokens"][0, last] + 1) % 400
    assert abs(float(rewards_of(model, changed)[0]) - r[0]) > 1e-6


class FixedRewards(nnx.Module):
    """A stand-in reward model returning given rewards per row."""

    def __init__(self, rewards):
        self.rewards = jnp.asarray(rewards, jnp.float32)

    def __call__(self, tokens, *, positions=None, segment_ids=None):
        return self.rewards


def test_reward_loss_margins_and_padding_hand_numbers():
    """B = 3 (2 real pairs + 1 padding pair). Rewards chosen [2, 0, 9], rejected [1, 1, 0]; constant margin 0.5
    plus per-pair margins [0.5, 0, 0] -> m = [1.0, 0.5]:
      pair 0: -log sigmoid(2 - 1 - 1.0)   = log 2            = 0.693147
      pair 1: -log sigmoid(0 - 1 - 0.5)   = log(1 + e^1.5)   = 1.701413
    mean 1.197280; accuracy (r_c > r_r, no margin) = (1 + 0) / 2 = 0.5; reward_margin ((2-1) + (0-1)) / 2 = 0."""
    batch = {
        "tokens": jnp.zeros((6, 2), jnp.int32), "positions": jnp.zeros((6, 2), jnp.int32),
        "segment_ids": jnp.array([[1, 1], [1, 1], [0, 0], [1, 1], [1, 1], [0, 0]]),
        MARGIN: jnp.array([0.5, 0.0, 0.0, 0.5, 0.0, 0.0]),
    }
    loss, m = RewardLoss(margin=0.5)(FixedRewards([2.0, 0.0, 9.0, 1.0, 1.0, 0.0]), batch)
    assert float(loss) == pytest.approx((math.log(2) + math.log1p(math.exp(1.5))) / 2, rel=1e-6)
    assert float(m["accuracy"]) == 0.5 and float(m["reward_margin"]) == pytest.approx(0.0, abs=1e-7)
    assert float(m["loss_weight"]) == 2.0


def test_margin_field_rides_with_each_pair(files, tmp_path):
    """reward.margin_field=gap: row i of train.jsonl has gap = i % 3 (0-based), and each pair carries it on both
    of its rows in every batch."""
    run = prepare(rm_cfg(files, str(tmp_path / "run"), reward={"margin_field": "gap"}, data={"eval_path": None}),
                  log=lambda s: None)
    for item in run.train_batches.items:
        line = int(item.source.rsplit(":", 1)[1])
        assert item.values[MARGIN] == (float((line - 1) % 3),) * 2
    batch = next(run.train_batches)
    b = batch["tokens"].shape[0] // 2
    np.testing.assert_array_equal(batch[MARGIN][:b], batch[MARGIN][b:])
    assert set(np.unique(batch[MARGIN])) <= {0.0, 1.0, 2.0}


# ---------------------------------------------------------------------------------------------- learning, saving, scoring


@pytest.mark.parametrize("variant", [
    "full",
    # LoRA/QLoRA compile another step (~40 s on 2 busy cores); adapters + head training is also checked by
    # test_lora_trains_adapters_and_head below without a full run.
    pytest.param("lora", marks=pytest.mark.slow),
    pytest.param("qlora", marks=pytest.mark.slow),
])
def test_reward_model_learns_a_synthetic_preference(files, tmp_path, tok, variant):
    """Held-out preference accuracy reaches ~1; the saved folder loads back to the same rewards, and the scorer
    (the PPO-facing reward function) prefers every held-out chosen reply."""
    sections = {}
    if variant != "full":
        sections["lora"] = {"rank": 8, "alpha": 32.0, **({"quantize_base": "nf4", "block_size": 16}
                                                           if variant == "qlora" else {})}
    logs = []
    result = main(rm_cfg(files, str(tmp_path / variant), **sections), log=logs.append)
    after = result.extras["eval_after"]
    assert after["accuracy"] >= 0.95 and after["reward_margin"] > 1.0, after
    assert any("before" in line and "after" in line for line in logs)
    folder = result.extras["reward_model_dir"]
    assert os.path.isfile(os.path.join(folder, "score.safetensors"))

    scorer = reward_model_reward(folder, batch_size=8)  # what PPO / combine_rewards would call
    assert scorer.max_length == SEQ  # read from reward_model.json
    test_rows = [json.loads(l) for l in open(files["test"])]
    chosen = scorer([r["prompt"] for r in test_rows], [r["chosen"] for r in test_rows])
    rejected = scorer([r["prompt"] for r in test_rows], [r["rejected"] for r in test_rows])
    assert np.mean(np.array(chosen) > np.array(rejected)) >= 0.95
    # Saved and reloaded = trained (with adapters merged: equal up to float rounding); the scorer agrees.
    pairs, _ = tokenize_preference_rows(test_rows[:4], tok, PreferenceOptions(max_length=SEQ))
    batch = collate_pairs(pairs, seq_len=SEQ, pad_id=tok.pad_id)
    trained = np.asarray(rewards_of(result.model, batch))
    reloaded = np.asarray(rewards_of(load_reward_model(folder)[0], batch))
    np.testing.assert_allclose(reloaded, trained, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(reloaded[:4], np.array(chosen[:4]), rtol=1e-4, atol=1e-4)


def test_lora_trains_adapters_and_head(files, tmp_path):
    """With LoRA the trainable set is the adapters plus the scalar head, nothing else."""
    run = prepare(rm_cfg(files, str(tmp_path / "run"), lora={"rank": 4, "alpha": 8.0}), log=lambda s: None)
    keys = run.trainer.trainable_keys
    assert "score.kernel" in keys
    assert all(k == "score.kernel" or k.endswith(("lora_a", "lora_b")) for k in keys)


def test_save_load_roundtrip_and_scorer_renders_like_training(tmp_path, tok):
    """save -> load gives bit-identical rewards; the scorer tokenises (prompt, response) exactly like the training
    pairs' chosen side; and it plugs into `combine_rewards` as a reward function."""
    model = tiny_reward_model(seed=3)
    folder = save_reward_model(model, str(tmp_path / "rm"), tokenizer=tok, extra={"max_length": SEQ})
    loaded, loaded_tok = load_reward_model(folder)
    rows = synthetic_rows(5, seed=9)
    pairs, _ = tokenize_preference_rows(rows, tok, PreferenceOptions(max_length=SEQ))
    batch = collate_pairs(pairs, seq_len=SEQ, pad_id=tok.pad_id)
    np.testing.assert_array_equal(np.asarray(rewards_of(loaded, batch)), np.asarray(rewards_of(model, batch)))

    scorer = RewardScorer(loaded, loaded_tok, max_length=SEQ, batch_size=2)
    assert scorer.encode(rows[0]["prompt"], rows[0]["chosen"]) == pairs[0].chosen.tokens.tolist()
    scores = scorer([r["prompt"] for r in rows], [r["chosen"] for r in rows])
    np.testing.assert_allclose(scores, np.asarray(rewards_of(model, batch))[:5], rtol=1e-5, atol=1e-5)
    combined = combine_rewards({"rm": scorer}, timeout_s=None)
    out = combined([r["prompt"] for r in rows], [r["chosen"] for r in rows])
    assert out.per_function["rm"] == pytest.approx(scores) and out.failed_samples == {"rm": 0}


def test_loading_a_folder_that_is_not_a_reward_model_fails_clearly(tmp_path):
    with pytest.raises(CheckpointError, match="not a tempax reward model"):
        load_reward_model(str(tmp_path))


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "recipes", "reward_model_*.yaml"))))
def test_reward_model_recipes_parse_and_say_how_to_run(path):
    cfg = load_config(RewardModelConfig, path)
    text = open(path).read()
    assert text.startswith("#") and f"tempax reward-model --config recipes/{os.path.basename(path)}" in text
    assert cfg.train.batch_size % 2 == 0
