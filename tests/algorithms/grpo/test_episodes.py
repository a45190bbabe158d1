"""GRPO over multi-turn episodes: the user-written environment of examples/ plugged in by its recipe (2 steps),
exact resume in the middle of a rollout's passes, and every advantage estimator and RFT over episodes.

Tiny model (2 layers, vocab 400) and tokenizer; the recipe's model is swapped for it, everything else is the
recipe's (the environment, its options, the jsonl task rows).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tempax.algorithms.grpo.config import GRPOConfig, GRPOKnobsConfig
from tempax.algorithms.grpo.main import main as grpo_main
from tempax.algorithms.grpo.plan import GRPOPlan
from tempax.algorithms.grpo.source import GRPOSource, grpo_hooks, make_grpo_trainer
from tempax.algorithms.rft.config import RFTKnobsConfig
from tempax.algorithms.rft.source import RFTSource, kept_examples
from tempax.algorithms.rft.selection import completion_weights, select_completions
from tempax.configlib import load_config
from tempax.data.tasks.spec import read_task_rows
from tempax.envs.registry import EnvironmentConfig
from tempax.errors import ConfigError
from tempax.rewards import combine_rewards
from tempax.rl.rollout import PromptSampler, encode_prompts, sample_rollout
from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig
from tests.algorithms.grpo.test_objective import model, tok  # noqa: F401 - the shared tiny fixtures

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
RECIPE = os.path.join(ROOT, "recipes", "grpo_guess_number_env.yaml")
GUESS = EnvironmentConfig(name=os.path.join(ROOT, "examples", "guess_number_env.py") + ":GuessNumberEnvironment",
                          max_turns=2, max_episode_tokens=48)
SETTINGS = GRPOKnobsConfig(group_size=2, max_new_tokens=4, temperature=1.0, beta=0.0, num_iterations=2)


def reply_chars(prompts, completions, **columns):
    """A final-answer reward with spread inside a group: characters of the last reply / 10."""
    return [len(c) / 10.0 for c in completions]


@pytest.fixture(scope="module")
def prompts(tok):
    rows = read_task_rows(os.path.join(ROOT, "examples", "guess_number_tasks.jsonl"))
    encoded, _ = encode_prompts(tok, rows[:4], max_prompt_len=128, env_factory=GUESS.build(tok))
    return encoded


def two_tiny_steps(recipe, model, tok, run_dir, *overrides):
    """2 GRPO steps of an environment recipe with the tiny model: 4-token replies in a 24-token episode (`overrides`
    after these, e.g. a longer grpo.max_prompt_len for a tool list the tiny tokenizer spells out)."""
    cfg = load_config(GRPOConfig, recipe, [
        "train.steps=2", f"train.run_dir={run_dir}", "train.progress_bar=false", "train.tensorboard=false",
        "train.check_memory=false", "train.mesh.num_devices=1", "grpo.max_new_tokens=4", "env.max_episode_tokens=24",
        "grpo.max_prompt_len=128", *overrides])
    run = grpo_main(cfg, model=model, tokenizer=tok, log=lambda s: None)
    assert [s for s, _ in run.history] == [1, 2]
    return run


@pytest.mark.heavy
def test_the_user_environment_recipe_runs_two_steps(model, tok, tmp_path, monkeypatch):
    """recipes/grpo_guess_number_env.yaml with the tiny model: 2 GRPO steps over episodes of the example
    environment; every reward comes from it (rewards.functions is empty), each per-turn part logged."""
    monkeypatch.chdir(ROOT)  # the recipe names the environment and the rows relative to the repository root
    run = two_tiny_steps(RECIPE, model, tok, tmp_path)
    m = run.history[0][1]
    assert "reward/turn_mean" in m and 1.0 <= m["episode/turns_mean"] <= 4.0
    assert 0.0 < m["episode/policy_token_frac"] <= 1.0
    assert np.isfinite(run.losses).all()


def run(model, tok, prompts, run_dir, *, steps, every_n=0, settings=SETTINGS):
    cfg = TrainConfig(
        steps=steps, batch_size=2, mesh=MeshConfig(num_devices=1), run_dir=str(run_dir), tensorboard=False,
        progress_bar=False, check_memory=False, optimizer=OptimizerConfig(learning_rate=3e-2, schedule="constant"),
        checkpoint=CheckpointConfig(every=every_n, save_at_end=True, resume=True, async_save=False),
    )
    source = GRPOSource(tok, PromptSampler(prompts, seed=0), combine_rewards({"chars": reply_chars}),
                        GRPOPlan.build(settings, GUESS, tok), prompt_len=80)
    trainer = make_grpo_trainer(model, settings, source.plan, cfg, prompt_len=80, log=lambda s: None)
    try:
        result = trainer.fit(source, hooks=grpo_hooks(source))
    finally:
        trainer.close()
    return result, source


@pytest.mark.heavy
def test_resume_between_two_passes_over_an_episode_rollout_is_exact(model, tok, prompts, tmp_path):
    """num_iterations = 2 over episode rollouts: steps (1, 2) train on rollout 1, (3, 4) on rollout 2. A run
    killed after step 3 (its checkpoint holds rollout 2's episodes, tokens and masks, with 1 pass left) and
    resumed to 4 has the uninterrupted run's losses, episode rewards and weights exactly."""
    straight, _ = run(model, tok, prompts, tmp_path / "straight", steps=4)
    killed, source = run(model, tok, prompts, tmp_path / "killed", steps=3)
    assert source.state()["pending"]["passes_left"] == 1
    assert "completion_segments" in source.state()["pending"]["batch"]
    resumed, _ = run(model, tok, prompts, tmp_path / "killed", steps=4)
    assert resumed.resumed_from == 3
    assert killed.losses + resumed.losses == straight.losses
    assert killed.series("reward/total_mean") + resumed.series("reward/total_mean") == \
        straight.series("reward/total_mean")
    assert "episode/turns_mean" in straight.history[0][1]
    for key, value in straight.state.params.items():
        assert np.asarray(resumed.state.params[key]).tobytes() == np.asarray(value).tobytes(), key


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "reinforce_pp"])
@pytest.mark.heavy
def test_every_estimator_scores_episodes_by_their_rewards(model, tok, prompts, estimator):
    """Advantages come from each episode's reward (final reply + the environment's per-turn parts), whatever the
    estimator: within a group, a higher reward never gets a lower advantage."""
    rollout = sample_rollout(model, tok, prompts[:2], combine_rewards({"chars": reply_chars}), group_size=4,
                             max_new_tokens=4, temperature=1.0, seed=1, advantage=estimator,
                             env_factory=GUESS.build(tok), max_turns=2, episode_tokens=48)
    assert set(rollout.reward_parts) >= {"chars", "turn"}
    for r, a in zip(rollout.rewards, rollout.advantages):
        order = np.argsort(r, kind="stable")
        assert (np.diff(a[order]) >= -1e-6).all()


