"""PPO on the tiny model: the batch source's layout and resume, the loss's gradients, and learning a checkable
reward with a bounded KL.

The tiny model (2 layers, vocab 400) and the tiny chat tokenizer keep every test on CPU; most of the time is
compilation, so the tests share shapes (4 prompts x 2 completions x 8 tokens, mini-batches of 2 prompts).
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tempax.rl.rollout import PromptSampler, encode_prompts
from tempax.algorithms.ppo.config import PPOKnobsConfig
from tempax.algorithms.ppo.model import ActorCritic, trainable_filter
from tempax.algorithms.ppo.source import BATCH_KEYS, PPORollouts, make_ppo_loss
from tempax.rewards import combine_rewards
from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig
from tempax.train.loop import Trainer
from tests.kit.models import tiny_tempax_model
from tests.kit.tokenizers import tiny_chat_tokenizer

QUESTIONS = ["The quick brown fox", "How do I bake bread?", "Paris", "Numbers 0123"]


@pytest.fixture(scope="module")
def tok():
    return tiny_chat_tokenizer()


@pytest.fixture(scope="module")
def prompts(tok):
    rows = [{"prompt_messages": [{"role": "user", "content": q}]} for q in QUESTIONS]
    encoded, dropped = encode_prompts(tok, rows, max_prompt_len=64)
    assert dropped == 0
    return encoded


def e_fraction(prompts, completions, **columns):
    """A checkable reward: the share of the completion's characters that are the letter 'e'."""
    return [c.count("e") / max(len(c), 1) for c in completions]


# lam = 1: Monte-Carlo advantages (score - V), since the zero-initialised value head knows nothing at first.
SETTINGS = PPOKnobsConfig(group_size=8, max_new_tokens=8, kl_coef=0.01, epochs=2, mini_batches=2,
                          vf_coef=0.1, lam=1.0)


def build(tok, prompts, tmp_path, *, steps, lr=1e-2, settings=SETTINGS, lora=False, seed=0, **train_kw):
    policy = tiny_tempax_model("llama", vocab_size=400, num_layers=2)
    if lora:
        from tempax.models.lora import LoraConfig, apply_lora

        policy = apply_lora(policy, LoraConfig(rank=4, alpha=8.0), rngs=nnx.Rngs(1))
    model = ActorCritic(policy, rngs=nnx.Rngs(2))
    train_kw.setdefault("checkpoint", CheckpointConfig(every=0, save_at_end=False, async_save=False))
    cfg = TrainConfig(
        steps=steps, batch_size=2, seq_len=64, run_dir=str(tmp_path / "run"), log_every=1, progress_bar=False,
        tensorboard=False, check_memory=False, mesh=MeshConfig(num_devices=1),
        optimizer=OptimizerConfig(learning_rate=lr, schedule="constant", weight_decay=0.0), **train_kw,
    )
    source = PPORollouts(tok, combine_rewards({"e": e_fraction}), settings, PromptSampler(prompts, seed=seed),
                         prompt_len=24, batch_size=2, seed=seed, reference=None if lora else model.policy,
                         log=lambda s: None)
    trainer = Trainer(model, make_ppo_loss(settings), cfg, trainable=trainable_filter(lora), log=lambda s: None)
    source.attach(trainer)
    return trainer, source


@pytest.mark.heavy
def test_ppo_raises_a_checkable_reward_with_bounded_kl(tok, prompts, tmp_path):
    """Full-weight PPO on the tiny model, reward = share of 'e' characters in the completion (about 0.06 at the
    start; measured 0.056 -> 0.31 over 10 rollouts at lr 1e-2).

    First the batch source alone: a rollout of 4 prompts x 8 completions gives 2 mini-batches of 2 prompts x 2
    epochs (each epoch visits every prompt once), old log-probs equal the current policy's (ratio 1 on the first
    pass), advantages are whitened over valid tokens (mean 0, std 1), the KL to the reference is 0 before any
    update, and the rollout's metrics are reported once. Then restoring the source's starting state and training
    40 steps (10 rollouts) with `Trainer.fit`: the mean reward of the last three rollouts beats the first three
    by > 0.1, and the KL to the reference (k1 summed over a completion, beta = 0.01) stays below 25 nats."""
    trainer, source = build(tok, prompts, tmp_path, steps=40)
    start = source.state()
    batches = [next(source)]
    m = source.batch_metrics()
    batches += [next(source) for _ in range(3)]
    assert source.rollouts_done == 1 and source.batch_metrics() == {}
    for b in batches:
        assert set(b) == set(BATCH_KEYS)
        assert b["completion_tokens"].shape == (2, 8, 8) and b["prompt_tokens"].shape == (2, 24)
    epoch1 = sorted(map(tuple, np.concatenate([batches[0]["prompt_tokens"], batches[1]["prompt_tokens"]])))
    epoch2 = sorted(map(tuple, np.concatenate([batches[2]["prompt_tokens"], batches[3]["prompt_tokens"]])))
    assert epoch1 == epoch2 and len(set(epoch1)) == 4
    full = source._buffer
    adv = full["advantages"][full["completion_mask"] > 0]
    assert abs(adv.mean()) < 1e-5 and abs(adv.std() - 1) < 1e-3
    logp, _ = source.forward(batches[0])
    valid = batches[0]["completion_mask"] > 0
    np.testing.assert_allclose(logp[valid], batches[0]["old_logp"][valid], atol=1e-5)
    for key in ("reward/score_mean", "reward/e_mean", "kl/seq_mean", "kl/coef", "value/explained_variance",
                "completion/length_mean", "completion/truncated_frac", "perf/generation_s"):
        assert key in m, key
    assert abs(m["kl/seq_mean"]) < 1e-4

    source.restore(start)
    source.history.clear()
    result = trainer.fit(source)
    e = [m["reward/e_mean"] for m in source.history]
    assert [m["reward/e_mean"] for _, m in result.history if "reward/e_mean" in m] == e  # logged with the steps
    kl = [m["kl/seq_mean"] for m in source.history]
    assert len(e) == 10
    assert np.mean(e[-3:]) > np.mean(e[:3]) + 0.1, e
    assert max(kl) < 25.0, kl
    last = result.history[-1][1]
    for key in ("pg_loss", "value_loss", "clip_frac", "approx_kl", "entropy", "value_clip_frac"):
        assert key in last, key
    assert last["approx_kl"] > 0  # the last mini-batch of a rollout sees a policy three updates on


