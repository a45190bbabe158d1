"""Episodes on the engine (`tempax.rl.episodes`): a scripted two-turn episode checked token by token, the training
forward reading exactly what the sampler's cache held, the loss mask, and the tool-result gradient test.

Tiny model (2 layers, vocab 400) and the tiny ChatML tokenizer (<|im_end|> = 2 ends a turn).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tempax.algorithms.grpo.config import GRPOKnobsConfig
from tempax.algorithms.grpo.objective import make_grpo_loss
from tempax.envs.environment import StepResult
from tempax.errors import TempaxError
from tempax.rl.episodes import play_episodes, turn_end_glue
from tempax.rl.logprobs import completion_logprobs
from tempax.rl.rollout import build_batch, encode_prompts, episode_metrics, rollout_metrics, sample_rollout
from tests.algorithms.grpo.test_objective import model, tok  # noqa: F401 - the shared tiny fixtures

TOOL_TURN = "<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"


class ScriptedEnvironment:
    """Turn 1: answers with a tool result "42" and a per-turn reward -0.1; turn 2: done, reward 1.0."""

    def __init__(self) -> None:
        self.replies: list[str] = []

    def reset(self, task_row):
        self.replies = []
        return [{"role": "user", "content": task_row["question"]}]

    def step(self, reply: str) -> StepResult:
        self.replies.append(reply)
        if len(self.replies) == 1:
            return StepResult(messages=({"role": "tool", "name": "calc", "content": "42"},), rewards={"turn": -0.1})
        return StepResult(rewards={"final": 1.0}, done=True)

    def metrics(self):
        return {"tool_calls": float(len(self.replies) > 1)}


@pytest.fixture(scope="module")
def prompts(tok):
    rows = [{"question": "Paris"}, {"question": "The quick brown fox"}]
    encoded, _ = encode_prompts(tok, rows, max_prompt_len=64, env_factory=ScriptedEnvironment)
    return encoded


def test_the_glue_after_a_reply_is_what_chatml_writes_after_its_stop_token(tok):
    """ChatML renders a reply as `content<|im_end|>\\n`: after the stop token <|im_end|> only "\\n" follows; a
    reply cut by the token limit needs the whole `<|im_end|>\\n`."""
    assert tok.decode(turn_end_glue(tok, 2), skip_special_tokens=False) == "\n"
    assert tok.decode(turn_end_glue(tok, None), skip_special_tokens=False) == "<|im_end|>\n"


def test_a_scripted_two_turn_episode_token_by_token(model, tok, prompts):
    """2 prompts x 2 episodes, 4 tokens a reply, 32 episode tokens. Each row is

        reply 1 (n1 tokens, mask 1) | glue + TOOL_TURN (mask 0) | reply 2 (n2 tokens, mask 1) | pad (mask 0)

    where glue is "\\n" after a stop token and "<|im_end|>\\n" after a cut reply. The engine prefilled each prompt
    once, then per row 1 + len(glue + TOOL_TURN) tokens (the reply's last token, never fed while decoding, and the
    new ones), while re-prefilling the conversation for turn 2 would have cost prompt + n1 + len(env) per row."""
    g, t = 2, 32
    episodes = play_episodes(model, tok, [p.ids for p in prompts], [p.columns for p in prompts], ScriptedEnvironment,
                             group_size=g, max_new_tokens=4, max_turns=2, episode_tokens=t, temperature=1.0, seed=3)
    assert list(episodes.turns) == [2, 2, 2, 2]
    assert episodes.turn_rewards == [{"turn": -0.1, "final": 1.0}] * 4
    expect_prefill = sum(len(p.ids) for p in prompts)
    expect_reprefill = expect_prefill
    for r in range(4):
        n1 = int((episodes.turn_of[r] == 1).sum())
        n2 = int((episodes.turn_of[r] == 2).sum())
        first = episodes.tokens[r, :n1]
        stopped = int(first[-1]) == 2
        env = tok.encode(("\n" if stopped else "<|im_end|>\n") + TOOL_TURN, add_special_tokens=False)
        k = n1 + len(env)
        assert list(episodes.tokens[r, n1:k]) == env
        assert list(episodes.mask[r]) == [1] * n1 + [0] * len(env) + [1] * n2 + [0] * (t - k - n2)
        assert list(episodes.turn_of[r, :k + n2]) == [1] * n1 + [0] * len(env) + [2] * n2
        assert int(episodes.lengths[r]) == k + n2
        assert (episodes.tokens[r, k + n2:] == tok.pad_id).all()
        assert (episodes.logprobs[r][episodes.mask[r] == 0] == 0).all()
        second = episodes.tokens[r, k:k + n2]
        assert episodes.final_texts[r] == tok.decode(second[:-1] if int(second[-1]) in tok.stop_ids else second)
        expect_prefill += 1 + len(env)
        expect_reprefill += len(prompts[r // g].ids) + k
    assert episodes.prefilled_tokens == expect_prefill
    assert episodes.reprefill_tokens == expect_reprefill
    assert list(episodes.env_metrics["tool_calls"]) == [1.0] * 4


def test_the_training_forward_reads_what_the_sampler_cache_held(model, tok, prompts):
    """The batch of a multi-turn rollout, run through the training forward (`completion_logprobs`, no cache, the
    whole episode at once), gives each policy token the log-prob the sampler drew it with: so the cache's
    positions and the masking of slots a row wrote while others were still decoding were right. Rewards: the
    environment's parts per name, total = -0.1 + 1.0 for every episode."""
    rollout = sample_rollout(model, tok, prompts, None, group_size=2, max_new_tokens=4, temperature=1.0, seed=5,
                             env_factory=ScriptedEnvironment, max_turns=2, episode_tokens=32)
    np.testing.assert_allclose(rollout.rewards, np.full((2, 2), 0.9, np.float32), rtol=1e-6)
    assert set(rollout.reward_parts) == {"turn", "final"}
    batch = build_batch(rollout, prompt_len=24, pad_id=tok.pad_id, with_old_logp=False)
    logp = np.asarray(completion_logprobs(model, {k: jnp.asarray(v) for k, v in batch.items()}, temperature=1.0)[0])
    on = rollout.completion_mask.astype(bool)
    np.testing.assert_allclose(logp[on], rollout.logprobs[on], atol=2e-5)
    m = rollout_metrics(rollout)
    assert m["episode/turns_mean"] == 2.0 and m["episode/tool_calls_mean"] == 1.0
    share = rollout.completion_mask.sum() / rollout.lengths.sum()
    assert m["episode/policy_token_frac"] == pytest.approx(share)
    assert set(k for k in episode_metrics(rollout) if k.startswith("entropy/")) == {"entropy/turn_1", "entropy/turn_2"}
    assert m["entropy/turn_2"] == pytest.approx(-rollout.logprobs[rollout.turn_of == 2].mean())


