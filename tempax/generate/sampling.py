"""Choosing the next token from logits: pure functions of arrays, jit-friendly, no model.

`sample_from_logits` is one step: a token per row, drawn from the temperature-scaled distribution after the
top-k / top-p / min-p filters (`filtered_probs`) by inverse-CDF sampling (`inverse_cdf_sample`), plus the log-probs
an RL learner needs. Each function's docstring holds its formula and paper.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

_BLOCK = 128


@dataclass(frozen=True)
class SamplerSpec:
    """The static (compile-time) shape of the sampling computation; values such as temperature stay traced.

    Attributes:
      greedy: argmax; no randomness and no filtering.
      top_k: k of the top-k filter, 0 = off.
      top_p: whether the top-p filter runs (its threshold is a traced value).
      min_p: whether the min-p filter runs.
      logprobs: whether log-probabilities are computed.
      greedy_rows: some rows (not all) take the argmax: a batch that mixes requests (`tempax serve`); which rows
        is a traced mask.
    """

    greedy: bool = False
    top_k: int = 0
    top_p: bool = False
    min_p: bool = False
    logprobs: bool = True
    greedy_rows: bool = False


def inverse_cdf_sample(weights_bv: jax.Array, u_b: jax.Array) -> jax.Array:
    """Index i per row with `cum_{<i} < u * total <= cum_{<=i}`, over non-negative `weights_bv`.

    Sampling is inverse-CDF with one uniform number per row: the token i with
    `sum_{j<i} w_j < u * sum_j w_j <= sum_{j<=i} w_j`, w the (filtered) probabilities. One uniform instead of a
    Gumbel number per vocabulary entry keeps random-number generation off the critical path on CPU (a 49k-entry
    Gumbel draw costs more than the rest of sampling). The cumulative sum is taken in two levels (blocks of
    `_BLOCK` entries, then inside the chosen block) so it stays O(V) and short.

    Args:
      weights_bv: [B, V] non-negative weights (need not sum to 1); every row needs a positive entry.
      u_b: [B] numbers in (0, 1].

    Returns:
      [B] int32 indices; an index with zero weight is never returned (rounding is clipped to the last positive
      entry of the chosen block).
    """
    b, v = weights_bv.shape
    w = weights_bv.astype(jnp.float32)
    if v <= 2 * _BLOCK:
        return _pick(w, u_b * jnp.sum(w, axis=-1))
    nb = -(-v // _BLOCK)
    w = jnp.pad(w, ((0, 0), (0, nb * _BLOCK - v))).reshape(b, nb, _BLOCK)
    block_sums = jnp.sum(w, axis=-1)  # [B, nb]
    block_cum = jnp.cumsum(block_sums, axis=-1)
    target = u_b * block_cum[:, -1]
    j = _pick(block_sums, target, cum=block_cum)
    before = jnp.where(j > 0, jnp.take_along_axis(block_cum, jnp.maximum(j - 1, 0)[:, None], axis=1)[:, 0], 0.0)
    inner = jnp.take_along_axis(w, j[:, None, None], axis=1)[:, 0]  # [B, BLOCK]
    k = _pick(inner, target - before)
    return (j * _BLOCK + k).astype(jnp.int32)


def _pick(w_bv: jax.Array, target_b: jax.Array, cum: jax.Array | None = None) -> jax.Array:
    """First index whose inclusive cumulative weight reaches `target`, clipped to the last positive entry."""
    cum = jnp.cumsum(w_bv, axis=-1) if cum is None else cum
    idx = jnp.sum(cum < target_b[:, None], axis=-1)
    iota = jnp.arange(w_bv.shape[-1])
    last_positive = jnp.max(jnp.where(w_bv > 0, iota, 0), axis=-1)
    first_positive = jnp.argmax(w_bv > 0, axis=-1)
    return jnp.clip(idx, first_positive, last_positive).astype(jnp.int32)


def filtered_probs(
    scaled_bv: jax.Array,
    *,
    top_k: int,
    use_top_p: bool,
    use_min_p: bool,
    top_p: jax.Array | float,
    min_p: jax.Array | float,
) -> tuple[jax.Array, jax.Array | None]:
    """Probabilities left after top-k, top-p and min-p, over candidate tokens.

    Sorting the vocabulary is only needed for top-p without top-k; greedy, plain temperature and min-p never sort.

    Filters: top-k (Fan et al. 2018, arXiv:1805.04833), nucleus / top-p (Holtzman et al. 2019, arXiv:1904.09751),
    min-p (Nguyen et al. 2024, arXiv:2407.01082).

    Args:
      scaled_bv: [B, V] temperature-scaled logits z / tau.
      top_k: static k, 0 = off (k >= V is also off).
      use_top_p, use_min_p: static switches; `top_p` and `min_p` are their (traced) thresholds.

    Returns:
      (weights [B, C], candidate ids [B, C] or None): C = k with top-k, V otherwise; the ids map candidate
      positions back to the vocabulary (None = the identity). Weights are unnormalised probabilities with the
      filtered-out candidates set to 0; the most likely token always survives.
    """
    v = scaled_bv.shape[-1]
    ids = None
    z = scaled_bv
    if 0 < top_k < v:
        z, ids = jax.lax.top_k(z, top_k)  # sorted, most likely first
    elif use_top_p:
        # Only top-p needs the whole vocabulary in order.
        neg_sorted, ids = jax.lax.sort_key_val(-z, jnp.broadcast_to(jnp.arange(v, dtype=jnp.int32), z.shape))
        z = -neg_sorted
    sorted_desc = ids is not None
    probs = jax.nn.softmax(z, axis=-1)
    keep = jnp.ones(probs.shape, bool)
    if use_top_p:
        # Keep token i while the mass strictly before it is below top_p: the smallest prefix reaching top_p.
        before = jnp.cumsum(probs, axis=-1) - probs
        keep &= before < top_p
        keep = keep.at[:, 0].set(True)
    if use_min_p:
        p_max = probs[:, :1] if sorted_desc else jnp.max(probs, axis=-1, keepdims=True)
        keep &= probs >= min_p * p_max
    if use_top_p or use_min_p:
        probs = jnp.where(keep, probs, 0.0)
    return probs, ids


def sample_from_logits(
    logits_bv: jax.Array,
    u_b: jax.Array | None,
    spec: SamplerSpec,
    *,
    temperature: jax.Array | float,
    top_p: jax.Array | float = 1.0,
    min_p: jax.Array | float = 0.0,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One sampling step: token ids and their temperature-adjusted and raw log-probabilities.

    A step turns float32 logits [B, V] into a token per row plus two log-probabilities of that token:

        log p_tau(y) = z[y]/tau - logsumexp(z/tau)     (the distribution the sample came from, before filtering)
        log p_1(y)   = z[y]     - logsumexp(z)          (the raw model distribution)

    Top-k / top-p / min-p truncate the distribution the token is *drawn* from but not the reported log-prob: an RL
    learner recomputes log-softmax(z / tau) over the full vocabulary, and the two must agree for the importance
    ratio to start at 1. (Truncation makes the behaviour policy differ from that distribution; keep the filters off
    for on-policy RL, as the GRPO papers do.)

    Args:
      logits_bv: [B, V] logits (any float dtype; computed in float32).
      u_b: [B] uniform numbers in (0, 1], one per row (unused, may be None, when greedy).
      spec: the static choices (greedy, which filters run, whether log-probs are needed).
      temperature, top_p, min_p: traced values of the knobs.

    Returns:
      tokens [B] int32, logprobs [B] float32 (log p_tau; equal to the raw one when greedy), raw_logprobs [B]
      (log p_1). Both log-probs are 0 when `spec.logprobs` is false.
    """
    z = logits_bv.astype(jnp.float32)
    if spec.greedy:
        tokens = jnp.argmax(z, axis=-1).astype(jnp.int32)
        if not spec.logprobs:
            zero = jnp.zeros(tokens.shape, jnp.float32)
            return tokens, zero, zero
        raw = _logprob(z, tokens)
        return tokens, raw, raw
    scaled = z / temperature
    weights, ids = filtered_probs(
        scaled, top_k=spec.top_k, use_top_p=spec.top_p, use_min_p=spec.min_p, top_p=top_p, min_p=min_p
    )
    choice = inverse_cdf_sample(weights, u_b)
    tokens = choice if ids is None else jnp.take_along_axis(ids, choice[:, None], axis=-1)[:, 0]
    tokens = tokens.astype(jnp.int32)
    if not spec.logprobs:
        zero = jnp.zeros(tokens.shape, jnp.float32)
        return tokens, zero, zero
    return tokens, _logprob(scaled, tokens), _logprob(z, tokens)


