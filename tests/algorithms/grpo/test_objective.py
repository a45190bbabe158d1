"""GRPO's pieces: rollout -> batch layout, old log-prob alignment, zero-spread groups, failing rewards, learning.

The tiny model (2 layers, vocab 400) and the tiny chat tokenizer keep every test on CPU; most of the time goes
into compiling, so tests share shapes (P prompts x G completions x T tokens) where they can.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tempax.algorithms.grpo.config import GRPOConfig, GRPOKnobsConfig, VARIANTS
from tempax.algorithms.grpo.objective import make_grpo_loss
from tempax.rl.logprobs import completion_logprobs, logprobs_no_grad
from tempax.algorithms.grpo.losses import grpo_loss
from tempax.algorithms.grpo.plan import GRPOPlan
from tempax.algorithms.grpo.source import GRPOSource, grpo_hooks, make_grpo_trainer
from tempax.rl.rollout import (
    Prompt,
    PromptSampler,
    Rollout,
    build_batch,
    encode_prompts,
    fill_with_spread,
    rollout_metrics,
    sample_rollout,
    score,
)
from tempax.rewards import combine_rewards
from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig
from tests.kit.models import tiny_tempax_model
from tests.kit.tokenizers import tiny_chat_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
QUESTIONS = ["The quick brown fox", "How do I bake bread?", "Paris", "Numbers 0123"]


@pytest.fixture(scope="module")
def tok():
    return tiny_chat_tokenizer()


@pytest.fixture(scope="module")
def model():
    return tiny_tempax_model("llama", vocab_size=400, num_layers=2)


@pytest.fixture(scope="module")
def prompts(tok):
    rows = [{"prompt_messages": [{"role": "user", "content": q}], "answer": "1", "question": q} for q in QUESTIONS]
    encoded, dropped = encode_prompts(tok, rows, max_prompt_len=64)
    assert dropped == 0
    return encoded


def e_fraction(prompts, completions, **columns):
    """A checkable reward: the share of the completion's characters that are the letter 'e'."""
    return [c.count("e") / max(len(c), 1) for c in completions]


def always_raises(prompts, completions, **columns):
    raise RuntimeError("this reward function is broken")


def hand_rollout(rewards: list[list[float]], tokens: np.ndarray, mask: np.ndarray, prompt_ids: list[list[int]]) -> Rollout:
    """A rollout built by hand (no sampling), advantages from the real group normalisation."""
    from tempax.rl.advantages import group_advantages

    r = np.asarray(rewards, np.float32)
    p, g = r.shape
    adv, zero = group_advantages(jnp.asarray(r.reshape(-1)), g)
    zero_spread = np.asarray(zero).reshape(p, g)[:, 0]
    return Rollout(
        prompts=[Prompt(tuple(ids), "", {}) for ids in prompt_ids], completion_tokens=tokens.astype(np.int32),
        completion_mask=mask.astype(np.int32), logprobs=np.zeros(tokens.shape, np.float32),
        lengths=mask.sum(-1).astype(np.int32), truncated=mask.sum(-1) == mask.shape[-1],
        texts=[[""] * g for _ in range(p)], rewards=r, reward_parts={"r": r}, reward_failures={"r": 0},
        advantages=np.asarray(adv).reshape(p, g), zero_spread=zero_spread, groups_sampled=p,
        zero_spread_sampled=int(zero_spread.sum()),
    )


def train_config(tmp_path, **kw) -> TrainConfig:
    base = dict(
        steps=2, batch_size=2, mesh=MeshConfig(num_devices=1), checkpoint=CheckpointConfig(save_at_end=False, resume=False),
        optimizer=OptimizerConfig(learning_rate=1e-3, schedule="constant"), run_dir=str(tmp_path / "run"),
        tensorboard=False, progress_bar=False, check_memory=False,
    )
    base.update(kw)
    return TrainConfig(**base)


# ------------------------------------------------------------------------------------------------ batch layout


