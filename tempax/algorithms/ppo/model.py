"""The trained module of PPO: the policy and its value function, one NNX module so one optimizer steps both.

    ActorCritic(policy, value_head)            value "head": a scalar head on the policy's own trunk (shared,
                                               cheapest: one forward pass gives log-probs and values)
    ActorCritic(policy, value_head, critic)    value "critic": a separate decoder, initialised from the reward
                                               model's folder (its backbone and its score head), so the first
                                               values already rank completions the way the reward does

Values are read where the log-probs are: V_t is the head applied to the final hidden state that predicts
completion token t (`completion_hidden`), so V_t estimates the return of the state before token t. Both parts
are trained together: with LoRA, the policy's adapters, the critic's adapters (when there is a critic) and the
value head (`trainable_filter`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from tempax.rl.logprobs import completion_hidden
from tempax.train.state import training_view
from tempax.train.trainable import MemoryProfile
from tempax.models.logprobs import token_entropy, token_logprobs
from tempax.models.reward_model import load_reward_model

VALUE_HEAD = "value_head"


class ActorCritic(nnx.Module):
    """The policy (a `Decoder`, LoRA-wrapped or not), a value head, and optionally a separate critic trunk.

    Args:
      policy: the policy decoder.
      rngs: for a new value head.
      critic: a separate critic decoder (None: the value head reads the policy's trunk).
      value_head: an existing [D, 1] head (a reward model's `score`); None: a new zero-initialised head with a
        bias, so the first values are 0 and the first advantages are the (whitened) rewards themselves.
    """

    def __init__(self, policy: nnx.Module, *, rngs: nnx.Rngs, critic: nnx.Module | None = None,
                 value_head: nnx.Linear | None = None):
        self.policy = policy
        self.critic = critic
        if value_head is None:
            d = (critic if critic is not None else policy).config.hidden_size
            with nnx.use_eager_sharding(False):
                value_head = nnx.Linear(
                    d, 1, use_bias=True, param_dtype=jnp.float32, rngs=rngs,
                    kernel_init=nnx.with_partitioning(nnx.initializers.zeros, ("embed", None)),
                )
        self.value_head = value_head

    def training_view(self, *, remat: str | None, precision: str) -> nnx.Module:
        """`tempax.train.trainable.TrainableModel`: `remat` on the policy and the critic trunk."""
        return training_view(self, remat=remat, precision=precision, trunks=("policy", "critic"))

    def memory_profile(self) -> MemoryProfile:
        """`tempax.train.trainable.TrainableModel`: the plan sizes the policy, twice with a separate critic; full
        weights train the critic trunk and the value head too."""
        if self.critic is None:
            return MemoryProfile(model=self.policy.config)
        full = sum(int(x.size) for x in jax.tree.leaves(nnx.state(self, nnx.Param)))
        return MemoryProfile(model=self.policy.config, trunks=2, full_params=full)

    def trunk_params(self) -> int:
        """Parameters of the critic trunk (0 for a shared head): what the memory plan adds for the second trunk."""
        if self.critic is None:
            return 0
        return sum(int(x.size) for x in jax.tree.leaves(nnx.state(self.critic, nnx.Param)))


def trainable_filter(lora: bool) -> Any:
    """The NNX filter of what PPO trains: every `nnx.Param` (full weights), or the LoRA adapters plus the value
    head (its kernel and bias are plain `Param`s, selected by path)."""
    if not lora:
        return nnx.Param
    return nnx.Any(nnx.LoRAParam, nnx.All(nnx.Param, nnx.PathContains(VALUE_HEAD)))


def policy_and_values(
    model: ActorCritic, batch: dict[str, jax.Array], *, temperature: float, with_entropy: bool = False
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """(log p_tau [P, G, T], values [P, G, T], entropy [P, G, T] or None) of the batch's completions.

    One forward pass of the policy (shared prompt prefill per group); a second of the critic when there is one.
    Values and entropies are float32; values at masked positions are meaningless.
    """
    p, g, t = batch["completion_tokens"].shape
    hidden = completion_hidden(model.policy, batch)  # [P * G, T, D]
    logits_btv = model.policy.logits(hidden)
    tokens = batch["completion_tokens"].reshape(p * g, t)
    logp = token_logprobs(logits_btv, tokens, temperature=temperature).reshape(p, g, t)
    entropy = None
    if with_entropy:
        entropy = token_entropy(jax.lax.stop_gradient(logits_btv), temperature=temperature).reshape(p, g, t)
    trunk = hidden if model.critic is None else completion_hidden(model.critic, batch)
    values = model.value_head(trunk.astype(jnp.float32))[..., 0].reshape(p, g, t)
    return logp, values, entropy


def critic_from_reward_model(folder: str) -> tuple[nnx.Module, nnx.Linear]:
    """(critic decoder, value head) from a saved reward model: its backbone and its `score` head."""
    reward_model, _ = load_reward_model(folder, with_tokenizer=False)
    return reward_model.backbone, reward_model.score