@functools.partial(jax.jit, static_argnums=0)
def _grad_program(graphdef, params, rest, batch):
    loss_fn = make_grpo_loss(GRPOKnobsConfig(group_size=2, beta=0.0, max_new_tokens=4))
    return jax.grad(lambda p: loss_fn(nnx.merge(graphdef, p, rest), batch)[0])(params)


def _grads(model, batch):
    """GRPO's loss gradient for `batch` (one compiled program for the three batches below, which share shapes)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return _grad_program(graphdef, params, rest, batch)


def test_tool_result_tokens_carry_no_gradient(model):
    """One prompt, two episodes; each ends with a tool result the episode budget cut off:

        completion = [5, 6, 7 | 40, 41, 42]   mask [1, 1, 1 | 0, 0, 0]   advantages [1, -1]

    Changing the tool result's tokens (40, 41, 42 -> 300, 301, 302) leaves every gradient exactly as it was: the
    mask keeps those tokens out of the loss, and nothing of the policy's comes after them. Marking them as the
    policy's (mask 1) does change the gradient, so the comparison can see a difference."""
    def batch(tool, mask_tool=0.0):
        tokens = np.array([[[5, 6, 7, *tool], [8, 9, 10, *tool]]], np.int32)
        mask = np.array([[[1, 1, 1, mask_tool, mask_tool, mask_tool]] * 2], np.float32)
        return {"prompt_tokens": jnp.array([[0, 1, 20, 21]], jnp.int32),
                "prompt_segments": jnp.array([[0, 1, 1, 1]], jnp.int32),
                "completion_tokens": jnp.asarray(tokens), "completion_mask": jnp.asarray(mask),
                "advantages": jnp.array([[1.0, -1.0]], jnp.float32)}

    base = _grads(model, batch([40, 41, 42]))
    changed = _grads(model, batch([300, 301, 302]))
    for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(changed)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    trained_on = _grads(model, batch([300, 301, 302], mask_tool=1.0))
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(trained_on)))