def test_batch_left_pads_prompts_and_keeps_each_group_in_one_row():
    """Prompts [5, 6, 7] and [8] with prompt_len 4 -> rows [pad, 5, 6, 7] and [pad, pad, pad, 8], segments
    [0, 1, 1, 1] and [0, 0, 0, 1]; completions stay [P=2, G=2, T=3] with their masks; advantages of rewards
    [[1, 0], [2, 2]] are [[+1, -1], [0, 0]] (std 0.5 + eps 1e-4 -> 0.5 / 0.5001 = 0.9998)."""
    tokens = np.array([[[11, 12, 13], [21, 22, 0]], [[31, 0, 0], [41, 42, 43]]])
    mask = np.array([[[1, 1, 1], [1, 1, 0]], [[1, 0, 0], [1, 1, 1]]])
    ro = hand_rollout([[1.0, 0.0], [2.0, 2.0]], tokens, mask, [[5, 6, 7], [8]])
    ro.logprobs[:] = -0.5
    b = build_batch(ro, prompt_len=4, pad_id=0, with_old_logp=True)
    np.testing.assert_array_equal(b["prompt_tokens"], [[0, 5, 6, 7], [0, 0, 0, 8]])
    np.testing.assert_array_equal(b["prompt_segments"], [[0, 1, 1, 1], [0, 0, 0, 1]])
    np.testing.assert_array_equal(b["completion_tokens"], tokens)
    np.testing.assert_array_equal(b["completion_mask"], mask)
    assert b["completion_mask"].dtype == np.float32
    np.testing.assert_allclose(b["advantages"], [[0.9998, -0.9998], [0.0, 0.0]], atol=1e-4)
    np.testing.assert_array_equal(b["old_logp"], np.full((2, 2, 3), -0.5, np.float32))
    assert "old_logp" not in build_batch(ro, prompt_len=4, pad_id=0, with_old_logp=False)
    with pytest.raises(ValueError, match="more than the batch's prompt length"):
        build_batch(ro, prompt_len=2, pad_id=0, with_old_logp=False)


def test_rollout_metrics_count_zero_spread_groups_and_truncation():
    """Groups [1, 0] (spread) and [2, 2] (none): zero-spread fraction 1/2; lengths [3, 2, 1, 3]: mean 2.25, max 3;
    truncated (length == T = 3): 2 of 4."""
    tokens = np.ones((2, 2, 3), np.int32)
    mask = np.array([[[1, 1, 1], [1, 1, 0]], [[1, 0, 0], [1, 1, 1]]])
    m = rollout_metrics(hand_rollout([[1.0, 0.0], [2.0, 2.0]], tokens, mask, [[5], [6]]))
    assert m["groups/zero_spread_frac"] == 0.5
    assert m["groups/zero_spread_in_batch"] == 1.0
    assert m["completion/length_mean"] == 2.25 and m["completion/length_max"] == 3.0
    assert m["completion/truncated_frac"] == 0.5
    assert m["reward/total_mean"] == pytest.approx(1.25)  # (1 + 0 + 2 + 2) / 4
    assert m["reward/r_failures"] == 0.0


def test_dynamic_sampling_fills_the_batch_with_groups_that_have_spread():
    """Round 1: groups A (zero spread), B (spread); round 2: C (spread), D (zero). Two wanted -> B, C; three
    wanted -> B, C, then A (a zero-spread filler). Both rounds' groups are counted as sampled (4, 2 zero)."""
    tokens, mask = np.ones((2, 2, 1), np.int32), np.ones((2, 2, 1), np.int32)
    r1 = hand_rollout([[1.0, 1.0], [0.0, 1.0]], tokens, mask, [[1], [2]])
    r2 = hand_rollout([[1.0, 0.0], [0.0, 0.0]], tokens, mask, [[3], [4]])
    two = fill_with_spread([r1, r2], 2)
    assert [q.ids for q in two.prompts] == [(2,), (3,)]
    assert not two.zero_spread.any()
    three = fill_with_spread([r1, r2], 3)
    assert [q.ids for q in three.prompts] == [(2,), (3,), (1,)]
    assert three.groups_sampled == 4 and three.zero_spread_sampled == 2