def test_rft_keeps_episodes_with_the_loss_on_the_policy_tokens_only(model, tok, prompts):
    """RFT over episodes: a kept episode becomes prompt + every episode token, the loss mask on the policy's
    replies only (the environment's hint is context, not a target)."""
    rollout = sample_rollout(model, tok, prompts[:2], combine_rewards({"chars": reply_chars}), group_size=2,
                             max_new_tokens=4, temperature=1.0, seed=2, advantage="dr_grpo",
                             env_factory=GUESS.build(tok), max_turns=2, episode_tokens=48)
    selection = select_completions(rollout.rewards, rollout.truncated, rollout.texts, threshold=-10.0, cap=2,
                                   allow_truncated=True)
    examples = kept_examples(rollout, selection.kept, completion_weights(selection.kept, weighting="uniform"))
    assert examples
    for (example, _), (i, j) in zip(examples, [(i, j) for i in range(2) for j in np.flatnonzero(selection.kept[i])]):
        n = len(rollout.prompts[i].ids)
        length = int(rollout.lengths[i, j])
        assert len(example.tokens) == n + length
        assert list(example.loss_mask[n:]) == list(rollout.completion_mask[i, j, :length].astype(bool))
    factory = GUESS.build(tok)
    source = RFTSource(tok, PromptSampler(prompts), combine_rewards({"chars": reply_chars}), RFTKnobsConfig(),
                       env_factory=factory, max_turns=GUESS.max_turns, episode_tokens=48)
    assert (source.env_factory, source.max_turns, source.episode_tokens) == (factory, GUESS.max_turns, 48)


@pytest.mark.heavy
def test_the_recipe_on_the_slot_engine_samples_what_the_batch_samples(model, tok, tmp_path, monkeypatch):
    """`grpo.rollout_engine=slots` with the recipe's group of 4 in 4 slots (one group at a time): the first step's episodes come from the same
    weights and random streams as on the batch engine, so its rollout metrics are equal; training goes on."""
    monkeypatch.chdir(ROOT)
    batch = two_tiny_steps(RECIPE, model, tok, tmp_path / "batch").history[0][1]
    slots = two_tiny_steps(RECIPE, model, tok, tmp_path / "slots", "grpo.rollout_engine=slots",
                           "grpo.rollout_slots=4")
    first = slots.history[0][1]
    for key in ("reward/total_mean", "episode/turns_mean", "completion/length_mean", "episode/policy_token_frac"):
        assert first[key] == pytest.approx(batch[key], abs=1e-6), key
    assert np.isfinite(slots.losses).all()


def test_fewer_slots_than_a_group_is_refused():
    with pytest.raises(ConfigError, match="rollout_slots=2 is below grpo.group_size=4"):
        GRPOKnobsConfig(group_size=4, rollout_engine="slots", rollout_slots=2).validate()
