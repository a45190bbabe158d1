"""The policy's log-probs of sampled completions, each prompt run once for its group (GRPO and PPO losses and
their reference / old-policy passes).

Log-probs: the sampler records log p_tau = log softmax(z / tau) of each token, and the training forward computes
the same quantity at the same temperature, so on the first pass over a batch the ratio pi / pi_old is 1 up to
float rounding (the test checks it). With num_iterations = 1 the loss uses pi_old = stop_gradient(pi), which is
exactly 1.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from tempax.models.cache import KVCache
from tempax.models.logprobs import token_entropy, token_logprobs

Batch = dict[str, jax.Array]


def completion_hidden(model: nnx.Module, batch: Batch) -> jax.Array:
    """[P * G, T, D] final hidden states that predict each completion token, running each prompt once.

    The prompts [P, Lp] (left-padded) go through the model with a KV cache; the cache is repeated G times and the
    completions [P * G, T] attend to it, exactly as the sampler's shared prefill does. Token j of a completion is
    predicted by the hidden state before it: the prompt's last position for j = 0, completion position j - 1
    otherwise (also the state a PPO value head reads for token j). Gradients flow through the shared prompt pass.
    Completion tokens attend where `completion_segments` [P, G, T] (when the batch has it: a multi-turn episode's
    tokens, the environment's included) or else `completion_mask` is non-zero.
    """
    prompt, prompt_seg = batch["prompt_tokens"], batch["prompt_segments"]
    comp, mask = batch["completion_tokens"], batch["completion_mask"]
    p, lp = prompt.shape
    _, g, t = comp.shape
    cache = KVCache.init(model.config, p, lp + t)
    hidden_p, cache = model.hidden_states(prompt, segment_ids=prompt_seg, cache=cache)
    if g > 1:
        cache = cache.repeat(g)
    # Tokens after a completion's end get segment 0: they attend to nothing and nothing reads them. The
    # environment's tokens inside an episode carry no loss (mask 0) but later replies read them.
    segments = batch.get("completion_segments", mask)
    comp_seg = (segments.reshape(p * g, t) > 0).astype(jnp.int32)
    hidden_c, _ = model.hidden_states(comp.reshape(p * g, t), segment_ids=comp_seg, cache=cache)
    first = jnp.repeat(hidden_p[:, -1:], g, axis=0)  # [P * G, 1, D]
    return jnp.concatenate([first, hidden_c[:, :-1]], axis=1)


def completion_logprobs(
    model: nnx.Module, batch: Batch, *, temperature: jax.Array | float, with_entropy: bool = False,
    entropy_gradient: bool = False,
) -> tuple[jax.Array, jax.Array | None]:
    """log p_tau of every completion token, running each prompt once for its whole group (`completion_hidden`).

    Args:
      model: a `tempax.models.decoder.Decoder` (LoRA/QLoRA-wrapped or not).
      batch: `prompt_tokens`, `prompt_segments` [P, Lp]; `completion_tokens`, `completion_mask` [P, G, T].
      temperature: tau; the log-probs are of softmax(z / tau), like the sampler's.
      with_entropy: also return the token entropy of softmax(z / tau) (without gradient unless
        `entropy_gradient`: an entropy bonus needs it).

    Returns:
      (logp [P, G, T] float32, entropy [P, G, T] or None); values at masked positions are meaningless.
    """
    p, g, t = batch["completion_tokens"].shape
    hidden = completion_hidden(model, batch)  # [P * G, T, D]
    rows = logit_chunk_rows(p * g)

    @jax.checkpoint
    def chunk(h_rtd: jax.Array, targets_rt: jax.Array) -> tuple[jax.Array, jax.Array]:
        z = model.logits(h_rtd)
        logp = token_logprobs(z, targets_rt, temperature=temperature)
        if not with_entropy:
            return logp, jnp.zeros_like(logp)
        return logp, token_entropy(z if entropy_gradient else jax.lax.stop_gradient(z), temperature=temperature)

    split = lambda x: x.reshape(p * g // rows, rows, *x.shape[1:])  # noqa: E731
    logp, entropy = jax.lax.map(lambda xs: chunk(*xs), (split(hidden), split(batch["completion_tokens"].reshape(p * g, t))))
    return logp.reshape(p, g, t), (entropy.reshape(p, g, t) if with_entropy else None)


# Completion rows whose [rows, T, V] logits exist at once. All rows at once is 4 rows T V bytes of float32 (a
# large share of a GRPO step's memory at V = 49k), kept by autodiff for the backward beside a second array for its
# gradient; a chunk under jax.checkpoint keeps only its hidden states and recomputes its logits in the backward
# (one more head product, a small share of a GRPO step: `docs/measurements/memory.md`, "GRPO").
LOGIT_CHUNK_ROWS = 2


def logit_chunk_rows(total_rows: int, target: int = LOGIT_CHUNK_ROWS) -> int:
    """The largest divisor of `total_rows` that is at most `target` (a chunk size with no ragged tail)."""
    return max(d for d in range(1, min(target, total_rows) + 1) if total_rows % d == 0)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def logprobs_no_grad(graphdef: Any, state: Any, batch: Batch, temperature: jax.Array | float) -> jax.Array:
    """`completion_logprobs` of `nnx.merge(graphdef, state)` without gradients; the temperature is traced, so one
    executable serves every temperature."""
    return completion_logprobs(nnx.merge(graphdef, state), batch, temperature=temperature)[0]
