"""GRPO through the one loop: `GRPOSource` (rollouts of the current policy) trained by `Trainer.fit`.

Tiny on purpose (2-layer model, vocab 400, 2 prompts x 2 completions x 4 tokens a step) so the default suite runs
it end to end: a run, exact resume (also in the middle of a rollout's passes), and a hook that stops the run.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tempax.algorithms.grpo.config import GRPOKnobsConfig
from tempax.rl.rollout import PromptSampler
from tempax.algorithms.grpo.plan import GRPOPlan
from tempax.algorithms.grpo.source import GRPOSource, grpo_hooks, make_grpo_trainer
from tempax.rewards import combine_rewards
from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig
from tempax.train.hooks import Stop, every
from tempax.train.metrics import read_metrics
from tempax.train.sources import decode_arrays, encode_arrays
from tests.algorithms.grpo.test_objective import model, prompts, tok  # noqa: F401 - the shared tiny fixtures
from tests.kit.compile_cache import persistent_compile_cache

SETTINGS = GRPOKnobsConfig(group_size=2, max_new_tokens=4, temperature=1.0, beta=0.0, num_iterations=2)


def char_count(prompts, completions, **columns):
    """A synthetic reward with spread inside a group: characters of the completion / 10."""
    return [len(c) / 10.0 for c in completions]


@pytest.fixture(scope="module", autouse=True)
def compile_once(tmp_path_factory):
    """Five trainers of one shape: compile the step once (see tests/kit/compile_cache.py)."""
    with persistent_compile_cache(tmp_path_factory.mktemp("xla-cache")):
        yield


def run(model, tok, prompts, run_dir, *, steps, every_n=0, hooks=(), settings=SETTINGS, guard=None):
    cfg = TrainConfig(
        steps=steps, batch_size=2, mesh=MeshConfig(num_devices=1), run_dir=str(run_dir), tensorboard=False,
        progress_bar=False, check_memory=False, optimizer=OptimizerConfig(learning_rate=3e-2, schedule="constant"),
        checkpoint=CheckpointConfig(every=every_n, save_at_end=True, resume=True, async_save=False),
    )
    source = GRPOSource(tok, PromptSampler(prompts, seed=0), combine_rewards({"chars": char_count}),
                        GRPOPlan.build(settings), prompt_len=24)
    trainer = make_grpo_trainer(model, settings, source.plan, cfg, prompt_len=24, log=lambda s: None, guard=guard)
    try:
        result = trainer.fit(source, hooks=[*grpo_hooks(source, guard), *hooks])
    finally:
        trainer.close()
    return result, source


def test_pending_rollout_survives_json_exactly():
    """The mid-rollout state holds the batch as base64 of its bytes: float32 -0.1 and int32 -7 come back
    bit-identical after a JSON round trip."""
    batch = {"a": np.array([[-0.1, 3.25]], np.float32), "b": np.array([[-7], [2]], np.int32)}
    back = decode_arrays(json.loads(json.dumps(encode_arrays(batch))))
    for k, v in batch.items():
        assert back[k].dtype == v.dtype and back[k].tobytes() == v.tobytes()


@pytest.mark.heavy
def test_killed_resumed_and_stopped_runs_reproduce_the_uninterrupted_run(model, tok, prompts, tmp_path):
    """num_iterations = 2: steps (1, 2) train on rollout 1, (3, 4) on rollout 2, 5 on rollout 3.

    * straight: 5 steps, checkpoints every 3 (step 3 falls between rollout 2's passes);
    * killed: a run of 3 steps (its final checkpoint at 3 is mid-rollout: it stores rollout 2 and 1 pass left),
      then resumed to 5;
    * stopped: a hook returns Stop at step 2 (a rollout boundary); the run saves a checkpoint there although
      `every` is 0, records the reason, and is resumed to 5.
    Both resumed runs train on the same batches, so every loss and every rollout reward equals the straight run's
    exactly (no tolerance), and so do the final weights."""
    straight, _ = run(model, tok, prompts, tmp_path / "straight", steps=5, every_n=3)
    assert [s for s, _ in straight.history] == [1, 2, 3, 4, 5]
    rewards = straight.series("reward/total_mean")
    assert [s for s, _ in rewards] == [1, 3, 5]  # rollout numbers on each rollout's first pass
    assert len({v for _, v in rewards}) > 1 or straight.losses[0] != 0.0
    m1, m2 = straight.history[0][1], straight.history[1][1]
    assert m1["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and m1["clip_frac"] == 0.0
    assert {"perf/generation_s", "perf/train_s", "perf/step_s", "entropy", "groups/zero_spread_frac"} <= set(m1)
    assert "reward/total_mean" not in m2 and "perf/train_s" in m2

    killed, source = run(model, tok, prompts, tmp_path / "killed", steps=3)
    assert killed.last_checkpoint.endswith(os.path.join("checkpoints", "3"))
    assert source.state()["pending"]["passes_left"] == 1 and source.rollouts_done == 2
    resumed, _ = run(model, tok, prompts, tmp_path / "killed", steps=5)
    assert resumed.resumed_from == 3 and [s for s, _ in resumed.history] == [4, 5]

    stop_at_2 = every(1, lambda info: Stop("enough for this test") if info.step == 2 else None)
    stopped, _ = run(model, tok, prompts, tmp_path / "stopped", steps=5, hooks=[stop_at_2])
    assert stopped.stop_reason == "enough for this test"
    assert [s for s, _ in stopped.history] == [1, 2]
    assert stopped.last_checkpoint.endswith(os.path.join("checkpoints", "2"))
    step_record, event = read_metrics(str(tmp_path / "stopped"))[-2:]
    assert step_record["step"] == 2 and step_record["stop_reason"] == "enough for this test" and "loss" in step_record
    assert event == {**event, "step": 2, "event": "stop", "stop_reason": "enough for this test"}
    with open(tmp_path / "stopped" / "summary.json") as f:
        summary = json.load(f)
    assert summary["stop_reason"] == "enough for this test" and summary["step"] == 2
    after_stop, _ = run(model, tok, prompts, tmp_path / "stopped", steps=5)
    assert after_stop.resumed_from == 2 and after_stop.stop_reason is None

    for first, second in ((killed, resumed), (stopped, after_stop)):
        assert first.losses + second.losses == straight.losses
        assert first.series("reward/total_mean") + second.series("reward/total_mean") == rewards
        for key, value in straight.state.params.items():
            assert np.asarray(second.state.params[key]).tobytes() == np.asarray(value).tobytes(), key


@pytest.mark.heavy
def test_the_collapse_guard_adjusts_the_temperature_mid_run_and_resume_stays_exact(model, tok, prompts, tmp_path):
    """A guard that always fires (min_entropy 100 nats), action raise_temperature, window 2, cooldown 10: it fires
    at step 2, the temperature goes 1 -> 1.3 for rollout 2 (steps 3, 4), whose first pass still has ratio 1 (the
    loss uses the batch's temperature, like the sampler), and it does not fire again. Killed at 3 and resumed,
    the run restores the knobs from the source state and the guard's cooldown from metrics.jsonl: the same
    losses, rewards and guard record as the uninterrupted run."""
    from tempax.train.guards import CollapseGuardConfig

    guard = CollapseGuardConfig(action="raise_temperature", min_entropy=100.0, cooldown_steps=10)
    straight, source = run(model, tok, prompts, tmp_path / "straight", steps=4, guard=guard)
    fired = [s for s, m in straight.history if m.get("guard/fired")]
    assert fired == [2] and source.knobs["temperature"] == pytest.approx(1.3)
    m2, m3 = straight.history[1][1], straight.history[2][1]
    assert "sampling temperature 1 -> 1.3" in m2["guard/message"] and "grpo.temperature" in m2["guard/message"]
    assert m3["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and m3["clip_frac"] == 0.0
    killed, _ = run(model, tok, prompts, tmp_path / "killed", steps=3, guard=guard)
    resumed, source = run(model, tok, prompts, tmp_path / "killed", steps=4, guard=guard)
    assert source.knobs["temperature"] == pytest.approx(1.3)
    assert killed.losses + resumed.losses == straight.losses
    assert killed.series("reward/total_mean") + resumed.series("reward/total_mean") == \
        straight.series("reward/total_mean")
    assert not any(m.get("guard/fired") for _, m in resumed.history)


def test_the_entropy_bonus_adjustment_needs_the_term_in_the_compiled_loss(model, tok, prompts, tmp_path):
    """make_grpo_trainer(guard=entropy_bonus) compiles the (traced) bonus into the loss, so the guard can raise
    entropy_coef 0 -> 0.01; a trainer built without it refuses the adjustment instead of silently ignoring it."""
    from tempax.errors import ConfigError
    from tempax.train.guards import CollapseGuardConfig

    guard = CollapseGuardConfig(action="entropy_bonus")
    cfg = TrainConfig(steps=1, batch_size=2, mesh=MeshConfig(num_devices=1), run_dir=str(tmp_path),
                      check_memory=False, progress_bar=False, tensorboard=False)
    for with_guard in (True, False):
        source = GRPOSource(tok, PromptSampler(prompts), combine_rewards({"chars": char_count}),
                            GRPOPlan.build(SETTINGS), prompt_len=24)
        source.attach(make_grpo_trainer(model, SETTINGS, source.plan, cfg, prompt_len=24, log=lambda s: None,
                                        guard=guard if with_guard else None))
        if with_guard:
            assert source.adjust("entropy_bonus", guard) == "entropy_coef 0 -> 0.01"
        else:
            with pytest.raises(ConfigError, match="entropy_bonus needs the bonus term"):
                source.adjust("entropy_bonus", guard)


def test_steps_after_the_first_compile_nothing(model, tok, prompts, tmp_path):
    """No program is traced after the first GRPO step: sampling, the reference pass and the update run the
    programs the first step built (every step has the same shapes), so a long run pays compilation once."""
    import jax

    from tempax.train.hooks import FunctionHook

    traced: list[int] = []
    step_now = [0]

    def listen(event, _secs, **_):
        if event == "/jax/core/compile/jaxpr_trace_duration":
            traced.append(step_now[0])

    def mark(info):
        step_now[0] = info.step

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        run(model, tok, prompts, tmp_path / "run", steps=3, hooks=[FunctionHook(1, mark)])
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    per_step = {step: traced.count(step) for step in range(4)}
    assert per_step[0] > 0  # the first step built its programs
    assert per_step[1] == per_step[2] == 0, per_step
