"""RFT through the one loop: `RFTSource` (rounds of the current policy's accepted samples) trained by `Trainer.fit`.

Tiny on purpose (2-layer model, vocab 400, 4 problems x 8 samples x 4 tokens a round) so the default suite runs
it end to end. The task is one a tiny model can learn in a few steps and whose reward is checkable: the share of
the letter 'e' in the completion, accepted at >= 0.15 (4-token completions have no stop token, so truncated ones
count). A random-initialised model emits 'e' rarely (about one sample in ten passes); each round fine-tunes on the
passing ones, so the next round's samples hold more 'e'.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from tempax.rl.rollout import PromptSampler, encode_prompts
from tempax.algorithms.rft.config import RFTKnobsConfig
from tempax.algorithms.rft.source import NothingAccepted, RFTSource
from tempax.algorithms.rft.main import make_rft_loss
from tempax.rewards import combine_rewards
from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig
from tempax.train.loop import Trainer
from tests.kit.compile_cache import persistent_compile_cache
from tests.kit.models import tiny_tempax_model
from tests.kit.tokenizers import tiny_chat_tokenizer

QUESTIONS = ["The quick brown fox", "How do I bake bread?", "Paris", "Numbers 0123"]

SETTINGS = RFTKnobsConfig(group_size=8, problems_per_round=4, sampling_batch=4, max_new_tokens=4,
                          threshold=0.15, keep_truncated=True, max_per_problem=2, max_empty_rounds=3)


@pytest.fixture(scope="module")
def tok():
    return tiny_chat_tokenizer()


@pytest.fixture(scope="module")
def model():
    return tiny_tempax_model("llama", vocab_size=400, num_layers=2)


@pytest.fixture(scope="module")
def prompts(tok):
    rows = [{"prompt_messages": [{"role": "user", "content": q}], "answer": "1", "question": q} for q in QUESTIONS]
    return encode_prompts(tok, rows, max_prompt_len=64)[0]


def e_fraction(prompts, completions, **columns):
    """The checker's reward: the share of the completion's characters that are the letter 'e'."""
    return [c.count("e") / max(len(c), 1) for c in completions]


@pytest.fixture(scope="module", autouse=True)
def compile_once(tmp_path_factory):
    """Three trainers of one shape: compile the step once (see tests/kit/compile_cache.py)."""
    with persistent_compile_cache(tmp_path_factory.mktemp("xla-cache")):
        yield


def run(model, tok, prompts, run_dir, *, steps, every_n=0, settings=SETTINGS):
    cfg = TrainConfig(
        steps=steps, batch_size=2, seq_len=48, mesh=MeshConfig(num_devices=1), run_dir=str(run_dir),
        tensorboard=False, progress_bar=False, check_memory=False,
        optimizer=OptimizerConfig(learning_rate=5e-2, schedule="constant"),
        checkpoint=CheckpointConfig(every=every_n, save_at_end=True, resume=True, async_save=False),
    )
    source = RFTSource(tok, PromptSampler(prompts, seed=0), combine_rewards({"e": e_fraction}), settings)
    trainer = Trainer(model, make_rft_loss(chunk_len=None), cfg, log=lambda s: None)
    try:
        result = trainer.fit(source)
    finally:
        trainer.close()
    return result, source, trainer


def test_reward_rises_over_rounds_and_a_killed_run_resumes_exactly(model, tok, prompts, tmp_path):
    """10 steps; rounds last as many steps as their kept completions fill (2 packed rows a step, at most 2 kept
    per problem).

    * reward: the first round's samples score ~0.05 (a few 'e's by chance, ~1 sample in 10 accepted); after a
      handful of rounds of fine-tuning on the accepted ones the sampled reward is several times higher: the mean
      of the last two rounds exceeds the first round's by more than 0.2, and the accept rate rises by more than
      0.5;
    * resume: a run killed after 5 steps (its final checkpoint falls inside a round: step 5 starts a two-step
      round, whose untrained batch is in the source state) and resumed to 10 trains on exactly the straight run's
      batches: equal losses and round rewards (no tolerance) and equal final weights."""
    straight, _, trainer = run(model, tok, prompts, tmp_path / "straight", steps=10, every_n=3)
    rewards = straight.series("reward/total_mean")
    accept = [v for _, v in straight.series("rft/accept_rate")]
    assert len(rewards) >= 3
    assert np.mean([v for _, v in rewards[-2:]]) > rewards[0][1] + 0.2, rewards
    assert accept[-1] > accept[0] + 0.5, accept
    round_starts = [s for s, _ in rewards]
    assert any(s + 1 not in round_starts for s in round_starts[:-1]), "no round lasted longer than one step"

    run(model, tok, prompts, tmp_path / "killed", steps=5)
    resumed, _, resumed_trainer = run(model, tok, prompts, tmp_path / "killed", steps=10)
    assert resumed.resumed_from == 5 and 5 in round_starts and 6 not in round_starts
    assert [s for s, _ in resumed.history] == [6, 7, 8, 9, 10]
    assert resumed.losses == straight.losses[5:]
    assert [r for r in rewards if r[0] > 5] == resumed.series("reward/total_mean")
    a, b = trainer.state.params, resumed_trainer.state.params
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_checker_that_accepts_nothing_stops_with_a_clear_message(model, tok, prompts, tmp_path):
    """Threshold 2.0 on a reward in [0, 1]: no round can keep anything; after max_empty_rounds=2 rounds the run
    stops with `NothingAccepted` naming the knob to change."""
    settings = RFTKnobsConfig(group_size=2, problems_per_round=2, sampling_batch=2, max_new_tokens=4,
                              threshold=2.0, max_empty_rounds=2)
    with pytest.raises(NothingAccepted, match="rft.threshold=2"):
        run(model, tok, prompts, tmp_path / "nothing", steps=2, settings=settings)


def test_the_fused_loss_is_the_weighted_sft_loss(model):
    """`make_rft_loss` (fused head + cross-entropy, weighted mask) equals `weighted_sft_loss` on the model's
    plain logits, for a packed row of two examples weighing 0.5 and 2.0; its loss_weight is sum(w * m) =
    0.5 * 2 + 2.0 * 3 = 7 (the examples train 2 and 3 target positions)."""
    import jax.numpy as jnp

    from tempax.algorithms.rft.losses import weighted_sft_loss
    from tempax.algorithms.rft.source import pack_round
    from tempax.data.formats import Example
    from tempax.models.logprobs import token_logprobs

    examples = [(Example(np.array([5, 6, 7, 8], np.int32), np.array([0, 0, 1, 1], bool)), 0.5),
                (Example(np.array([9, 10, 11, 12, 13], np.int32), np.array([0, 0, 1, 1, 1], bool)), 2.0)]
    (batch,) = pack_round(examples, batch_size=1, seq_len=12, pad_id=0, epochs=1, seed=0)
    jb = {k: jnp.asarray(v) for k, v in batch.items()}
    loss, metrics = make_rft_loss(chunk_len=None)(model, jb)
    logits, _ = model(jb["tokens"], positions=jb["positions"], segment_ids=jb["segment_ids"])
    expected, m = weighted_sft_loss(token_logprobs(logits, jb["targets"]), jb["loss_mask"], jb["weights"])
    assert float(metrics["loss_weight"]) == pytest.approx(7.0) == float(m["loss_weight"])
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