@pytest.mark.heavy
def test_loss_gives_gradients_to_policy_and_value_head(tok, prompts, tmp_path):
    """One mini-batch through `make_ppo_loss`: finite loss, non-zero gradients for the LoRA adapters and for the
    value head, ratio 1 on the first pass, and loss_weight = the valid-token count."""
    trainer, source = build(tok, prompts, tmp_path, steps=1, lora=True)
    batch = {k: jnp.asarray(v) for k, v in next(source).items()}
    loss_fn = make_ppo_loss(SETTINGS)
    params, rest = trainer.state.params, trainer.rest

    def f(p):
        return loss_fn(trainer.parts.merge(p, rest), batch)

    (loss, metrics), grads = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
    assert np.isfinite(float(loss))
    assert float(metrics["ratio_mean"]) == pytest.approx(1.0, abs=1e-4)
    assert float(metrics["loss_weight"]) == float(batch["completion_mask"].sum())
    head = [k for k in grads if "value_head" in k]
    adapters = [k for k in grads if "lora" in k]
    assert head and adapters and all("value_head" in k or "lora" in k for k in grads)
    assert max(float(jnp.abs(grads[k]).max()) for k in head) > 0
    assert max(float(jnp.abs(grads[k]).max()) for k in adapters) > 0




@pytest.mark.slow
def test_resumed_run_matches_the_uninterrupted_one(tok, prompts, tmp_path):
    """8 steps straight vs 6 steps, a checkpoint (taken mid-rollout: 4 mini-batches a rollout), and a fresh
    trainer resuming to 8: the source's state carries the unfinished rollout, so the weights agree."""
    straight, straight_source = build(tok, prompts, tmp_path / "a", steps=8)
    straight.fit(straight_source)
    first, source = build(tok, prompts, tmp_path / "b", steps=6,
                          checkpoint=CheckpointConfig(every=6, save_at_end=True, async_save=False))
    first.fit(source)
    assert source._queue, "the checkpoint should fall inside a rollout"
    first.close()
    resumed, source2 = build(tok, prompts, tmp_path / "b", steps=8,
                             checkpoint=CheckpointConfig(every=0, save_at_end=False, async_save=False))
    result = resumed.fit(source2)
    assert result.resumed_from == 6 and source2.rollouts_done == 2
    for key in straight.state.params:
        np.testing.assert_allclose(np.asarray(resumed.state.params[key]), np.asarray(straight.state.params[key]),
                                   atol=1e-6, err_msg=key)


@pytest.fixture(scope="module")
def reward_model_dir(tok, tmp_path_factory):
    """A tiny random reward model saved the way `tempax reward-model` saves one."""
    from tempax.models.reward_model import RewardModel, save_reward_model

    folder = str(tmp_path_factory.mktemp("rm") / "reward_model")
    rm = RewardModel(tiny_tempax_model("llama", vocab_size=400, num_layers=2, seed=3), rngs=nnx.Rngs(4))
    save_reward_model(rm, folder, tokenizer=tok, extra={"max_length": 64})
    return folder