def test_a_reward_function_that_raises_scores_zero_and_is_counted():
    """`e_fraction` of "ee" = 1.0 and of "ab" = 0; the broken function gives 0 for both samples, counted as 2
    failures; weights 1 + 1 -> totals [1, 0]."""
    reward = combine_rewards({"e": e_fraction, "broken": always_raises})
    prompts = [Prompt((1,), "p", {"answer": "1"})]
    total, parts, failures = score(reward, prompts, [["ee", "ab"]], np.array([[2, 2]]), max_new_tokens=4)
    np.testing.assert_allclose(total, [[1.0, 0.0]])
    np.testing.assert_allclose(parts["broken"], [[0.0, 0.0]])
    assert failures["broken"] == 2 and failures["e"] == 0


def test_overlong_penalty_is_added_as_its_own_reward_part():
    """max_new_tokens 8, soft zone 4: lengths 4 -> 0, 6 -> (4 - 6) / 4 = -0.5, 8 -> -1."""
    reward = combine_rewards({"e": e_fraction})
    prompts = [Prompt((1,), "p", {})]
    total, parts, _ = score(reward, prompts, [["x", "x", "x"]], np.array([[4, 6, 8]]), max_new_tokens=8,
                            overlong_penalty_tokens=4)
    np.testing.assert_allclose(parts["overlong"], [[0.0, -0.5, -1.0]])
    np.testing.assert_allclose(total, [[0.0, -0.5, -1.0]])


# ------------------------------------------------------------------------------- log-probs and the loss function


def test_first_pass_ratio_is_one_because_sampling_and_training_logprobs_agree(model, tok, prompts):
    """The sampler's log p_tau (tau = 0.7) equals the training forward's (shared-prefill cache, same
    temperature) on every completion token, so pi / pi_old = 1 and nothing is clipped on the first pass."""
    reward = combine_rewards({"e": e_fraction})
    ro = sample_rollout(model, tok, prompts[:2], reward, group_size=4, max_new_tokens=8, temperature=0.7, seed=3)
    assert ro.completion_tokens.shape == (2, 4, 8)
    batch = build_batch(ro, prompt_len=24, pad_id=tok.pad_id, with_old_logp=True)
    graphdef, state = nnx.split(model)
    inputs = {k: jnp.asarray(v) for k, v in batch.items() if k not in ("advantages", "old_logp")}
    logp = np.asarray(logprobs_no_grad(graphdef, state, inputs, jnp.float32(0.7)))
    m = batch["completion_mask"] > 0
    np.testing.assert_allclose(logp[m], batch["old_logp"][m], atol=2e-5)
    _, metrics = grpo_loss(jnp.asarray(logp).reshape(8, 8), jnp.asarray(batch["old_logp"]).reshape(8, 8), None,
                           jnp.asarray(batch["advantages"]).reshape(8), jnp.asarray(batch["completion_mask"]).reshape(8, 8),
                           beta=0.0)
    assert float(metrics["ratio_mean"]) == pytest.approx(1.0, abs=1e-4)
    assert float(metrics["clip_frac"]) == 0.0
    # At tau = 1 the training log-probs differ (the sampler's are temperature-adjusted): the alignment is real.
    logp1 = np.asarray(logprobs_no_grad(graphdef, state, inputs, jnp.float32(1.0)))
    assert np.abs(logp1[m] - batch["old_logp"][m]).max() > 1e-3



def _batch_of(rollout: Rollout, prompt_len: int = 8) -> dict[str, jax.Array]:
    return {k: jnp.asarray(v) for k, v in build_batch(rollout, prompt_len=prompt_len, pad_id=0,
                                                      with_old_logp=False).items()}


def _random_tokens(shape, seed: int) -> np.ndarray:
    return np.random.RandomState(seed).randint(3, 400, shape).astype(np.int32)


_LOSS_AND_GRAD = {}


def loss_and_grad(settings: GRPOKnobsConfig):
    """One jitted value-and-grad per settings (shared by the tests that use the same settings)."""
    if settings not in _LOSS_AND_GRAD:
        loss_fn = make_grpo_loss(settings)
        _LOSS_AND_GRAD[settings] = nnx.jit(lambda m, b: nnx.value_and_grad(loss_fn, has_aux=True)(m, b))
    return _LOSS_AND_GRAD[settings]


