"""GRPO's rollouts as a batch source for `Trainer.fit` (the protocol: `tempax.train.sources`), and its hooks.

    plan = GRPOPlan.build(settings)           # the values the recipe settles (tempax.algorithms.grpo.plan)
    trainer = make_grpo_trainer(model, settings, plan, cfg.train, prompt_len=96, trainable=lora_filter)
    source = GRPOSource(tokenizer, PromptSampler(prompts), reward_fn, plan, prompt_len=96)
    result = trainer.fit(source, hooks=grpo_hooks(source))

`GRPOSource` says how a rollout is made and trained on, with rollout workers or without, what the collapse guard
may change, and what it resumes from.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tempax.algorithms.grpo.config import GRPOKnobsConfig
from tempax.algorithms.grpo.objective import make_grpo_loss
from tempax.algorithms.grpo.plan import GRPOPlan, RolloutOptions
from tempax.rl.logprobs import completion_logprobs, logprobs_no_grad
from tempax.rl.rollout import PromptSampler, Rollout, build_batch, fill_with_spread, rollout_metrics
from tempax.errors import ConfigError
from tempax.parallel.process import host_array
from tempax.parallel.rules import use_mesh
from tempax.runtime.host_memory import release_free_heap
from tempax.rl.async_source import RolloutQueue
from tempax.rl.rollout_state import prompt_from_json, prompt_to_json, rollout_from_json, rollout_to_json
from tempax.rl.throughput import ThroughputSplit
from tempax.rl.workers import RayConfig, WorkerPool, require_ray
from tempax.train.config import TrainConfig
from tempax.train.guards import CollapseGuard, CollapseGuardConfig
from tempax.train.hooks import Hook, StepInfo
from tempax.train.loop import Trainer
from tempax.train.trainable import Trainable
from tempax.train.sources import decode_arrays, encode_arrays
from tempax.train.view import TrainerView
from tempax.models.lora import disable_adapters

Batch = dict[str, np.ndarray]

# The batch keys a no-grad forward pass reads.
_FORWARD_KEYS = ("prompt_tokens", "prompt_segments", "completion_tokens", "completion_mask", "completion_segments")


def grpo_trainable(model: nnx.Module, plan: GRPOPlan, *, prompt_len: int) -> Trainable:
    """The policy with the memory plan sized for a GRPO row: one prompt of `prompt_len` tokens plus its G
    completions (episodes) of the plan's episode budget."""
    return Trainable(model, tokens_per_row=plan.tokens_per_row(prompt_len))


def grpo_loss(settings: GRPOKnobsConfig, guard: CollapseGuardConfig | None = None) -> Any:
    """`make_grpo_loss(settings)`; with a guard whose action is `entropy_bonus`, the loss carries the (traced,
    initially `settings.entropy_coef`) bonus term."""
    bonus = guard is not None and guard.enabled and guard.action == "entropy_bonus"
    return make_grpo_loss(settings, entropy_bonus=bonus)


def make_grpo_trainer(
    model: nnx.Module,
    settings: GRPOKnobsConfig,
    plan: GRPOPlan,
    train: TrainConfig,
    *,
    prompt_len: int,
    trainable: Any = nnx.Param,
    mesh: Any = None,
    log: Callable[[str], None] | None = None,
    checkpoint_meta: dict[str, Any] | None = None,
    guard: CollapseGuardConfig | None = None,
) -> Trainer:
    """The `Trainer` of a GRPO run on its own (tests, benchmarks): `grpo_loss(settings)` on
    `grpo_trainable(model, plan)`."""
    return Trainer(
        grpo_trainable(model, plan, prompt_len=prompt_len),
        grpo_loss(settings, guard), train,
        trainable=trainable, mesh=mesh, log=log, checkpoint_meta={"algorithm": "GRPO", **(checkpoint_meta or {})},
    )