def test_grpo_can_use_a_reward_model_as_a_reward_function(reward_model_dir, tok):
    """`model:RUN_DIR` in GRPO's rewards.functions is the reward model's score, read from the folder or the run dir
    above it, and given the prompt's chat messages (the `prompt_messages` column) rather than its rendered text."""
    import os

    from tempax.rewards.registry import RewardsConfig
    from tempax.rewards.registry import build_rewards
    from tempax.rewards.reward_model import RewardScorer

    scorer = RewardScorer.from_folder(reward_model_dir)
    messages = [{"role": "user", "content": "How do I bake bread?"}]
    expected = scorer.score_ids([scorer.encode(messages, "Knead it.")])[0]
    for path in (reward_model_dir, os.path.dirname(reward_model_dir)):
        reward = build_rewards(RewardsConfig(functions=(f"model:{path}", "length"), timeout_s=5.0))
        out = reward(["<rendered prompt>"], ["Knead it."], prompt_messages=[messages])
        assert out.per_function["reward_model"][0] == pytest.approx(expected, abs=1e-5)
        assert out.total[0] == pytest.approx(expected + len("Knead it.") / 100, abs=1e-5)
    plain = build_rewards(RewardsConfig(functions=(f"model:{reward_model_dir}",)))(["How do I bake bread?"],
                                                                                  ["Knead it."])
    assert plain.per_function["reward_model"][0] == pytest.approx(expected, abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("value", ["head", "critic"])
def test_main_trains_and_evaluates_against_a_reward_model(reward_model_dir, tok, tmp_path, value):
    """`main` end to end on a random-init tiny policy and a tiny reward model: the value head or a critic made
    from the reward model, before/after evaluation with KL 0 before training, eval.json, adapters, rollouts.jsonl,
    and a memory plan that counts the held reward model."""
    import json
    import os

    from tempax.algorithms.ppo.config import PPOConfig
    from tempax.algorithms.ppo.main import main
    from tempax.configlib import from_dict
    from tempax.train.metrics import read_metrics

    tok_dir = tmp_path / "tokenizer"
    tok.hf.save_pretrained(str(tok_dir))
    data = tmp_path / "pairs.jsonl"
    with open(data, "w") as f:
        for q in QUESTIONS:
            f.write(json.dumps({"chosen": f"\n\nHuman: {q}\n\nAssistant: yes", "rejected":
                                f"\n\nHuman: {q}\n\nAssistant: no"}) + "\n")
    cfg = from_dict(PPOConfig, {
        "model": {"source": "preset:tiny-llama", "tokenizer": str(tok_dir), "overrides": {"vocab_size": 400}},
        "lora": {"rank": 2, "alpha": 4.0},
        "reward_model": os.path.dirname(reward_model_dir),
        "data": {"path": str(data), "eval_path": str(data)},
        "ppo": {"value": value, "max_new_tokens": 4, "max_prompt_len": 64, "epochs": 1, "mini_batches": 2},
        "eval": {"num_prompts": 3, "batch_size": 2, "show": 2},
        "train": {"steps": 2, "batch_size": 2, "mesh": {"num_devices": 1}, "run_dir": str(tmp_path / "run"),
                  "progress_bar": False, "tensorboard": False,
                  "checkpoint": {"save_at_end": True, "async_save": False}},
    })
    messages = []
    run = main(cfg, log=messages.append)
    assert run.before is not None and run.after is not None
    assert abs(run.before.summary()["kl_mean"]) < 1e-4
    assert len(run.source.history) == 1
    for name in ("eval", "adapters"):
        assert os.path.exists(run.files[name])
    with open(run.files["eval"]) as f:
        ev = json.load(f)
    assert len(ev["examples"]) == 2 and "score_gain" in ev["comparison"]
    with open(os.path.join(cfg.train.run_dir, "eval_responses.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [r["stage"] for r in rows] == ["before"] * 3 + ["after"] * 3
    assert rows[3]["response"] == run.after.texts[0] and rows[3]["prompt"][-1]["role"] == "user"
    from tempax.rewards.reward_model import RewardScorer
    from tempax.eval.scoring import score_rows

    rescored, _, _ = score_rows(RewardScorer.from_folder(reward_model_dir), [dict(r) for r in rows])
    np.testing.assert_allclose([r["score"] for r in rescored], [r["score"] for r in rows], atol=1e-4)
    records = read_metrics(cfg.train.run_dir)
    assert len(records) == 2 and "reward/reward_model_mean" in records[0] and "kl/seq_mean" in records[0]
    assert "reward/reward_model_mean" not in records[1] and "value_loss" in records[1]
    assert any("held models" in m for m in messages), messages


def test_config_rejects_bad_settings():
    """Bad PPO settings fail at parse time with the key named; PPO's guard can warn or stop but not adjust."""
    from tempax.algorithms.ppo.config import PPOConfig
    from tempax.configlib import from_dict
    from tempax.errors import ConfigError

    for bad, word in (({"ppo": {"lam": 1.5}}, "ppo.gamma and ppo.lam"), ({"ppo": {"epochs": 0}}, "ppo.epochs"),
                      ({"ppo": {"kl_target": 6.0, "kl_coef": 0.0}}, "adaptive KL"),
                      ({"guard": {"action": "clip_higher"}}, "guard.action"),
                      ({"ppo": {"value": "both"}}, "value")):
        with pytest.raises(ConfigError, match=word):
            from_dict(PPOConfig, bad)
    assert from_dict(PPOConfig, {"ppo": {"kl_target": 6.0}}).ppo.kl_target == 6.0