def test_zero_spread_group_contributes_no_gradient(model):
    """Group 0 rewards [1, 0] (spread), group 1 [2, 2] (zero spread: advantages exactly 0). With beta = 0 the
    gradient does not change when group 1's completions are replaced by other tokens, and a batch of only
    zero-spread groups has exactly zero gradient."""
    settings = GRPOKnobsConfig(beta=0.0, group_size=2, max_new_tokens=4)
    fn = loss_and_grad(settings)
    mask = np.ones((2, 2, 4), np.int32)
    mask[0, 1, 3] = 0
    prompt_ids = [[5, 6, 7], [8, 9]]
    tokens = _random_tokens((2, 2, 4), 0)
    other = tokens.copy()
    other[1] = _random_tokens((2, 4), 1)
    ro = hand_rollout([[1.0, 0.0], [2.0, 2.0]], tokens, mask, prompt_ids)
    assert ro.zero_spread.tolist() == [False, True]
    (_, _), g1 = fn(model, _batch_of(ro))
    (_, _), g2 = fn(model, _batch_of(hand_rollout([[1.0, 0.0], [2.0, 2.0]], other, mask, prompt_ids)))
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-7)
    assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(g1)) > 0  # group 0 does push the weights
    (loss, metrics), g0 = fn(model, _batch_of(hand_rollout([[3.0, 3.0], [2.0, 2.0]], tokens, mask, prompt_ids)))
    assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree.leaves(g0))
    assert float(loss) == 0.0


def test_logit_chunk_rows_is_the_largest_divisor_up_to_the_target():
    from tempax.rl.logprobs import logit_chunk_rows

    assert [logit_chunk_rows(n, 2) for n in (1, 2, 7, 8)] == [1, 2, 1, 2]
    assert [logit_chunk_rows(n, 4) for n in (6, 9, 12, 3)] == [3, 3, 4, 3]


@pytest.mark.heavy
def test_chunked_logprobs_equal_all_rows_at_once(model, monkeypatch):
    """Log-probs and entropy, and the gradient of a loss using both, are the same whether the [rows, T, V]
    logits are made one row at a time (recomputed in the backward) or all 4 rows at once."""
    import tempax.rl.logprobs as learner

    ro = hand_rollout([[1.0, 0.0], [2.0, 0.5]], _random_tokens((2, 2, 4), 3), np.ones((2, 2, 4), np.int32),
                      [[5, 6, 7], [8, 9]])
    batch = _batch_of(ro)

    def run(rows: int):
        monkeypatch.setattr(learner, "LOGIT_CHUNK_ROWS", rows)

        def objective(m):
            logp, ent = completion_logprobs(m, batch, temperature=0.7, with_entropy=True, entropy_gradient=True)
            return jnp.sum(logp * jnp.arange(4.0)) + jnp.sum(ent), (logp, ent)

        # Compiled: a new program per `run` (the chunk size is read while tracing), each far faster than eager.
        (_, (logp, ent)), grads = nnx.jit(nnx.value_and_grad(objective, has_aux=True))(model)
        return logp, ent, grads

    one, whole = run(1), run(4)
    np.testing.assert_allclose(np.asarray(one[0]), np.asarray(whole[0]), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(one[1]), np.asarray(whole[1]), rtol=1e-6, atol=1e-6)
    for a, b in zip(jax.tree.leaves(one[2]), jax.tree.leaves(whole[2])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(one[2])) > 0


def test_loss_weight_makes_prompt_micro_batches_reproduce_the_full_batch(model):
    """The train step combines micro-batches as sum_i w_i L_i / sum_i w_i. Splitting 2 prompts into 2
    micro-batches of 1 must give the full-batch loss: with seq_mean_token_mean, w = non-empty completions
    (2 and 2); with token_mean, w = tokens (7 and 5, so the halves do not weigh the same)."""
    mask = np.ones((2, 2, 4), np.int32)
    mask[0, 1, 3] = 0
    mask[1, 0, 1:] = 0
    tokens = _random_tokens((2, 2, 4), 2)
    ro = hand_rollout([[1.0, 0.0], [0.5, 2.0]], tokens, mask, [[5, 6, 7], [8, 9]])
    graphdef, state = nnx.split(model)
    modes = ("seq_mean_token_mean", "token_mean")
    loss_fns = [make_grpo_loss(GRPOKnobsConfig(beta=0.0, group_size=2, max_new_tokens=4, loss_aggregation=mode))
                for mode in modes]
    # Both losses in one executable (the shared forward pass is compiled once).
    run = jax.jit(lambda st, b: [fn(nnx.merge(graphdef, st), b) for fn in loss_fns])
    full = run(state, _batch_of(ro))
    halves = [run(state, _batch_of(ro.select([i]))) for i in (0, 1)]
    for k, mode in enumerate(modes):
        parts = [h[k] for h in halves]
        weights = [float(m["loss_weight"]) for _, m in parts]
        assert weights == ([2.0, 2.0] if mode == "seq_mean_token_mean" else [7.0, 5.0])
        combined = sum(w * float(l) for w, (l, _) in zip(weights, parts)) / sum(weights)
        assert combined == pytest.approx(float(full[k][0]), rel=1e-5, abs=1e-7)