class GRPOSource:
    """Rollouts of the current policy, as fixed-shape GRPO batches.

    Each rollout, drawn lazily when `fit` asks for the next batch (so from the weights the previous step produced):
      1. sample G completions for each of `train.batch_size` prompts with the current policy (`trainer.model`; the G
         samples of a prompt share one prefill), score them, compute group advantages (`rollout.sample_rollout`).
         With DAPO dynamic sampling, zero-spread groups are dropped and more prompts are sampled;
      2. one fixed-shape row per prompt (`rollout.build_batch`), plus reference log-probs when beta > 0 (LoRA: the
         same weights with the adapters switched off; full-weight: a frozen copy of the starting weights) and
         recomputed old log-probs when `old_logprobs: recompute`;
      3. the same batch is yielded `num_iterations` times (one optimizer step each).

    With `grpo.workers` > 0, step 1 runs in rollout workers beside the trainer (Ray actors; `tempax.rl.async_source`
    requests each rollout with the prompts and seed this process would use, at most `grpo.max_staleness` policy
    versions ahead) and step 2 stays here; stale rollouts carry the sampler's log-probs (`sampler_logp`) for the
    importance weights of the loss (docs/async-rl.md).

    The knobs the collapse guard (`tempax.train.guards`) may change — sampling temperature, upper clip range, entropy
    coefficient — live in `knobs`, go into every batch as per-row values (the step is compiled once) and into
    `state()`.

    Resume (the boundary rule of `tempax.train.sources`): `state()` holds the prompt sampler's position and the
    rollout count (which seeds the sampler), and, between two passes over one rollout, the rollout's batch and the
    passes left, so a checkpoint or a stop at any step resumes into exactly the batches of the uninterrupted run.

    Metrics of a rollout's first pass (`batch_metrics`): rewards per function, zero-spread groups, advantages,
    completion lengths, duplicate completions, and the time split `perf/generation_s`, `perf/reward_s`,
    `perf/reference_s`, rollouts/s and generated tokens/s; `ThroughputSplit` adds the step's training time.


    Args:
      tokenizer: the policy's tokenizer.
      sampler: where prompts come from (its position is part of `state()`).
      reward_fn: a `tempax.rewards.CombinedReward` (never raises; failures are counted).
      plan: what the run's recipe settles (`GRPOPlan`): sampling, passes, the reference, the environment
        episodes play (`sampler`'s prompts must come from `encode_prompts` with its `env_factory`).
      prompt_len: Lp, the fixed (left-padded) prompt length of every batch; no prompt may be longer.
      reference: full-weight training with beta > 0: the starting model, the frozen reference (copied here,
        so build the source before the trainer takes the weights). LoRA runs use the base with the adapters
        off and need none.
      ray: where the rollout workers run when `plan.workers` > 0 (then the rollouts come from a
        `tempax.rl.async_source.RolloutQueue` fed by Ray actors instead of this process; call `close()` after
        training to stop them).
    """

    def __init__(
        self,
        tokenizer: Any,
        sampler: PromptSampler,
        reward_fn: Any,
        plan: GRPOPlan,
        *,
        prompt_len: int,
        reference: nnx.Module | None = None,
        ray: RayConfig | None = None,
    ):
        self.tokenizer = tokenizer
        self.plan = plan
        self.sampler = sampler
        self.reward_fn = reward_fn
        self.prompt_len = int(prompt_len)
        self._reference: tuple[Any, Any] | None = None
        if reference is not None and plan.beta > 0:
            graphdef, state = nnx.split(reference)
            self._reference = (graphdef, jax.tree.map(jnp.copy, state))
        self.trainer: TrainerView | None = None
        self.rollouts_done = 0
        self.last_rollout: Rollout | None = None
        self._batch: Batch | None = None
        self._passes_left = 0
        self._metrics: dict[str, float] = {}
        # What the collapse guard may change mid-run (part of `state()`, written into every batch).
        self.knobs: dict[str, float] = dict(plan.knobs)
        self.ray_config = ray or RayConfig()
        self.queue: RolloutQueue | None = None
        self._queue_metrics: dict[str, float] = {}
        if plan.workers > 0:
            require_ray()
            self.queue = RolloutQueue(self._start_workers, max_staleness=plan.max_staleness,
                                      encode=rollout_to_json, decode=rollout_from_json)

    # -- the protocol -----------------------------------------------------------------------------------------
    def attach(self, trainer: TrainerView) -> None:
        """Keeps the trainer's view (the policy to sample from) and jits the no-grad forward passes over its
        weights."""
        if self.plan.beta > 0 and trainer.full_finetune and self._reference is None:
            raise ConfigError(
                "GRPO with full-weight training and grpo.beta > 0 needs the frozen reference: pass the starting "
                "model as GRPOSource(..., reference=model), or set grpo.beta=0"
            )
        self.trainer = trainer
        parts = trainer.parts

        def policy(params: Any, rest: Any, batch: Batch, tau: jax.Array) -> jax.Array:
            return completion_logprobs(parts.merge(params, rest), batch, temperature=tau)[0]

        def adapters_off(params: Any, rest: Any, batch: Batch, tau: jax.Array) -> jax.Array:
            model = parts.merge(params, rest)
            with disable_adapters(model):  # a static switch: the trace computes the base model
                return completion_logprobs(model, batch, temperature=tau)[0]

        self._policy_logprobs = jax.jit(policy)
        self._base_logprobs = jax.jit(adapters_off)

    def __iter__(self) -> Iterator[Batch]:
        while True:
            if self._passes_left == 0:
                self._next_rollout()
            else:
                self._metrics = {}  # rollout numbers belong to the rollout's first pass
            self._passes_left -= 1
            assert self._batch is not None
            yield self._batch

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"sampler": self.sampler.state(), "rollouts": self.rollouts_done,
                                 "knobs": dict(self.knobs)}
        if self.queue is not None:
            state["queue"] = self.queue.state()
        if self._passes_left > 0 and self._batch is not None:
            state["pending"] = {"passes_left": self._passes_left, "batch": encode_arrays(self._batch)}
        return state

    def restore(self, state: dict[str, Any]) -> None:
        if state.get("sampler"):
            self.sampler.restore(state["sampler"])
        self.rollouts_done = int(state.get("rollouts", 0))
        self.knobs.update({k: float(v) for k, v in state.get("knobs", {}).items()})
        if self.queue is not None and state.get("queue"):
            self.queue.restore(state["queue"])
        pending = state.get("pending")
        self._batch = decode_arrays(pending["batch"]) if pending else None
        self._passes_left = int(pending["passes_left"]) if pending else 0

    def batch_metrics(self) -> dict[str, float]:
        return self._metrics

    # -- pieces -----------------------------------------------------------------------------------------------
    def _attached(self) -> TrainerView:
        if self.trainer is None:
            raise RuntimeError("GRPOSource.attach(trainer) must run first (Trainer.fit does it)")
        return self.trainer

    def _next_rollout(self) -> None:
        t0 = time.perf_counter()
        rollout = self.rollout()
        batch, extra_s = self.make_batch(rollout)
        self.last_rollout, self._batch, self._passes_left = rollout, batch, self.plan.passes
        # Generation and the reference pass freed their temporaries; give those heap pages back before the
        # train step's temporaries arrive on top of them (tempax.runtime.host_memory.release_free_heap).
        release_free_heap()
        self._metrics = {**rollout_metrics(rollout), **_perf(rollout, extra_s, time.perf_counter() - t0),
                         **self._queue_metrics}

    def rollout(self) -> Rollout:
        """One step's rollout of `train.batch_size` groups (with dynamic sampling, several rounds)."""
        if self.queue is not None:
            return self._queued_rollout()
        trainer, plan = self._attached(), self.plan
        num_prompts = trainer.batch_size
        rounds: list[Rollout] = []
        model = trainer.model
        for r in range(plan.sampling_rounds):
            rounds.append(plan.rollout.sample(
                model, self.tokenizer, self.sampler.next(num_prompts), self.reward_fn,
                temperature=self.knobs["temperature"], seed=self._seed(r), env_factory=plan.env_factory,
            ))
            with_spread = sum(int((~ro.zero_spread).sum()) for ro in rounds)
            if with_spread >= num_prompts:
                break
        self.rollouts_done += 1
        return fill_with_spread(rounds, num_prompts) if plan.dynamic_sampling else rounds[0]

    def _seed(self, round_index: int = 0) -> int:
        return (self._attached().seed * 1_000_003 + self.rollouts_done * 101 + round_index) % (2**31 - 1)

    def _queued_rollout(self) -> Rollout:
        """The next rollout from the workers (`tempax.rl.async_source`): requested with the same prompts and seed
        the in-process path would use, sampled by a version at most `max_staleness` behind."""
        trainer = self._attached()
        assert self.queue is not None
        rollout, self._queue_metrics = self.queue.next(trainer.step, lambda: trainer.params, self._request)
        return rollout

    def _request(self) -> dict[str, Any]:
        payload = {"prompts": [prompt_to_json(p) for p in self.sampler.next(self._attached().batch_size)],
                   "seed": self._seed(), "temperature": self.knobs["temperature"]}
        self.rollouts_done += 1
        return payload

    def _start_workers(self, params: dict[str, Any], version: int) -> WorkerPool:
        trainer = self._attached()
        rollout_fn = functools.partial(remote_group_rollout, tokenizer=self.tokenizer, reward_fn=self.reward_fn,
                                       options=self.plan.rollout)
        return WorkerPool(rollout_fn, trainer.parts, params, num_workers=self.plan.workers,
                          ray_config=self.ray_config, version=version)

    def close(self) -> None:
        """Stops the rollout workers (and a local Ray instance this source started)."""
        if self.queue is not None:
            self.queue.close()

    def make_batch(self, rollout: Rollout) -> tuple[Batch, float]:
        """(training batch, seconds spent on extra forward passes: reference and recomputed old log-probs)."""
        plan = self.plan
        batch = build_batch(rollout, prompt_len=self.prompt_len, pad_id=self.tokenizer.pad_id,
                            with_old_logp=plan.passes > 1 and not plan.recompute_old_logprobs)
        p = rollout.num_prompts
        batch.update({name: np.full((p,), value, np.float32) for name, value in self.knobs.items()})
        if self.queue is not None and plan.max_staleness > 0:
            batch["sampler_logp"] = rollout.logprobs.astype(np.float32)  # for the importance weights
        t0 = time.perf_counter()
        if plan.recompute_old_logprobs:
            batch["old_logp"] = self.policy_logprobs(batch)
        if plan.beta > 0:
            batch["ref_logp"] = self.reference_logprobs(batch)
        return batch, time.perf_counter() - t0

    def _chunked(self, fn: Callable[[dict[str, jax.Array]], jax.Array], batch: Batch) -> np.ndarray:
        """fn over the batch micro-batch by micro-batch (bounded [rows, T, vocab] logits) -> [P, G, T]."""
        trainer = self._attached()
        p = batch["prompt_tokens"].shape[0]
        step = trainer.micro_batch_size
        out = []
        with use_mesh(trainer.mesh):
            for start in range(0, p, step):
                part = trainer.put_batch({k: batch[k][start:start + step] for k in _FORWARD_KEYS})
                out.append(host_array(fn(part)))  # the result may span processes
        return np.concatenate(out, axis=0)

    def reference_logprobs(self, batch: Batch) -> np.ndarray:
        """log p_tau of the completions under the frozen reference (base with adapters off, or the copy)."""
        trainer = self._attached()
        tau = jnp.float32(self.knobs["temperature"])
        if self._reference is not None:
            graphdef, state = self._reference
            return self._chunked(lambda b: logprobs_no_grad(graphdef, state, b, tau), batch)
        params, rest = trainer.params, trainer.rest
        return self._chunked(lambda b: self._base_logprobs(params, rest, b, tau), batch)

    def policy_logprobs(self, batch: Batch) -> np.ndarray:
        """log p_tau of the completions under the current policy (no gradient)."""
        trainer = self._attached()
        params, rest, tau = trainer.params, trainer.rest, jnp.float32(self.knobs["temperature"])
        return self._chunked(lambda b: self._policy_logprobs(params, rest, b, tau), batch)

    # -- what the collapse guard may change -------------------------------------------------------------------
    def adjust(self, action: str, guard: CollapseGuardConfig) -> str:
        """Applies a guard adjustment from the next rollout on; returns what changed."""
        k = self.knobs
        if action == "raise_temperature":
            old, k["temperature"] = k["temperature"], min(k["temperature"] + guard.temperature_step,
                                                          max(guard.max_temperature, k["temperature"]))
            return f"sampling temperature {old:g} -> {k['temperature']:g}"
        if action == "clip_higher":
            old, k["eps_high"] = k["eps_high"], max(k["eps_high"], guard.clip_high)
            return f"upper clip range epsilon_high {old:g} -> {k['eps_high']:g}"
        if action == "entropy_bonus":
            if not getattr(self._attached().loss_fn, "has_entropy_bonus", False):
                raise ConfigError(
                    "the collapse guard's entropy_bonus needs the bonus term in the compiled loss: build the trainer "
                    "with make_grpo_trainer(..., guard=guard) (or set grpo.entropy_coef > 0)"
                )
            old, k["entropy_coef"] = k["entropy_coef"], max(k["entropy_coef"], guard.entropy_coef)
            return f"entropy_coef {old:g} -> {k['entropy_coef']:g}"
        raise ConfigError(f"GRPO cannot apply the guard action {action!r}")

    def advice(self, guard: CollapseGuardConfig) -> str:
        """The concrete remedies, with the run's current values."""
        k, lr = self.knobs, (self.trainer.learning_rate if self.trainer is not None else None)
        return (f"raise grpo.temperature (now {k['temperature']:g}; try {k['temperature'] + guard.temperature_step:g}), "
                f"set grpo.epsilon_high={max(guard.clip_high, k['eps_high']):g} (clip-higher; now {k['eps_high']:g}), "
                f"set grpo.entropy_coef={guard.entropy_coef:g} (now {k['entropy_coef']:g})"
                + (f", or lower train.optimizer.learning_rate (now {lr:g})" if lr is not None else "")
                + "; guard.action=raise_temperature|clip_higher|entropy_bonus makes the guard apply one itself")


