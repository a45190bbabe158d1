"""PPO on the shared training loop: a batch source that makes rollouts, and the loss of one mini-batch.

    source = PPORollouts(tokenizer, reward_fn, settings, sampler, prompt_len=..., batch_size=8)
    trainer = Trainer(actor_critic, make_ppo_loss(settings), train_config, trainable=trainable_filter(lora))
    source.attach(trainer)
    trainer.fit(source)

`PPORollouts` says how a rollout is made and cut into mini-batches, and what it resumes from.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tempax.rl.logprobs import completion_logprobs, logprobs_no_grad
from tempax.rl.rollout import Prompt, PromptSampler, Rollout, build_batch, sample_rollout
from tempax.algorithms.ppo.config import PPOKnobsConfig
from tempax.algorithms.ppo.losses import (
    adaptive_kl_coef,
    explained_variance,
    kl_penalized_rewards,
    missing_eos_penalty,
    ppo_loss,
    whiten,
)
from tempax.algorithms.ppo.model import ActorCritic, policy_and_values
from tempax.errors import ConfigError
from tempax.models.logprobs import masked_mean
from tempax.parallel.rules import use_mesh
from tempax.rl.losses import gae
from tempax.train.sources import decode_arrays, encode_arrays
from tempax.train.view import TrainerView
from tempax.models.lora import disable_adapters

Batch = dict[str, Any]
# What a training mini-batch holds ([P, Lp] prompts; [P, G, T] everything else).
BATCH_KEYS = ("prompt_tokens", "prompt_segments", "completion_tokens", "completion_mask", "old_logp", "old_values",
              "advantages", "returns")
_FORWARD_KEYS = ("prompt_tokens", "prompt_segments", "completion_tokens", "completion_mask")
_INT_KEYS = ("prompt_tokens", "prompt_segments", "completion_tokens")


def make_ppo_loss(settings: PPOKnobsConfig) -> Callable[[ActorCritic, Batch], tuple[jax.Array, dict[str, jax.Array]]]:
    """`loss_fn(model, batch)` for `tempax.train.Trainer`: `ppo_loss` of one mini-batch, plus the entropy.

    Both terms are token means over the same mask, so `loss_weight` is the token count and gradient accumulation
    over prompt micro-batches reproduces the whole mini-batch's loss.
    """

    def loss_fn(model: ActorCritic, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        logp, values, entropy = policy_and_values(
            model, batch, temperature=settings.temperature, with_entropy=settings.log_entropy
        )
        p, g, t = logp.shape
        flat = lambda x: x.reshape(p * g, t)  # noqa: E731
        mask = flat(batch["completion_mask"])
        loss, metrics = ppo_loss(
            flat(logp), flat(batch["old_logp"]), flat(values), flat(batch["old_values"]), flat(batch["advantages"]),
            flat(batch["returns"]), mask, clip_range=settings.clip_range, value_clip_range=settings.value_clip_range,
            vf_coef=settings.vf_coef,
        )
        metrics = dict(metrics)
        if entropy is not None:
            metrics["entropy"] = masked_mean(flat(entropy), mask)
        metrics["loss_weight"] = metrics["num_tokens"]
        return loss, metrics

    return loss_fn


class PPORollouts:
    """The PPO batch source.

    The source yields fixed-shape mini-batches. When the previous rollout's mini-batches are used up it makes a new
    one with the trainer's current weights:

      1. sample `group_size` completions for each of batch_size x mini_batches prompts (the shared
         generation engine; `tempax.rl.rollout.sample_rollout`, which also scores them with the reward
         functions: the reward model, plus any others);
      2. one no-grad forward pass of the policy and value function: log pi_old and V_old of every completion token;
         one of the reference (LoRA: the same weights with the adapters off; full weights: a frozen copy);
      3. per-token rewards = -beta k1 + score on the last token (`kl_penalized_rewards`, missing-EOS penalty
         first), GAE advantages and returns, advantages whitened over the rollout's valid tokens;
      4. `epochs` shuffled passes of `mini_batches` mini-batches of batch_size prompts each; after the rollout the
         adaptive KL controller (when `kl_target` is set) updates beta from the rollout's measured KL.

    The protocol is `tempax.train.sources`': `attach` (called by `fit`; idempotent), `state()` / `restore()` and
    `batch_metrics()`. `state()` holds the prompt sampler's position, the rollout count, beta and, mid-rollout (the
    boundary rule), the rollout's arrays (`encode_arrays`) and the mini-batches still to come, so a checkpoint at any
    step resumes into exactly the batches of the uninterrupted run. `batch_metrics()` gives the rollout's host metrics
    (reward-model score, KL to the reference, lengths, explained variance of the values, time split) with the step
    that trains on its first mini-batch, and {} with the others.

    The collapse guard (`tempax.train.guards.CollapseGuard`) reads `entropy` (from the loss) and
    `completion/length_mean` (from here); PPO lets it warn or stop (`advice` names the settings to change).


    Args:
      tokenizer: the policy's tokenizer.
      reward_fn: a `tempax.rewards.CombinedReward` (the reward model and any other functions; never raises).
      settings: the algorithm knobs.
      sampler: where prompts come from.
      prompt_len: Lp, the fixed left-padded prompt length of every batch.
      batch_size: prompts per mini-batch (`train.batch_size`).
      seed: base of the sampling and shuffling streams.
      reference: full-weight training: the starting policy decoder, the frozen reference (copied here, so build
        the source before the trainer takes the weights); None with LoRA (the policy with its adapters off).
      log: where messages go.
    """

    def __init__(
        self,
        tokenizer: Any,
        reward_fn: Any,
        settings: PPOKnobsConfig,
        sampler: PromptSampler,
        *,
        prompt_len: int,
        batch_size: int,
        seed: int = 0,
        reference: nnx.Module | None = None,
        log: Callable[[str], None] | None = None,
    ):
        self.tokenizer = tokenizer
        self.reward_fn = reward_fn
        self.settings = settings
        self.sampler = sampler
        self.prompt_len = int(prompt_len)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.reference: tuple[Any, Any] | None = None
        if reference is not None:
            graphdef, state = nnx.split(reference)
            self.reference = (graphdef, jax.tree.map(jnp.copy, state))
        self._say = log or (lambda text: print(text, file=sys.stderr))
        self.kl_coef = float(settings.kl_coef)
        self.rollouts_done = 0
        self.history: list[dict[str, float]] = []  # host metrics of every rollout, in order
        self.last_rollout: Rollout | None = None
        self._buffer: dict[str, np.ndarray] | None = None
        self._queue: list[list[int]] = []
        self._pending: dict[str, float] = {}
        self.trainer: TrainerView | None = None

    @property
    def rollout_prompts(self) -> int:
        return self.batch_size * self.settings.mini_batches

    # -- the trainer's weights --------------------------------------------------------------------------------
    def attach(self, trainer: TrainerView) -> None:
        """Use the trainer's current weights for rollouts and the no-grad passes (jitted once per trainer)."""
        if trainer is self.trainer:
            return
        if trainer.full_finetune and self.reference is None:
            raise ConfigError(
                "PPO with full-weight training needs the frozen reference: pass the starting policy as "
                "PPORollouts(..., reference=policy), or train LoRA adapters (the reference is then the adapters-off "
                "base)"
            )
        self.trainer = trainer
        parts, tau = trainer.parts, self.settings.temperature

        def current(params: Any, rest: Any, batch: Batch) -> tuple[jax.Array, jax.Array]:
            logp, values, _ = policy_and_values(parts.merge(params, rest), batch, temperature=tau)
            return logp, values

        def adapters_off(params: Any, rest: Any, batch: Batch) -> jax.Array:
            policy = parts.merge(params, rest).policy
            with disable_adapters(policy):  # a static switch: the trace computes the base model
                return completion_logprobs(policy, batch, temperature=tau)[0]

        self._current = jax.jit(current)
        self._adapters_off = jax.jit(adapters_off)

    @property
    def policy(self) -> nnx.Module:
        """The current policy decoder."""
        return self.trainer.model.policy

    def _chunked(self, fn: Callable[[Batch], Any], batch: Batch) -> list[Any]:
        """fn over the batch, micro-batch by micro-batch (bounded [rows, T, vocab] logits)."""
        p = batch["prompt_tokens"].shape[0]
        step = self.trainer.micro_batch_size
        out = []
        with use_mesh(self.trainer.mesh):
            for start in range(0, p, step):
                rows = {k: batch[k][start:start + step] for k in _FORWARD_KEYS}
                if rows["prompt_tokens"].shape[0] < step:  # keep one compiled shape: pad with empty rows
                    pad = step - rows["prompt_tokens"].shape[0]
                    rows = {k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)]) for k, v in rows.items()}
                n = min(step, p - start)
                out.append(jax.tree.map(lambda x: np.asarray(x)[:n], fn(self.trainer.put_batch(rows))))
        return out

    def forward(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """(log pi [P, G, T], V [P, G, T]) of the batch's completions under the current weights, no gradient."""
        params, rest = self.trainer.params, self.trainer.rest
        parts = self._chunked(lambda b: self._current(params, rest, b), batch)
        return np.concatenate([a for a, _ in parts]), np.concatenate([b for _, b in parts])

    def reference_logprobs(self, batch: Batch) -> np.ndarray:
        """log ref [P, G, T] of the batch's completions (adapters off, or the frozen copy)."""
        if self.reference is not None:
            graphdef, state = self.reference
            tau = jnp.float32(self.settings.temperature)
            return np.concatenate(self._chunked(lambda b: logprobs_no_grad(graphdef, state, b, tau), batch))
        params, rest = self.trainer.params, self.trainer.rest
        return np.concatenate(self._chunked(lambda b: self._adapters_off(params, rest, b), batch))

    def sample(self, prompts: Sequence[Prompt], *, seed: int, temperature: float | None = None) -> Rollout:
        """Completions of `prompts` from the current policy, scored by the reward functions."""
        s = self.settings
        return sample_rollout(
            self.policy, self.tokenizer, prompts, self.reward_fn, group_size=s.group_size,
            max_new_tokens=s.max_new_tokens, temperature=s.temperature if temperature is None else temperature,
            top_p=s.top_p, seed=seed,
        )

    # -- rollouts -------------------------------------------------------------------------------------------------
    def _new_rollout(self) -> None:
        s = self.settings
        t0 = time.perf_counter()
        seed = (self.seed * 1_000_003 + self.rollouts_done * 101) % (2**31 - 1)
        rollout = self.sample(self.sampler.next(self.rollout_prompts), seed=seed)
        t1 = time.perf_counter()
        batch = build_batch(rollout, prompt_len=self.prompt_len, pad_id=self.tokenizer.pad_id, with_old_logp=False)
        old_logp, old_values = self.forward(batch)
        ref_logp = self.reference_logprobs(batch)
        t2 = time.perf_counter()
        p, g, t = rollout.completion_tokens.shape
        flat = lambda x: jnp.asarray(x).reshape(p * g, t)  # noqa: E731
        mask = flat(rollout.completion_mask.astype(np.float32))
        scores = missing_eos_penalty(
            jnp.asarray(rollout.rewards.reshape(-1)), jnp.asarray(rollout.truncated.reshape(-1)),
            penalty=s.missing_eos_penalty,
        )
        rewards, k1 = kl_penalized_rewards(scores, flat(old_logp), flat(ref_logp), mask, kl_coef=self.kl_coef)
        advantages, returns = gae(rewards, flat(old_values), mask, gamma=s.gamma, lam=s.lam)
        if s.whiten_advantages:
            advantages = whiten(advantages, mask)
        shape = (p, g, t)
        batch.update(
            old_logp=old_logp.astype(np.float32), old_values=old_values.astype(np.float32),
            advantages=np.asarray(advantages, np.float32).reshape(shape),
            returns=np.asarray(returns, np.float32).reshape(shape),
        )
        self._buffer = {k: batch[k] for k in BATCH_KEYS}
        rng = np.random.default_rng([self.seed, self.rollouts_done])
        self._queue = [
            order[i:i + self.batch_size].tolist()
            for _ in range(s.epochs)
            for order in [rng.permutation(p)]
            for i in range(0, p, self.batch_size)
        ]
        kl_seq = np.asarray(jnp.sum(k1, axis=-1))
        metrics = {
            "rollout": float(self.rollouts_done),
            "reward/score_mean": float(np.mean(np.asarray(scores))),
            "reward/score_std": float(np.std(np.asarray(scores))),
            "reward/shaped_mean": float(np.mean(np.asarray(jnp.sum(rewards, axis=-1)))),
            "kl/seq_mean": float(kl_seq.mean()),
            "kl/token_mean": float(masked_mean(k1, mask)),
            "kl/coef": self.kl_coef,
            "value/mean": float(masked_mean(flat(old_values), mask)),
            "value/explained_variance": float(explained_variance(flat(old_values), returns, mask)),
            "returns/mean": float(masked_mean(returns, mask)),
            "completion/length_mean": float(rollout.lengths.mean()),
            "completion/length_max": float(rollout.lengths.max()),
            "completion/truncated_frac": float(rollout.truncated.mean()),
            "perf/generation_s": rollout.seconds.get("generation", 0.0),
            "perf/reward_s": rollout.seconds.get("reward", 0.0),
            "perf/forward_s": t2 - t1,
            "perf/rollout_s": time.perf_counter() - t0,
        }
        for name, values in rollout.reward_parts.items():
            metrics[f"reward/{name}_mean"] = float(np.mean(values))
            metrics[f"reward/{name}_failures"] = float(rollout.reward_failures.get(name, 0))
        self.history.append(metrics)
        self._pending = metrics
        self.last_rollout = rollout
        self.kl_coef = adaptive_kl_coef(self.kl_coef, metrics["kl/seq_mean"], target=s.kl_target,
                                        horizon=s.kl_horizon, n_steps=p * g)
        self.rollouts_done += 1

    # -- the batch-source protocol ---------------------------------------------------------------------------------
    def __iter__(self) -> "PPORollouts":
        return self

    def __next__(self) -> Batch:
        if self.trainer is None:
            raise RuntimeError("PPORollouts.attach(trainer) must be called before iterating")
        if not self._queue:
            self._new_rollout()
        else:
            self._pending = {}  # rollout numbers belong to the step that trains on its first mini-batch
        rows = self._queue.pop(0)
        assert self._buffer is not None
        return {k: v[rows] for k, v in self._buffer.items()}

    def batch_metrics(self) -> dict[str, float]:
        """The rollout's host metrics with its first mini-batch; {} with the others."""
        return self._pending

    def state(self) -> dict[str, Any]:
        """Where the source stands (JSON): prompts drawn, beta, and the unfinished rollout, if any."""
        mid = bool(self._queue)
        return {
            "sampler": self.sampler.state(), "rollouts": self.rollouts_done, "kl_coef": self.kl_coef,
            "queue": self._queue if mid else [], "buffer": encode_arrays(self._buffer) if mid and self._buffer else None,
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.sampler.restore(state["sampler"])
        self.rollouts_done = int(state["rollouts"])
        self.kl_coef = float(state["kl_coef"])
        self._queue = [list(q) for q in state.get("queue", [])]
        self._buffer = decode_arrays(state["buffer"]) if state.get("buffer") else None
        self._pending = {}

    # -- the collapse guard --------------------------------------------------------------------------------------
    def advice(self) -> str:
        """What to change when the guard fires, with the run's current values."""
        s = self.settings
        lr = self.trainer.learning_rate if self.trainer is not None else None
        return (f"raise ppo.kl_coef (now {self.kl_coef:g}) or set ppo.kl_target to hold the KL to the reference, "
                f"raise ppo.temperature (now {s.temperature:g}), lower ppo.epochs (now {s.epochs})"
                + (f" or train.optimizer.learning_rate (now {lr:g})" if lr is not None else ""))