@pytest.mark.heavy
def test_one_group_per_pass_with_remat_gives_the_unsplit_update(model, tmp_path):
    """The memory-saving settings of bench/grpo_step.py (train.micro_batch_size=1: one prompt group per
    forward/backward pass, each prompt still run once for its group; train.remat=full through the cached prompt
    pass) must leave the optimizer step as it was: same loss, grad norm and SGD update (1e-5) as the whole
    batch in one pass without remat. token_mean weights the groups by tokens, 7 and 5 here, not equally."""
    mask = np.ones((2, 2, 4), np.int32)
    mask[0, 1, 3] = 0
    mask[1, 0, 1:] = 0
    ro = hand_rollout([[1.0, 0.0], [0.5, 2.0]], _random_tokens((2, 2, 4), 5), mask, [[5, 6, 7], [8, 9]])
    batch = {k: np.asarray(v) for k, v in _batch_of(ro).items()}
    batch["ref_logp"] = np.full((2, 2, 4), -6.0, np.float32)
    settings = GRPOKnobsConfig(beta=0.04, group_size=2, max_new_tokens=4, loss_aggregation="token_mean")

    def one_step(**train_kw):
        cfg = train_config(tmp_path, optimizer=OptimizerConfig(name="sgd", learning_rate=1.0, schedule="constant"),
                           **train_kw)
        trainer = make_grpo_trainer(model, settings, GRPOPlan.build(settings), cfg, prompt_len=8,
                                    log=lambda s: None)
        try:
            before = {k: np.asarray(v) for k, v in trainer.state.params.items()}
            metrics = jax.device_get(trainer.train_step(batch))
            return metrics, {k: np.asarray(v) - before[k] for k, v in trainer.state.params.items()}
        finally:
            trainer.close()

    (whole_m, whole), (split_m, split) = one_step(), one_step(micro_batch_size=1, remat="full")
    for key in ("loss", "grad_norm", "kl"):
        assert float(split_m[key]) == pytest.approx(float(whole_m[key]), rel=1e-5, abs=1e-7), key
    for key in whole:
        np.testing.assert_allclose(split[key], whole[key], rtol=1e-5, atol=1e-7, err_msg=key)
    assert float(whole_m["grad_norm"]) > 0


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_gives_a_finite_loss_and_gradient(model, variant):
    """GRPO, Dr. GRPO, DAPO and GSPO settings, with old and reference log-probs in the batch."""
    fields = {k: v for k, v in VARIANTS[variant].items() if k != "overlong_penalty_tokens"}
    settings = GRPOKnobsConfig(group_size=2, max_new_tokens=4, **{"beta": 0.04, **fields})
    ro = hand_rollout([[1.0, 0.0], [0.5, 2.0]], _random_tokens((2, 2, 4), 3), np.ones((2, 2, 4)), [[5, 6], [7]])
    batch = _batch_of(ro)
    batch["old_logp"] = jnp.full((2, 2, 4), -5.0)
    batch["ref_logp"] = jnp.full((2, 2, 4), -6.0)
    (loss, metrics), grads = loss_and_grad(settings)(model, batch)
    assert np.isfinite(float(loss)) and float(metrics["kl"]) > 0
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


# ------------------------------------------------------------------------------- rollouts through Trainer.fit


