"""tempax.rl.rollout's host-side parts, on hand-built rollouts: the prompt sampler's epochs and resume, selecting
and joining groups, scoring with DAPO's overlong penalty, dynamic sampling's fill, the training batch's layout,
and the rollout's metrics. (Sampling a rollout from a model: tests/rl/test_episodes.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tempax.errors import DataError
from tempax.rl.rollout import (
    Prompt,
    PromptSampler,
    Rollout,
    build_batch,
    concat_rollouts,
    duplicate_fraction,
    episode_metrics,
    fill_with_spread,
    rollout_metrics,
    score,
)

PROMPTS = [Prompt(ids=(1,) * (i + 1), text=f"p{i}", columns={"answer": str(i)}) for i in range(5)]


def rollout(rewards: list[list[float]], *, tokens=None, first_prompt: int = 0) -> Rollout:
    """P x G groups of T = 3 tokens; a group is zero-spread when its rewards are all equal; lengths 1..3."""
    r = np.asarray(rewards, np.float32)
    p, g = r.shape
    tokens = np.arange(p * g * 3, dtype=np.int32).reshape(p, g, 3) if tokens is None else np.asarray(tokens)
    lengths = (np.arange(p * g, dtype=np.int32) % 3 + 1).reshape(p, g)
    return Rollout(
        prompts=PROMPTS[first_prompt:first_prompt + p], completion_tokens=tokens,
        completion_mask=(np.arange(3) < lengths[..., None]).astype(np.int32),
        logprobs=np.full((p, g, 3), -0.5, np.float32), lengths=lengths, truncated=lengths == 3,
        texts=[[f"c{i}{j}" for j in range(g)] for i in range(p)], rewards=r, reward_parts={"format": r.copy()},
        reward_failures={"format": 1}, advantages=r - r.mean(axis=1, keepdims=True),
        zero_spread=np.array([len(set(row)) == 1 for row in rewards]), seconds={"generation": 1.0},
        groups_sampled=p, zero_spread_sampled=sum(len(set(row)) == 1 for row in rewards))


def test_each_epoch_visits_every_prompt_once_and_a_restored_sampler_continues_alike():
    sampler = PromptSampler(PROMPTS, seed=3)
    first = sampler.next(5)
    assert sorted(q.text for q in first) == ["p0", "p1", "p2", "p3", "p4"]
    sampler.next(2)
    state = sampler.state()
    assert state == {"epoch": 1, "index": 2}
    ahead = sampler.next(6)
    resumed = PromptSampler(PROMPTS, seed=3)
    resumed.restore(state)
    assert resumed.next(6) == ahead
    assert [q.text for q in PromptSampler(PROMPTS, shuffle=False).next(7)] == ["p0", "p1", "p2", "p3", "p4", "p0",
                                                                               "p1"]
    with pytest.raises(DataError, match="no training prompts left"):
        PromptSampler([])


def test_select_and_concat_keep_groups_whole_and_sum_the_counts():
    a, b = rollout([[1, 0], [1, 1]]), rollout([[0, 0]], first_prompt=2)
    both = concat_rollouts([a, b])
    assert both.num_prompts == 3 and both.group_size == 2 and [q.text for q in both.prompts] == ["p0", "p1", "p2"]
    assert both.seconds == {"generation": 2.0} and both.reward_failures == {"format": 2}
    assert (both.groups_sampled, both.zero_spread_sampled) == (3, 2)
    picked = both.select([2, 0])
    assert [q.text for q in picked.prompts] == ["p2", "p0"] and picked.texts == [["c00", "c01"], ["c00", "c01"]]
    np.testing.assert_array_equal(picked.rewards, [[0, 0], [1, 0]])


def test_fill_with_spread_takes_groups_with_spread_first_then_pads_with_flat_ones():
    """Round 1: p0 spread, p1 flat; round 2: p2 flat, p3 spread. Three groups: p0, p3 (spread, in order), then
    p1 (the first flat one)."""
    out = fill_with_spread([rollout([[1, 0], [1, 1]]), rollout([[0, 0], [0, 1]], first_prompt=2)], 3)
    assert [q.text for q in out.prompts] == ["p0", "p3", "p1"]
    assert out.zero_spread.tolist() == [False, False, True]


def test_score_aligns_columns_and_adds_the_overlong_penalty():
    """Budget 8 tokens with a soft zone of 4: lengths 3 and 4 -> 0, 6 -> (4 - 6) / 4 = -0.5, 9 -> -1."""
    seen = {}

    def reward_fn(prompts, completions, **columns):
        seen.update(prompts=prompts, completions=completions, **columns)
        return SimpleNamespace(total=[1.0, 0.0, 1.0, 1.0], per_function={"correct": [1.0, 0.0, 1.0, 1.0]},
                               failed_samples={"correct": 0})

    lengths = np.array([[3, 6], [4, 9]])
    total, parts, failures = score(reward_fn, PROMPTS[:2], [["a", "b"], ["c", "d"]], lengths, max_new_tokens=8,
                                   overlong_penalty_tokens=4)
    assert seen == {"prompts": ["p0", "p0", "p1", "p1"], "completions": ["a", "b", "c", "d"],
                    "answer": ["0", "0", "1", "1"]}
    np.testing.assert_allclose(parts["overlong"], [[0.0, -0.5], [0.0, -1.0]])
    np.testing.assert_allclose(total, [[1.0, -0.5], [1.0, 0.0]])
    assert failures == {"correct": 0} and total.dtype == np.float32


def test_the_batch_left_pads_prompts_and_marks_completions_to_their_length():
    """Prompts p0 (1 id) and p1 (2 ids) left-padded to 3 with pad 9; completion segments 1 up to each length."""
    r = rollout([[1, 0], [1, 1]])
    batch = build_batch(r, prompt_len=3, pad_id=9, with_old_logp=True)
    np.testing.assert_array_equal(batch["prompt_tokens"], [[9, 9, 1], [9, 1, 1]])
    np.testing.assert_array_equal(batch["prompt_segments"], [[0, 0, 1], [0, 1, 1]])
    np.testing.assert_array_equal(batch["completion_segments"][0], [[1, 0, 0], [1, 1, 0]])
    assert batch["old_logp"].shape == (2, 2, 3) and batch["advantages"].dtype == np.float32
    assert "old_logp" not in build_batch(r, prompt_len=3, pad_id=9, with_old_logp=False)
    with pytest.raises(ValueError, match="prompt 1 has 2 tokens, more than the batch's prompt length 1"):
        build_batch(r, prompt_len=1, pad_id=9, with_old_logp=False)


def test_rollout_metrics_worked_by_hand():
    """Rewards [[1, 0], [1, 1]]: mean 0.75, std sqrt(3/16) = 0.4330; one of two groups flat; advantages
    [0.5, -0.5, 0, 0]: mean 0, abs mean 0.25; lengths 1, 2, 3, 1: mean 1.75, max 3, one truncated (length 3) of 4;
    no repeated completion."""
    m = rollout_metrics(rollout([[1, 0], [1, 1]]))
    assert m["reward/total_mean"] == 0.75 and m["reward/total_std"] == pytest.approx(0.4330127)
    assert m["reward/format_failures"] == 1.0 and m["groups/zero_spread_frac"] == 0.5
    assert (m["advantage/mean"], m["advantage/abs_mean"], m["advantage/max"], m["advantage/min"]) == (0, 0.25, 0.5,
                                                                                                      -0.5)
    assert (m["completion/length_mean"], m["completion/length_max"], m["completion/truncated_frac"]) == (1.75, 3, 0.25)
    assert m["completion/duplicate_frac"] == 0.0 and "episode/turns_mean" not in m


def test_episode_metrics_and_the_entropy_of_each_turn():
    """Two episodes of one group: turn_of [1 1 2] and [1 2 0]; turn 1's sampled tokens have log p -0.2, -0.4,
    -0.6 -> entropy estimate 0.4; turn 2's -1.0, -2.0 -> 1.5. 3 malformed of 3 + 5 calls -> rate 3/8."""
    r = rollout([[1, 0]])
    r.turns = np.array([[2, 2]])
    r.turn_of = np.array([[[1, 1, 2], [1, 2, 0]]])
    r.logprobs = np.array([[[-0.2, -0.4, -1.0], [-0.6, -2.0, 0.0]]], np.float32)
    r.env_metrics = {"tool_calls": np.array([[2.0, 3.0]]), "malformed_calls": np.array([[1.0, 2.0]])}
    r.prefilled_tokens, r.reprefill_tokens = 10, 30
    m = episode_metrics(r)
    assert m["entropy/turn_1"] == pytest.approx(0.4) and m["entropy/turn_2"] == pytest.approx(1.5)
    assert m["episode/malformed_call_rate"] == pytest.approx(3 / 8) and m["episode/tool_calls_mean"] == 2.5
    assert (m["episode/turns_mean"], m["episode/prefilled_tokens"], m["episode/reprefill_tokens"]) == (2.0, 5.0, 15.0)
    assert "episode/turns_mean" in rollout_metrics(r)


def test_duplicates_are_counted_within_a_group():
    """Group 0: [1 2], [1 2], [3 4] -> one repeat; group 1: three alike -> two repeats; 3 of 6 completions."""
    tokens = np.array([[[1, 2], [1, 2], [3, 4]], [[5, 0], [5, 0], [5, 0]]])
    assert duplicate_fraction(tokens) == 0.5
