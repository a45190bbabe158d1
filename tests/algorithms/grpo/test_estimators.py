"""Each advantage estimator (grpo, dr_grpo, rloo, reinforce_pp) and the normalise-each reward combination drives a
checkable reward up on a tiny model through the one loop (`GRPOSource` + `Trainer.fit`), and is the one in effect.

The task: reward = share of the letter 'e' in the completion (about 0.05 for the random tiny model). Full-weight
training, 4 prompts x 8 completions x 8 tokens a step, lr 3e-2, no KL. Every run starts from the same weights and
seed, so the first rollout is the same sampled text for every estimator and only its advantages differ; the
trainers share one shape, so the step compiles once (tests/kit/compile_cache.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from tempax.algorithms.grpo.config import GRPOKnobsConfig
from tempax.rl.rollout import PromptSampler
from tempax.algorithms.grpo.plan import GRPOPlan
from tempax.algorithms.grpo.source import GRPOSource, grpo_hooks, make_grpo_trainer
from tempax.rewards import combine_rewards
from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig
from tests.algorithms.grpo.test_objective import e_fraction, model, prompts, tok  # noqa: F401 - shared fixtures
from tests.kit.compile_cache import persistent_compile_cache

STEPS = 10


def o_fraction(prompts, completions, **columns):
    """A second checkable reward: the share of the letter 'o'."""
    return [c.count("o") / max(len(c), 1) for c in completions]


@pytest.fixture(scope="module", autouse=True)
def compile_once(tmp_path_factory):
    with persistent_compile_cache(tmp_path_factory.mktemp("xla-cache")):
        yield


def train(model, tok, prompts, run_dir, rewards, **settings):
    s = GRPOKnobsConfig(group_size=8, max_new_tokens=8, temperature=1.0, beta=0.0, **settings)
    cfg = TrainConfig(
        steps=STEPS, batch_size=4, mesh=MeshConfig(num_devices=1), run_dir=str(run_dir), tensorboard=False,
        progress_bar=False, check_memory=False, optimizer=OptimizerConfig(learning_rate=3e-2, schedule="constant"),
        checkpoint=CheckpointConfig(save_at_end=False, resume=False),
    )
    source = GRPOSource(tok, PromptSampler(prompts, seed=0), combine_rewards(rewards), GRPOPlan.build(s), prompt_len=24)
    trainer = make_grpo_trainer(model, s, source.plan, cfg, prompt_len=24, log=lambda text: None)
    try:
        return trainer.fit(source, hooks=grpo_hooks(source))
    finally:
        trainer.close()


@pytest.fixture(scope="module")
def runs(model, tok, prompts, tmp_path_factory):
    """One run per estimator (sum of one reward), and GDPO-style normalize_each with two rewards."""
    out = {}
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp"):
        out[name] = train(model, tok, prompts, tmp_path_factory.mktemp(name), {"e": e_fraction}, advantage=name)
    out["normalize_each"] = train(model, tok, prompts, tmp_path_factory.mktemp("each"),
                                  {"e": e_fraction, "o": o_fraction}, reward_combination="normalize_each")
    return out


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp"])
@pytest.mark.heavy
def test_every_estimator_learns_the_synthetic_reward(runs, name):
    """Mean 'e' share of the last three steps exceeds the first three's by more than 0.1."""
    e = [m["reward/e_mean"] for _, m in runs[name].history]
    assert len(e) == STEPS
    assert np.mean(e[-3:]) > np.mean(e[:3]) + 0.1, (name, e)


def test_the_configured_estimator_is_the_one_in_effect(runs):
    """Step 1 trains on the same rollout in every run: same rewards, estimator-specific advantages.
    rloo = G/(G-1) x dr_grpo = 8/7 x dr_grpo (mean |A|); grpo and reinforce_pp are scaled to unit std (per group
    / over the batch), so their |A| differ from dr_grpo's, whose scale is the reward's (shares of about 0.05)."""
    first = {k: r.history[0][1] for k, r in runs.items()}
    rewards = {k: m["reward/e_mean"] for k, m in first.items()}
    assert len({round(v, 6) for v in rewards.values()}) == 1, rewards
    abs_mean = {k: m["advantage/abs_mean"] for k, m in first.items()}
    assert abs_mean["rloo"] == pytest.approx(8 / 7 * abs_mean["dr_grpo"], rel=1e-4)
    assert abs_mean["dr_grpo"] < 0.2 < abs_mean["grpo"] and abs_mean["reinforce_pp"] > 0.2
    assert abs_mean["grpo"] != pytest.approx(abs_mean["reinforce_pp"], rel=1e-3)


def test_normalize_each_learns_with_both_rewards_visible(runs):
    """Two rewards normalised within their groups before the sum: each one's values are logged (reward/e_mean,
    reward/o_mean) beside the weighted total, the batch-normalised advantages have std ~1, and the total climbs."""
    history = [m for _, m in runs["normalize_each"].history]
    assert {"reward/e_mean", "reward/o_mean", "reward/total_mean"} <= set(history[0])
    assert history[0]["advantage/std"] == pytest.approx(1.0, abs=0.02)
    total = [m["reward/total_mean"] for m in history]
    assert np.mean(total[-3:]) > np.mean(total[:3]) + 0.1, total