def fit_grpo(model, tok, prompts, reward, settings, cfg, *, reference=None, source=None):
    """`Trainer.fit` over a `GRPOSource` (the tiny end-to-end and resume runs are in test_source.py)."""
    source = source or GRPOSource(tok, PromptSampler(prompts, seed=0), reward, GRPOPlan.build(settings),
                                  prompt_len=24, reference=reference)
    trainer = make_grpo_trainer(model, settings, source.plan, cfg, prompt_len=24, log=lambda s: None)
    try:
        return trainer.fit(source, hooks=grpo_hooks(source))
    finally:
        trainer.close()



@pytest.mark.slow
def test_reference_is_the_base_model_with_adapters_off(model, tok, prompts, tmp_path):
    """With LoRA, the reference log-probs are the base model's (adapters skipped), while the policy's differ
    once the adapters are non-zero."""
    from tempax.models.lora import LoraConfig, apply_lora, lora_filter, lora_layers

    policy = apply_lora(model, LoraConfig(rank=2, alpha=4.0), rngs=nnx.Rngs(1))
    for _, layer in lora_layers(policy):
        layer.lora_b.set_value(jnp.full(layer.lora_b.shape, 0.05, jnp.float32))
    settings = GRPOKnobsConfig(group_size=2, max_new_tokens=4)
    source = GRPOSource(tok, PromptSampler(prompts), combine_rewards({"e": e_fraction}), GRPOPlan.build(settings),
                        prompt_len=24)
    trainer = make_grpo_trainer(policy, settings, source.plan, train_config(tmp_path), prompt_len=24,
                                trainable=lora_filter, log=lambda s: None)
    source.attach(trainer)
    ro = hand_rollout([[1.0, 0.0], [0.5, 2.0]], _random_tokens((2, 2, 4), 4), np.ones((2, 2, 4)),
                      [list(p.ids) for p in prompts[:2]])
    batch = build_batch(ro, prompt_len=24, pad_id=tok.pad_id, with_old_logp=False)
    ref = source.reference_logprobs(batch)
    base = np.asarray(completion_logprobs(model, {k: jnp.asarray(v) for k, v in batch.items()}, temperature=1.0)[0])
    np.testing.assert_allclose(ref, base, atol=1e-5)
    assert np.abs(source.policy_logprobs(batch) - base).max() > 1e-3


@pytest.mark.slow
def test_grpo_drives_a_checkable_reward_up_despite_a_broken_reward_function(model, tok, prompts, tmp_path):
    """Full-weight GRPO on the tiny model with reward = share of 'e' characters (starts near 5%), plus a reward
    function that always raises: every step runs, the broken function's 32 samples per step are counted as
    failures, and the reward climbs (measured: 0.05 -> 0.5 by step 10, -> 1.0 by step 13 at lr 3e-2). beta > 0
    exercises the frozen full-weight reference (KL reported)."""
    from tempax.train.metrics import read_metrics

    reward = combine_rewards({"e": e_fraction, "broken": always_raises})
    settings = GRPOKnobsConfig(group_size=8, max_new_tokens=8, temperature=1.0, beta=0.001)
    cfg = train_config(tmp_path, steps=12, batch_size=4,
                       optimizer=OptimizerConfig(learning_rate=3e-2, schedule="constant"))
    result = fit_grpo(model, tok, prompts, reward, settings, cfg, reference=model)
    assert [s for s, _ in result.history] == list(range(1, 13))
    e = [m["reward/e_mean"] for _, m in result.history]
    assert np.mean(e[-3:]) > np.mean(e[:3]) + 0.2, e
    last = result.history[-1][1]
    assert last["reward/broken_failures"] == 32.0
    for key in ("kl", "entropy", "clip_frac", "advantage/std", "groups/zero_spread_frac", "completion/truncated_frac",
                "perf/rollouts_per_s", "perf/generation_s", "perf/train_s", "grad_norm", "lr"):
        assert key in last, key
    assert last["kl"] > 0
    records = read_metrics(cfg.run_dir)
    assert len(records) == 12 and "reward/e_mean" in records[-1]


