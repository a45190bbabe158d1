"""tempax.rl.rollout_state: prompts and rollouts as JSON and back, bit for bit, every field included (what a
checkpoint keeps of rollouts sampled but not yet trained on, and what rollout workers send)."""

from __future__ import annotations

import json

import numpy as np

from tempax.rl.rollout import Prompt, Rollout
from tempax.rl.rollout_state import prompt_from_json, prompt_to_json, rollout_from_json, rollout_to_json


def two_turn_rollout() -> Rollout:
    """P = 1 prompt, G = 2 episodes of T = 4 tokens: episode 0 made two replies (turn_of 1 1 2 0), episode 1
    one; float32 values that JSON's decimal text would not keep exactly (0.1 is not a binary fraction)."""
    return Rollout(
        prompts=[Prompt(ids=(1, 5, 9), text="<|im_start|>user\nq", columns={"answer": "42", "idx": 3})],
        completion_tokens=np.array([[[7, 8, 9, 0], [7, 2, 0, 0]]], np.int32),
        completion_mask=np.array([[[1, 1, 1, 0], [1, 1, 0, 0]]], np.int32),
        logprobs=np.array([[[-0.1, -0.2, -0.3, 0.0], [-1 / 3, -0.7, 0.0, 0.0]]], np.float32),
        lengths=np.array([[3, 2]], np.int32),
        truncated=np.array([[False, True]]),
        texts=[["reply one", "reply two"]],
        rewards=np.array([[1.1, 0.0]], np.float32),
        reward_parts={"format": np.array([[1.0, 0.0]], np.float32), "tool": np.array([[0.1, 0.0]], np.float32)},
        reward_failures={"format": 0, "correctness": 1},
        advantages=np.array([[0.70710677, -0.70710677]], np.float32),
        zero_spread=np.array([False]),
        seconds={"generation": 1.5, "reward": 0.25},
        groups_sampled=2,
        zero_spread_sampled=1,
        turns=np.array([[2, 1]], np.int32),
        turn_of=np.array([[[1, 1, 2, 0], [1, 1, 0, 0]]], np.int32),
        env_metrics={"tool_calls": np.array([[1.0, 0.0]], np.float32)},
        prefilled_tokens=11,
        reprefill_tokens=17,
    )


def assert_same_rollout(a: Rollout, b: Rollout) -> None:
    for name in ("completion_tokens", "completion_mask", "logprobs", "lengths", "truncated", "rewards", "advantages",
                 "zero_spread"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name
    for name in ("reward_parts", "env_metrics"):
        x, y = getattr(a, name), getattr(b, name)
        assert sorted(x) == sorted(y), name
        assert all(x[k].dtype == y[k].dtype and x[k].tobytes() == y[k].tobytes() for k in x), name
    for name in ("turns", "turn_of"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None and y is None) or (x.dtype == y.dtype and x.tobytes() == y.tobytes()), name
    for name in ("prompts", "texts", "reward_failures", "seconds", "groups_sampled", "zero_spread_sampled",
                 "prefilled_tokens", "reprefill_tokens"):
        assert getattr(a, name) == getattr(b, name), name


def test_a_prompt_round_trips_through_json():
    prompt = Prompt(ids=(1, 2, 3), text="hi", columns={"answer": "7"})
    assert prompt_from_json(json.loads(json.dumps(prompt_to_json(prompt)))) == prompt


def test_a_multi_turn_rollout_round_trips_bit_for_bit_through_json_text():
    """Through the JSON text a checkpoint writes: every array exact (the float32 -1/3 too), and the multi-turn
    fields (turns, turn_of, the environment's counters, prefill counts) kept, since the per-turn entropy and the
    episode metrics of the step that trains on it read them."""
    rollout = two_turn_rollout()
    back = rollout_from_json(json.loads(json.dumps(rollout_to_json(rollout))))
    assert_same_rollout(rollout, back)


def test_a_one_turn_rollout_keeps_its_missing_turns_missing():
    """One-turn rollouts have no turns / turn_of (None) and no environment counters."""
    rollout = two_turn_rollout()
    rollout.turns, rollout.turn_of, rollout.env_metrics = None, None, {}
    back = rollout_from_json(json.loads(json.dumps(rollout_to_json(rollout))))
    assert back.turns is None and back.turn_of is None and back.env_metrics == {}
    assert_same_rollout(rollout, back)