class _ManyStops:
    """The tiny tokenizer with tokens 2..59 all ending a turn, so replies end at many different lengths."""

    def __init__(self, tok):
        self._tok = tok
        self.stop_ids = tuple(range(2, 60))

    def __getattr__(self, name):
        return getattr(self._tok, name)


class UnevenEnvironment(ScriptedEnvironment):
    """One to three turns: after each reply a tool result whose length depends on the reply, until the episode has
    had 1 + (characters of the first reply mod 3) replies."""

    def step(self, reply: str) -> StepResult:
        self.replies.append(reply)
        if len(self.replies) >= 1 + len(self.replies[0]) % 3:
            return StepResult(rewards={"final": float(len(reply))}, done=True)
        return StepResult(messages=({"role": "tool", "name": "echo", "content": "x " * (1 + len(reply) % 5)},))


@pytest.mark.heavy
def test_the_slot_engine_plays_the_same_episodes_as_the_batch(model, tok):
    """Rows that end their turns at different lengths, episodes of one to three turns, fewer slots than rows (groups
    wait for free slots) and a chunk that does not divide the replies: the slot engine gives every episode token
    for token, with the same masks and sampling log-probs, as the turn-by-turn batch, because a row's random stream
    depends only on its prompt, sample index and turn; and it prefills the same tokens."""
    many = _ManyStops(tok)
    rows = [{"question": q} for q in ("Paris", "The quick brown fox", "one two three", "a")]
    prompts, _ = encode_prompts(many, rows, max_prompt_len=64, env_factory=UnevenEnvironment)
    args = (model, many, [p.ids for p in prompts], [p.columns for p in prompts], UnevenEnvironment)
    kw = dict(group_size=2, max_new_tokens=6, max_turns=3, episode_tokens=48, temperature=1.0, seed=7)
    batch = play_episodes(*args, **kw)
    assert len(set(batch.lengths.tolist())) >= 3 and len(set(batch.turns.tolist())) >= 2  # the case is uneven
    for slots in (2, 0):
        slot = play_episodes(*args, engine="slots", slots=slots, chunk=3, **kw)
        np.testing.assert_array_equal(slot.tokens, batch.tokens)
        np.testing.assert_array_equal(slot.mask, batch.mask)
        np.testing.assert_array_equal(slot.turn_of, batch.turn_of)
        np.testing.assert_allclose(slot.logprobs, batch.logprobs, atol=1e-5)
        assert slot.turn_rewards == batch.turn_rewards and slot.final_texts == batch.final_texts
        assert (slot.prefilled_tokens, slot.reprefill_tokens) == (batch.prefilled_tokens, batch.reprefill_tokens)


@pytest.mark.heavy
def test_a_slot_rollout_trains_on_what_its_cache_held(model, tok, prompts):
    """The training forward gives each policy token of a slot-engine episode the log-prob it was sampled with:
    a continued row's cache (kept positions, new tokens, positions) was right."""
    rollout = sample_rollout(model, tok, prompts, None, group_size=2, max_new_tokens=4, temperature=1.0, seed=5,
                             env_factory=ScriptedEnvironment, max_turns=2, episode_tokens=32, engine="slots", slots=2)
    batch = build_batch(rollout, prompt_len=24, pad_id=tok.pad_id, with_old_logp=False)
    logp = np.asarray(completion_logprobs(model, {k: jnp.asarray(v) for k, v in batch.items()}, temperature=1.0)[0])
    on = rollout.completion_mask.astype(bool)
    np.testing.assert_allclose(logp[on], rollout.logprobs[on], atol=2e-5)


def test_too_few_slots_for_a_group_is_a_clear_error(model, tok, prompts):
    with pytest.raises(TempaxError, match="group_size=2"):
        play_episodes(model, tok, [p.ids for p in prompts], [p.columns for p in prompts], ScriptedEnvironment,
                      group_size=2, max_new_tokens=4, max_turns=1, episode_tokens=4, temperature=1.0, engine="slots",
                      slots=1)