@pytest.mark.slow
def test_several_passes_per_rollout_use_the_sampling_logprobs_as_old_policy(model, tok, prompts, tmp_path):
    """num_iterations = 2: two optimizer steps per rollout; the first pass has ratio 1 (no clipping), the
    second sees the updated policy (ratio moves away from 1); rollout metrics are logged on the first pass."""
    settings = GRPOKnobsConfig(group_size=4, max_new_tokens=8, beta=0.0, num_iterations=2)
    cfg = train_config(tmp_path, steps=2, batch_size=2, optimizer=OptimizerConfig(learning_rate=5e-2,
                                                                                  schedule="constant"))
    source = GRPOSource(tok, PromptSampler(prompts, seed=1), combine_rewards({"e": e_fraction}),
                        GRPOPlan.build(settings), prompt_len=24)
    result = fit_grpo(model, tok, prompts, None, settings, cfg, source=source)
    (s1, m1), (s2, m2) = result.history
    assert (s1, s2) == (1, 2) and source.rollouts_done == 1
    assert m1["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and m1["clip_frac"] == 0.0
    assert abs(m2["ratio_max"] - 1.0) > 1e-4 or abs(m2["ratio_min"] - 1.0) > 1e-4
    assert "reward/total_mean" in m1 and "reward/total_mean" not in m2


def test_sampler_visits_every_prompt_once_per_epoch_and_resumes(prompts):
    sampler = PromptSampler(prompts, seed=0)
    first = sampler.next(4)
    assert sorted(p.ids for p in first) == sorted(p.ids for p in prompts)
    state = sampler.state()
    nxt = sampler.next(3)
    other = PromptSampler(prompts, seed=0)
    other.restore(state)
    assert other.next(3) == nxt


# ------------------------------------------------------------------------------------------- configs, recipes


def test_config_rejects_bad_settings():
    from tempax.configlib import from_dict
    from tempax.errors import ConfigError

    with pytest.raises(ConfigError, match="temperature"):
        from_dict(GRPOConfig, {"grpo": {"temperature": 0.0}})
    with pytest.raises(ConfigError, match="group_size"):
        from_dict(GRPOConfig, {"grpo": {"group_size": 1}})
    with pytest.raises(ConfigError, match="dropout"):
        from_dict(GRPOConfig, {"lora": {"dropout": 0.1}})
    cfg = from_dict(GRPOConfig, {"grpo": {"epsilon_high": 0.28}})
    assert cfg.grpo.eps_high == 0.28 and cfg.grpo.epsilon == 0.2


def test_grpo_recipes_parse():
    import glob

    from tempax.configlib import load_config

    paths = sorted(glob.glob(os.path.join(REPO, "recipes", "grpo_*.yaml")))
    assert paths, "no GRPO recipes found"
    for path in paths:
        with open(path) as f:
            assert f.readline().startswith("#"), f"{path} must open with a comment"
        cfg = load_config(GRPOConfig, path)
        assert cfg.train.batch_size >= 1


@pytest.mark.slow
def test_main_trains_and_evaluates_a_tiny_model(tok, tmp_path):
    """`main` end to end on a random-init tiny model: before/after evaluation, metrics, eval.json, adapters."""
    from tempax.algorithms.grpo.main import main
    from tempax.configlib import from_dict

    tok_dir = tmp_path / "tokenizer"
    tok.hf.save_pretrained(str(tok_dir))
    cfg = from_dict(GRPOConfig, {
        "model": {"source": "preset:tiny-llama", "tokenizer": str(tok_dir), "overrides": {"vocab_size": 400}},
        "lora": {"rank": 2, "alpha": 4.0},
        "task": {"name": "arithmetic", "num_train_problems": 8},
        "grpo": {"group_size": 2, "max_new_tokens": 4, "beta": 0.04},
        "eval": {"num_problems": 2, "group_size": 2, "ks": [1, 2], "max_new_tokens": 4},
        "train": {"steps": 2, "batch_size": 2, "mesh": {"num_devices": 1}, "run_dir": str(tmp_path / "run"),
                  "progress_bar": False, "tensorboard": False, "check_memory": False,
                  "checkpoint": {"save_at_end": True, "async_save": False}},
    })
    run = main(cfg, log=lambda s: None)
    assert run.before is not None and run.after is not None
    assert run.after.sampled.pass_at_k.keys() == {1, 2}
    for name in ("eval", "adapters"):
        assert os.path.exists(run.files[name])
    assert run.last_checkpoint is not None
    assert os.path.exists(tmp_path / "run" / "metrics.jsonl")
