"""The GRPO learner: the loss function for the shared train step, and the driver that alternates rollouts and
optimizer steps.

    learner = GRPOLearner(model, tokenizer, reward_fn, settings, train_config, prompt_len=96,
                          trainable=lora_filter)
    result = learner.run(PromptSampler(prompts))

Each step of the driver:
  1. rollout: sample G completions for each of P prompts with the current policy (`Trainer.model`; the G
     samples of a prompt share one prefill), score them, compute group advantages
     (`tempax.algorithms.grpo.rollout`). With DAPO dynamic sampling, zero-spread groups are dropped and more
     prompts are sampled.
  2. batch: one fixed-shape row per prompt (`build_batch`); reference log-probs are added when beta > 0 (LoRA:
     the same weights with the adapters switched off; full-weight: a frozen copy of the starting weights).
  3. num_iterations optimizer steps on that batch through `Trainer.train_step` (the one jitted step of
     `tempax.train`), the loss being `grpo_loss` of the current log-probs against the sampling-time ones.
  4. metrics (rewards per function, zero-spread groups, advantages, KL, entropy, clip fraction, lengths,
     rollouts/s, time split) written through the trainer's `MetricsWriter`, hooks, checkpoints.

Log-probs: the sampler records log p_tau = log softmax(z / tau) of each token, and the training forward computes
the same quantity at the same temperature, so on the first pass over a batch the ratio pi / pi_old is 1 up to
float rounding (the test checks it). With num_iterations = 1 the loss uses pi_old = stop_gradient(pi), which is
exactly 1.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tempax.algorithms.grpo.config import GRPOSettings
from tempax.algorithms.grpo.losses import grpo_loss
from tempax.algorithms.grpo.rollout import (
    PromptSampler,
    Rollout,
    build_batch,
    fill_with_spread,
    rollout_metrics,
    sample_rollout,
)
from tempax.models.cache import KVCache
from tempax.models.logprobs import masked_mean, token_entropy, token_logprobs
from tempax.parallel.rules import use_mesh
from tempax.train.config import TrainConfig
from tempax.train.hooks import Hook, StepInfo
from tempax.train.loop import Trainer
from tempax.train.metrics import MetricsWriter, ProgressBar

Batch = dict[str, jax.Array]


# ------------------------------------------------------------------------------------------------ forward pass


def completion_hidden(model: nnx.Module, batch: Batch) -> jax.Array:
    """[P * G, T, D] final hidden states that predict each completion token, running each prompt once.

    The prompts [P, Lp] (left-padded) go through the model with a KV cache; the cache is repeated G times and the
    completions [P * G, T] attend to it, exactly as the sampler's shared prefill does. Token j of a completion is
    predicted by the hidden state before it: the prompt's last position for j = 0, completion position j - 1
    otherwise (also the state a PPO value head reads for token j). Gradients flow through the shared prompt pass.
    """
    prompt, prompt_seg = batch["prompt_tokens"], batch["prompt_segments"]
    comp, mask = batch["completion_tokens"], batch["completion_mask"]
    p, lp = prompt.shape
    _, g, t = comp.shape
    cache = KVCache.init(model.config, p, lp + t)
    hidden_p, cache = model.hidden_states(prompt, segment_ids=prompt_seg, cache=cache)
    if g > 1:
        cache = cache.repeat(g)
    # Tokens after a completion's end get segment 0: they attend to nothing and nothing reads them.
    comp_seg = (mask.reshape(p * g, t) > 0).astype(jnp.int32)
    hidden_c, _ = model.hidden_states(comp.reshape(p * g, t), segment_ids=comp_seg, cache=cache)
    first = jnp.repeat(hidden_p[:, -1:], g, axis=0)  # [P * G, 1, D]
    return jnp.concatenate([first, hidden_c[:, :-1]], axis=1)


def completion_logprobs(
    model: nnx.Module, batch: Batch, *, temperature: float, with_entropy: bool = False
) -> tuple[jax.Array, jax.Array | None]:
    """log p_tau of every completion token, running each prompt once for its whole group (`completion_hidden`).

    Args:
      model: a `tempax.models.decoder.Decoder` (LoRA/QLoRA-wrapped or not).
      batch: `prompt_tokens`, `prompt_segments` [P, Lp]; `completion_tokens`, `completion_mask` [P, G, T].
      temperature: tau; the log-probs are of softmax(z / tau), like the sampler's.
      with_entropy: also return the token entropy of softmax(z / tau) (no gradient).

    Returns:
      (logp [P, G, T] float32, entropy [P, G, T] or None); values at masked positions are meaningless.
    """
    p, g, t = batch["completion_tokens"].shape
    comp_flat = batch["completion_tokens"].reshape(p * g, t)
    logits_btv = model.logits(completion_hidden(model, batch))
    logp = token_logprobs(logits_btv, comp_flat, temperature=temperature).reshape(p, g, t)
    entropy = None
    if with_entropy:
        entropy = token_entropy(jax.lax.stop_gradient(logits_btv), temperature=temperature).reshape(p, g, t)
    return logp, entropy


def make_grpo_loss(settings: GRPOSettings) -> Callable[[nnx.Module, Batch], tuple[jax.Array, dict[str, jax.Array]]]:
    """`loss_fn(model, batch)` for `tempax.train.Trainer`: `grpo_loss` on the batch of `build_batch`.

    `old_logp` is used when the batch holds it (num_iterations > 1), else pi_old = stop_gradient(pi); `ref_logp`
    when it holds it (beta > 0). `loss_weight` is the token count for 'token_mean' and the number of non-empty
    completions otherwise, so gradient accumulation over prompt micro-batches reproduces the full-batch loss.
    """
    token_weighted = settings.loss_aggregation == "token_mean"

    def loss_fn(model: nnx.Module, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        logp, entropy = completion_logprobs(
            model, batch, temperature=settings.temperature, with_entropy=settings.log_entropy
        )
        p, g, t = logp.shape
        flat = lambda x: None if x is None else x.reshape(p * g, t)  # noqa: E731
        mask = flat(batch["completion_mask"])
        loss, metrics = grpo_loss(
            flat(logp), flat(batch.get("old_logp")), flat(batch.get("ref_logp")),
            batch["advantages"].reshape(p * g), mask,
            beta=settings.beta, eps_low=settings.epsilon, eps_high=settings.eps_high,
            aggregation=settings.loss_aggregation, importance=settings.importance_sampling, max_len=t,
        )
        metrics = dict(metrics)
        if entropy is not None:
            metrics["entropy"] = masked_mean(flat(entropy), mask)
        rows = jnp.sum((jnp.sum(mask, axis=-1) > 0).astype(jnp.float32))
        metrics["loss_weight"] = metrics["num_tokens"] if token_weighted else rows
        return loss, metrics

    return loss_fn


@functools.partial(jax.jit, static_argnames=("graphdef",))
def logprobs_no_grad(graphdef: Any, state: Any, batch: Batch, temperature: jax.Array | float) -> jax.Array:
    """`completion_logprobs` of `nnx.merge(graphdef, state)` without gradients; the temperature is traced, so one
    executable serves every temperature."""
    return completion_logprobs(nnx.merge(graphdef, state), batch, temperature=temperature)[0]


# ------------------------------------------------------------------------------------------------- the driver


@dataclass
class GRPOResult:
    """What `GRPOLearner.run` returns.

    Attributes:
      history: (optimizer step, host metrics) of every logged step.
      last_checkpoint: path of the last checkpoint written, or None.
      resumed_from: the optimizer step the run resumed from.
      seconds: total wall time per stage (generation, reward, reference, train).
      last_rollout: the final rollout (texts, rewards), for inspection.
    """

    history: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    last_checkpoint: str | None = None
    resumed_from: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    last_rollout: Rollout | None = None

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(s, m[key]) for s, m in self.history if key in m]


def _is_lora_filter(trainable: Any) -> bool:
    return trainable is nnx.LoRAParam


class GRPOLearner:
    """Alternates rollouts and `Trainer.train_step` (see the module docstring).

    Args:
      model: the starting policy (a `Decoder`, LoRA/QLoRA-wrapped when `trainable` is `lora_filter`).
      tokenizer: its tokenizer.
      reward_fn: a `tempax.rewards.CombinedReward` (never raises; failures are counted).
      settings: the algorithm knobs.
      train: the training-loop config (`batch_size` = prompts per step, `steps` = optimizer updates).
      prompt_len: Lp, the fixed (left-padded) prompt length of every batch; no prompt may be longer.
      trainable: `nnx.Param` (full weights) or `lora_filter` (adapters only).
      mesh: a mesh to use instead of building `train.mesh`.
      log: where messages go (default stderr).
      checkpoint_meta: extra JSON stored with checkpoints.
    """

    def __init__(
        self,
        model: nnx.Module,
        tokenizer: Any,
        reward_fn: Any,
        settings: GRPOSettings,
        train: TrainConfig,
        *,
        prompt_len: int,
        trainable: Any = nnx.Param,
        mesh: Any = None,
        log: Callable[[str], None] | None = None,
        checkpoint_meta: dict[str, Any] | None = None,
    ):
        self.settings = settings
        self.tokenizer = tokenizer
        self.reward_fn = reward_fn
        self.prompt_len = int(prompt_len)
        self._say = log or (lambda text: print(text, file=sys.stderr))
        self.use_adapters_as_reference = _is_lora_filter(trainable)
        self._reference: tuple[Any, Any] | None = None
        if settings.beta > 0 and not self.use_adapters_as_reference:
            # Full-weight training: keep a frozen copy of the starting weights (copied, because the trainer
            # donates its parameter buffers every step).
            graphdef, state = nnx.split(model)
            self._reference = (graphdef, jax.tree.map(jnp.copy, state))
        # Tokens per row for the memory plan: the prompt once plus G completions.
        tokens_per_row = self.prompt_len + settings.group_size * settings.max_new_tokens
        self.train_config = dataclasses.replace(train, seq_len=tokens_per_row)
        self.trainer = Trainer(
            model, make_grpo_loss(settings), self.train_config, trainable=trainable, mesh=mesh, log=self._say,
            checkpoint_meta={"algorithm": "GRPO", **(checkpoint_meta or {})},
        )
        self.rollouts_done = 0
        # No-grad forward passes of (trainable params, frozen rest, batch), jitted once like the train step (no
        # per-call split of the model or hashing of its graph).
        parts, temperature = self.trainer.parts, settings.temperature

        def policy(params: Any, rest: Any, batch: Batch) -> jax.Array:
            return completion_logprobs(parts.merge(params, rest), batch, temperature=temperature)[0]

        def adapters_off(params: Any, rest: Any, batch: Batch) -> jax.Array:
            from tempax.models.lora import disable_adapters

            model = parts.merge(params, rest)
            with disable_adapters(model):  # a static switch: the trace computes the base model
                return completion_logprobs(model, batch, temperature=temperature)[0]

        self._policy_logprobs = jax.jit(policy)
        self._base_logprobs = jax.jit(adapters_off)

    # -- pieces ---------------------------------------------------------------------------------------------
    @property
    def model(self) -> nnx.Module:
        """The current policy."""
        return self.trainer.model

    def _chunked(self, fn: Callable[[dict[str, jax.Array]], jax.Array], batch: dict[str, np.ndarray]) -> np.ndarray:
        """fn over the batch micro-batch by micro-batch (bounded [rows, T, vocab] logits) -> [P, G, T]."""
        keys = ("prompt_tokens", "prompt_segments", "completion_tokens", "completion_mask")
        p = batch["prompt_tokens"].shape[0]
        step = self.trainer.micro_batch_size
        out = []
        with use_mesh(self.trainer.mesh):
            for start in range(0, p, step):
                part = self.trainer.put_batch({k: batch[k][start:start + step] for k in keys})
                out.append(np.asarray(fn(part)))
        return np.concatenate(out, axis=0)

    def reference_logprobs(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """log p_tau of the completions under the frozen reference (base with adapters off, or the copy)."""
        if self._reference is not None:
            graphdef, state = self._reference
            tau = jnp.float32(self.settings.temperature)
            return self._chunked(lambda b: logprobs_no_grad(graphdef, state, b, tau), batch)
        params, rest = self.trainer.state.params, self.trainer.rest
        return self._chunked(lambda b: self._base_logprobs(params, rest, b), batch)

    def policy_logprobs(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """log p_tau of the completions under the current policy (no gradient)."""
        params, rest = self.trainer.state.params, self.trainer.rest
        return self._chunked(lambda b: self._policy_logprobs(params, rest, b), batch)

    def rollout(self, sampler: PromptSampler) -> Rollout:
        """One step's rollout of `train.batch_size` groups (with dynamic sampling, several rounds)."""
        s = self.settings
        num_prompts = self.train_config.batch_size
        rounds: list[Rollout] = []
        max_rounds = s.max_sampling_rounds if s.dynamic_sampling else 1
        model = self.trainer.model
        for r in range(max_rounds):
            seed = (self.train_config.seed * 1_000_003 + self.rollouts_done * 101 + r) % (2**31 - 1)
            rounds.append(sample_rollout(
                model, self.tokenizer, sampler.next(num_prompts), self.reward_fn, group_size=s.group_size,
                max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, seed=seed,
                scale_rewards=s.scale_rewards, overlong_penalty_tokens=s.overlong_penalty_tokens,
            ))
            with_spread = sum(int((~ro.zero_spread).sum()) for ro in rounds)
            if with_spread >= num_prompts:
                break
        self.rollouts_done += 1
        return fill_with_spread(rounds, num_prompts) if s.dynamic_sampling else rounds[0]

    def make_batch(self, rollout: Rollout) -> tuple[dict[str, np.ndarray], float]:
        """(training batch, seconds spent on extra forward passes: reference and recomputed old log-probs)."""
        s = self.settings
        reuse = s.num_iterations > 1
        batch = build_batch(rollout, prompt_len=self.prompt_len, pad_id=self.tokenizer.pad_id,
                            with_old_logp=reuse and s.old_logprobs == "sampling")
        t0 = time.perf_counter()
        if reuse and s.old_logprobs == "recompute":
            batch["old_logp"] = self.policy_logprobs(batch)
        if s.beta > 0:
            batch["ref_logp"] = self.reference_logprobs(batch)
        return batch, time.perf_counter() - t0

    # -- the loop -------------------------------------------------------------------------------------------
    def run(
        self,
        sampler: PromptSampler,
        *,
        hooks: Sequence[Hook] = (),
        on_step: Callable[[int, dict[str, float], Rollout], None] | None = None,
    ) -> GRPOResult:
        """Trains until `train.steps` optimizer updates, resuming from run_dir's latest checkpoint when allowed.

        Args:
          sampler: where prompts come from (its position is checkpointed).
          hooks: `tempax.train.hooks.Hook`s called after due optimizer steps; `info.metrics()` holds the merged
            host metrics of that step.
          on_step: called as on_step(step, metrics, rollout) after every rollout's last optimizer pass.
        """
        cfg = self.train_config
        trainer = self.trainer
        result = GRPOResult()
        start = 0
        if cfg.checkpoint.resume:
            import os

            ckpt_dir = os.path.join(trainer.run_dir, "checkpoints")
            if os.path.isdir(ckpt_dir) and os.listdir(ckpt_dir):
                data_state = trainer.restore()
                if data_state is not None:
                    start = trainer.step
                    if data_state.get("sampler"):
                        sampler.restore(data_state["sampler"])
                    self.rollouts_done = int(data_state.get("rollouts", 0))
                    self._say(f"resumed from {os.path.join(ckpt_dir, str(start))} (step {start})")
        result.resumed_from = start
        trainer.writer = MetricsWriter(trainer.run_dir, tensorboard=cfg.tensorboard)
        trainer.progress = ProgressBar(cfg.steps, initial=start, enabled=cfg.progress_bar, desc="grpo")
        totals = {"generation": 0.0, "reward": 0.0, "reference": 0.0, "train": 0.0}
        step = start
        try:
            with use_mesh(trainer.mesh):
                for hook in hooks:
                    hook.start(trainer)
                while step < cfg.steps:
                    t_start = time.perf_counter()
                    rollout = self.rollout(sampler)
                    batch, extra_s = self.make_batch(rollout)
                    roll_m = rollout_metrics(rollout)
                    passes = min(self.settings.num_iterations, cfg.steps - step)
                    train_s = 0.0
                    for it in range(passes):
                        t0 = time.perf_counter()
                        device_metrics = trainer.train_step(batch)
                        train_m = {k: float(v) for k, v in jax.device_get(device_metrics).items()
                                   if np.ndim(v) == 0}
                        train_s += time.perf_counter() - t0
                        step += 1
                        trainer.check_finite()
                        metrics = dict(train_m)
                        if it == 0:
                            metrics.update(roll_m)
                        is_last = step >= cfg.steps
                        if it == passes - 1:
                            metrics.update(self._perf(rollout, extra_s, train_s, time.perf_counter() - t_start))
                        if step % cfg.log_every == 0 or is_last:
                            trainer.log(step, metrics)
                        result.history.append((step, metrics))
                        trainer.progress.update(1, metrics)
                        info = StepInfo(step, trainer, is_last, self._data_state(sampler), None, metrics)
                        for hook in hooks:
                            if hook.due(step, is_last):
                                hook(info)
                    for k, v in (("generation", rollout.seconds.get("generation", 0.0)),
                                 ("reward", rollout.seconds.get("reward", 0.0)), ("reference", extra_s),
                                 ("train", train_s)):
                        totals[k] += v
                    result.last_rollout = rollout
                    if on_step is not None:
                        on_step(step, result.history[-1][1], rollout)
                    self._maybe_show(step, rollout)
                    self._maybe_checkpoint(step, passes, sampler, result)
        finally:
            for hook in hooks:
                hook.end(trainer)
            trainer.progress.close()
            if trainer.checkpointer is not None:
                trainer.checkpointer.wait()
            if trainer.writer is not None:
                trainer.writer.close()
                trainer.writer = None
        result.seconds = totals
        return result

    def _data_state(self, sampler: PromptSampler) -> dict[str, Any]:
        return {"sampler": sampler.state(), "rollouts": self.rollouts_done}

    def _maybe_checkpoint(self, step: int, passes: int, sampler: PromptSampler, result: GRPOResult) -> None:
        c = self.train_config.checkpoint
        crossed = c.every > 0 and (step // c.every) > ((step - passes) // c.every)
        if crossed or (step >= self.train_config.steps and c.save_at_end):
            result.last_checkpoint = self.trainer.save_checkpoint(self._data_state(sampler))

    def _perf(self, rollout: Rollout, extra_s: float, train_s: float, total_s: float) -> dict[str, float]:
        gen_s = rollout.seconds.get("generation", 0.0)
        completions = rollout.groups_sampled * rollout.group_size
        return {
            "perf/generation_s": gen_s,
            "perf/reward_s": rollout.seconds.get("reward", 0.0),
            "perf/reference_s": extra_s,
            "perf/train_s": train_s,
            "perf/step_s": total_s,
            "perf/generation_frac": gen_s / max(total_s, 1e-9),
            "perf/rollouts_per_s": completions / max(gen_s, 1e-9),
            "perf/generated_tokens_per_s": float(rollout.lengths.sum()) / max(gen_s, 1e-9),
        }

    def _maybe_show(self, step: int, rollout: Rollout) -> None:
        every = self.settings.show_completion_every
        if not every or step % every:
            return
        i = int(np.argmax(rollout.rewards.reshape(-1)))
        p, j = divmod(i, rollout.group_size)
        question = rollout.prompts[p].columns.get("question", "")
        self.trainer.progress.write(
            f"step {step} best completion (reward {rollout.rewards[p, j]:.2f}) for: {question}\n{rollout.texts[p][j]}"
        )