def remote_group_rollout(model: Any, payload: dict[str, Any], *, tokenizer: Any, reward_fn: Any,
                         options: RolloutOptions) -> Rollout:
    """What a rollout worker runs for a GRPO request (`GRPOSource._request`'s payload; one-turn tasks only)."""
    return options.sample(model, tokenizer, [prompt_from_json(p) for p in payload["prompts"]], reward_fn,
                          temperature=float(payload["temperature"]), seed=int(payload["seed"]))


def _perf(rollout: Rollout, extra_s: float, data_s: float) -> dict[str, float]:
    gen_s = rollout.seconds.get("generation", 0.0)
    completions = rollout.groups_sampled * rollout.group_size
    return {
        "perf/generation_s": gen_s,
        "perf/reward_s": rollout.seconds.get("reward", 0.0),
        "perf/reference_s": extra_s,
        "perf/rollout_s": data_s,
        "perf/rollouts_per_s": completions / max(gen_s, 1e-9),
        "perf/generated_tokens_per_s": float(rollout.lengths.sum()) / max(gen_s, 1e-9),
    }


# ---------------------------------------------------------------------------------------------------- hooks


class ShowCompletions(Hook):
    """Prints the best-rewarded completion of the latest rollout every `every` steps."""

    def __init__(self, source: GRPOSource, every: int):
        super().__init__(every=every, at_end=False)
        self.source = source

    def __call__(self, info: StepInfo) -> None:
        rollout = self.source.last_rollout
        if rollout is None:
            return
        i = int(np.argmax(rollout.rewards.reshape(-1)))
        p, j = divmod(i, rollout.group_size)
        question = rollout.prompts[p].columns.get("question", "")
        info.trainer.write(
            f"step {info.step} best completion (reward {rollout.rewards[p, j]:.2f}) for: {question}\n"
            f"{rollout.texts[p][j]}"
        )


def grpo_hooks(source: GRPOSource, guard: CollapseGuardConfig | None = None) -> list[Hook]:
    """The hooks every GRPO run gets: the time split, the collapse guard (default thresholds, warn-only, unless
    `guard` says otherwise), and sample completions when the plan's `show_completion_every`."""
    guard = guard if guard is not None else CollapseGuardConfig()
    hooks: list[Hook] = [ThroughputSplit()]
    if guard.enabled:
        hooks.append(CollapseGuard(guard, adjust=lambda action: source.adjust(action, guard),
                                   advice=lambda: source.advice(guard)))
    if source.plan.show_completion_every:
        hooks.append(ShowCompletions(source, source.plan.show_completion_every))
    return hooks