def _logprob(z_bv: jax.Array, tokens_b: jax.Array) -> jax.Array:
    picked = jnp.take_along_axis(z_bv, tokens_b[:, None], axis=-1)[:, 0]
    return picked - jax.nn.logsumexp(z_bv, axis=-1)


def row_uniforms(keys_b: jax.Array, step: jax.Array) -> jax.Array:
    """[B] uniforms in (0, 1] for generation step `step`: row b draws from fold_in(keys_b[b], step).

    Each row's stream depends only on its own key and the step, never on the batch it is in, so splitting or
    regrouping a request reproduces the same samples.
    """
    draw = lambda k: jax.random.uniform(jax.random.fold_in(k, step), (), jnp.float32)
    return 1.0 - jax.vmap(draw)(keys_b)  # uniform gives [0, 1); (0, 1] keeps u * total > 0


def row_keys(seed: int | jax.Array, prompt_indices: jax.Array, sample_indices: jax.Array) -> jax.Array:
    """Typed keys [B]: fold_in(fold_in(key(seed), prompt index), sample index) per row; `seed` is one seed or one
    per row [B] (requests batched together keep their own streams)."""
    seeds = jnp.broadcast_to(jnp.asarray(seed, jnp.uint32), jnp.shape(prompt_indices))
    key = lambda s, i, j: jax.random.fold_in(jax.random.fold_in(jax.random.key(s), i), j)
    return jax.vmap(key)(seeds, prompt_indices, sample_indices)
