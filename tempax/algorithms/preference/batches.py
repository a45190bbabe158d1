"""Stacked preference batches -> per-sequence log-probs, per-pair losses, and reference log-probs stored with data.

Batch layout (from `tempax.data.preference.collate_pairs`): for B pairs every array is [2B, T]; rows 0..B-1 are
the chosen sides and rows B..2B-1 the rejected ones, so one forward pass scores both sides of every pair. The
train step's micro-batches take rows i, i + n, i + 2n, ... (`tempax.train.step.split_micro_batches`), so a
micro-batch of a stacked batch is again a stacked batch, with its pairs still aligned, whenever the number of
micro-batches n divides B; `check_micro_batching` says so at config time.

A short final batch is padded with empty pairs (all segment ids 0). Losses here are computed per pair and
averaged over the real pairs only (`pair_mask`), and report `loss_weight` = the number of real pairs, so the
train step's weighted accumulation and `average_eval_metrics` give exact means over pairs.

Per-pair numbers "stored with the data" — reference log-probs for full fine-tuning without a second model
(`compute_reference_logps` runs the initial model over every pair once), or reward-model margins — ride on an
`AnnotatedPair`; `annotated_pair_loader` / `pair_batches` add each as a [2B] array aligned with the rows like every
other key (`ref_logps`, `margin`), so micro-batching splits them consistently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tempax.algorithms.preference.losses import preference_loss
from tempax.data.loader import BatchLoader
from tempax.data.packing import BATCH_KEYS
from tempax.data.preference import PreferencePair, collate_pairs
from tempax.errors import ConfigError, DataError
from tempax.models.decoder import Decoder, lm_head_of
from tempax.models.logprobs import masked_sum, token_logprobs
from tempax.ops import fused_token_logprobs
from tempax.parallel.process import host_array
from tempax.models.lora import disable_adapters

Batch = dict[str, Any]

# Reply positions per chunk of the fused head in `sequence_logps` (the SFT loss's default chunk).
LOGPROB_CHUNK = 64

# The batch key holding reference log-probs, one per row ([2B], chosen rows then rejected rows).
REF_LOGPS = "ref_logps"


# ---------------------------------------------------------------------------------------------- layout


def split_pairs(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(chosen, rejected) halves of a stacked [2B, ...] array."""
    b = x.shape[0] // 2
    return x[:b], x[b:]


def pair_mask(batch: Batch) -> jax.Array:
    """[B] float32, 1 for a real pair and 0 for the empty pairs that pad a short final batch."""
    chosen_segments, _ = split_pairs(batch["segment_ids"])
    return (jnp.max(chosen_segments, axis=-1) > 0).astype(jnp.float32)


def check_micro_batching(pairs_per_batch: int, micro_batches: int, *, what: str = "train") -> None:
    """Raises `ConfigError` unless each micro-batch gets whole, aligned pairs (see the module docstring)."""
    if micro_batches < 1 or pairs_per_batch % micro_batches:
        raise ConfigError(
            f"{what}: {pairs_per_batch} preference pairs per batch cannot be split into {micro_batches} "
            "micro-batches of whole pairs; make train.micro_batch_size an even number of rows that divides "
            "train.batch_size (each pair is two rows)."
        )


# ---------------------------------------------------------------------------------------------- log-probs


def sequence_logps(model: Any, batch: Batch) -> tuple[jax.Array, jax.Array]:
    """Summed log-probabilities of each row's trained (response) tokens, and how many there are.

        logp(y | x) = sum_t loss_mask[t] log p(targets[t] | tokens[<= t])

    Args:
      model: a `Decoder` (or anything called as `model(tokens, positions=, segment_ids=) -> (logits, cache)`). A
        `Decoder`'s head is applied at the reply tokens only (`tempax.ops.fused_token_logprobs`): in a batch of
        `recipes/dpo_smollm2_lora.yaml` they are about a quarter of the positions.
      batch: `tokens`, `targets`, `loss_mask`, `positions`, `segment_ids`, each [R, T].

    Returns:
      (logps [R] float32, num_tokens [R] float32); 0 and 0 for an empty row.
    """
    mask = batch["loss_mask"]
    kw = dict(positions=batch["positions"], segment_ids=batch["segment_ids"])
    if isinstance(model, Decoder):  # the head at the reply tokens only, no [R, T, V] logits (`fused_token_logprobs`)
        hidden, _ = model.hidden_states(batch["tokens"], **kw)
        head, vocab_major = lm_head_of(model, master=True)
        logps_bt = fused_token_logprobs(hidden, head, batch["targets"], mask, vocab_major=vocab_major,
                                        chunk_len=LOGPROB_CHUNK, softcap=model.config.final_logit_softcap)
    else:
        logits, _ = model(batch["tokens"], **kw)
        logps_bt = token_logprobs(logits, batch["targets"])
    return masked_sum(logps_bt, mask, axis=-1), jnp.sum(mask.astype(jnp.float32), axis=-1)


def per_pair_mean(
    fn: Callable[..., tuple[jax.Array, dict[str, jax.Array]]],
    arrays: dict[str, jax.Array],
    weights: jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Runs a batch-mean loss `fn(**arrays) -> (loss, metrics)` on each pair alone and averages over `weights`.

    Every loss in `losses.py` is a batch mean of per-pair terms (ORPO's two terms are each such a mean), so the
    loss of a one-pair batch is that pair's term, and the weighted mean of those is the loss over the real pairs:

        L = sum_i w_i L({pair i}) / max(sum_i w_i, 1)

    With all weights 1 this equals `fn` on the whole batch. Metrics are averaged the same way; `loss_weight` is
    sum_i w_i (the train step's accumulation weight).

    Args:
      fn: a loss over [batch] arrays passed by keyword.
      arrays: the [B] inputs of `fn`.
      weights: [B] 0/1 pair mask.
    """
    per_pair_loss, per_pair_metrics = jax.vmap(lambda a: fn(**{k: v[None] for k, v in a.items()}))(arrays)
    total = jnp.sum(weights)
    denom = jnp.maximum(total, 1.0)
    mean = lambda v: jnp.sum(v * weights) / denom
    metrics = {k: mean(v) for k, v in per_pair_metrics.items()}
    loss = mean(per_pair_loss)
    metrics["loss"] = loss
    metrics["loss_weight"] = total
    return loss, metrics


def pair_preference_loss(
    name: str,
    policy_logps: jax.Array,
    num_tokens: jax.Array,
    weights: jax.Array,
    *,
    ref_logps: jax.Array | None = None,
    **hparams: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`losses.preference_loss` on stacked per-row arrays, averaged over real pairs (see `per_pair_mean`).

    Args:
      name: 'sigmoid', 'ipo', 'hinge', 'orpo' or 'simpo'.
      policy_logps: [2B] summed response log-probs under the policy, chosen rows first.
      num_tokens: [2B] response lengths in tokens.
      weights: [B] pair mask.
      ref_logps: [2B] the same under the reference (losses that need one).
      hparams: the loss's keywords (beta, label_smoothing, gamma, lam).
    """
    pc, pr = split_pairs(policy_logps)
    lc, lr = split_pairs(num_tokens)
    arrays = {"policy_chosen_logps": pc, "policy_rejected_logps": pr, "chosen_lengths": lc, "rejected_lengths": lr}
    if ref_logps is not None:
        rc, rr = split_pairs(jax.lax.stop_gradient(ref_logps))
        arrays.update(ref_chosen_logps=rc, ref_rejected_logps=rr)

    def one(**a: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        pos = (a.pop("policy_chosen_logps"), a.pop("policy_rejected_logps"))
        return preference_loss(name, *pos, **a, **hparams)

    return per_pair_mean(one, arrays, weights)


# ---------------------------------------------------------------------------------------------- values stored with data


@dataclass(frozen=True)
class AnnotatedPair:
    """A tokenised pair with per-side numbers that travel with it into batches.

    Attributes:
      pair: the tokenised pair.
      values: batch key -> (value for the chosen row, value for the rejected row); e.g. `ref_logps` (reference
        log-probs summed over each response) or `margin` (a reward-model margin, equal on both rows).
    """

    pair: PreferencePair
    values: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def source(self) -> str:
        return self.pair.source

    @property
    def chosen(self) -> Any:  # so length checks written for PreferencePair apply unchanged
        return self.pair.chosen

    @property
    def rejected(self) -> Any:
        return self.pair.rejected

    def with_values(self, **values: tuple[float, float]) -> "AnnotatedPair":
        return AnnotatedPair(self.pair, {**self.values, **values})


def annotate(pairs: Sequence[PreferencePair | AnnotatedPair]) -> list[AnnotatedPair]:
    return [p if isinstance(p, AnnotatedPair) else AnnotatedPair(p) for p in pairs]


def collate_annotated(
    items: Sequence[AnnotatedPair], *, seq_len: int, pad_id: int, batch_size: int | None = None
) -> dict[str, np.ndarray]:
    """`collate_pairs` plus one [2B] float32 array per value key (0 on padding pairs)."""
    b = len(items) if batch_size is None else batch_size
    batch = collate_pairs([it.pair for it in items], seq_len=seq_len, pad_id=pad_id, batch_size=b)
    keys = sorted(items[0].values) if items else []
    for key in keys:
        arr = np.zeros((2 * b,), np.float32)
        for j, it in enumerate(items):
            if key not in it.values:
                raise ValueError(f"pair {it.source} has no value {key!r} while others in its batch do")
            arr[j], arr[b + j] = it.values[key]
        batch[key] = arr
    return batch


def pair_batches(
    pairs: Sequence[PreferencePair | AnnotatedPair], *, batch_size: int, seq_len: int, pad_id: int
) -> list[dict[str, np.ndarray]]:
    """Every pair once, in order, as [2 * batch_size, seq_len] batches; the last one padded (for evaluation)."""
    items = annotate(pairs)
    return [
        collate_annotated(items[s : s + batch_size], seq_len=seq_len, pad_id=pad_id, batch_size=batch_size)
        for s in range(0, len(items), batch_size)
    ]


def annotated_pair_loader(
    items: Sequence[PreferencePair | AnnotatedPair],
    *,
    batch_size: int,
    seq_len: int,
    pad_id: int,
    seed: int = 0,
    shuffle: bool = True,
    num_epochs: int | None = None,
    drop_remainder: bool = True,
    collate: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
) -> BatchLoader[AnnotatedPair, AnnotatedPair]:
    """Like `tempax.data.preference_loader`, adding each pair's values as [2B] arrays.

    Args:
      collate: an optional last transformation of each collated batch (e.g. reference log-probs from a frozen
        copy); it runs when the batch is drawn, so the loader stays resumable.
      Others: see `tempax.data.preference_loader`.
    """
    items = annotate(items)
    too_long = [it.source for it in items if max(len(it.chosen), len(it.rejected)) > seq_len]
    if too_long:
        raise DataError(
            f"{len(too_long)} preference pairs are longer than seq_len={seq_len} (first: {too_long[0]}); "
            "tokenize with PreferenceOptions(max_length=seq_len)."
        )

    def make_batch(units: Sequence[AnnotatedPair]) -> dict[str, np.ndarray]:
        batch = collate_annotated(units, seq_len=seq_len, pad_id=pad_id, batch_size=batch_size)
        return batch if collate is None else collate(batch)

    return BatchLoader(
        items,
        batch_size=batch_size,
        make_units=lambda ordered: ordered,
        collate=make_batch,
        seed=seed,
        shuffle=shuffle,
        num_epochs=num_epochs,
        drop_remainder=drop_remainder,
        name="preference data",
    )


def pair_loaders(
    train_items: Sequence[PreferencePair | AnnotatedPair], eval_items: Sequence[PreferencePair | AnnotatedPair], *,
    pairs: int, seq_len: int, pad_id: int, seed: int, shuffle: bool,
    collate: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
) -> tuple[BatchLoader[AnnotatedPair, AnnotatedPair], Callable[[], list[dict[str, np.ndarray]]] | None]:
    """(training loader of `pairs` pairs a batch, held-out batches or None): a pair-scored run's batches. The
    held-out batches are collated once and the same ones are scored at every evaluation."""
    loader = annotated_pair_loader(train_items, batch_size=pairs, seq_len=seq_len, pad_id=pad_id, seed=seed,
                                   shuffle=shuffle, collate=collate)
    if not eval_items:
        return loader, None
    cached = pair_batches(eval_items, batch_size=pairs, seq_len=seq_len, pad_id=pad_id)
    if collate is not None:
        cached = [collate(b) for b in cached]
    return loader, lambda: cached


# ---------------------------------------------------------------------------------------------- reference log-probs


def jit_sequence_logps(
    model: nnx.Module, *, adapters_off: bool = False
) -> Callable[[Batch], tuple[np.ndarray, np.ndarray]]:
    """A jitted `sequence_logps` of the model's weights as they are now (a read-only snapshot, no gradients).

    Args:
      model: the model.
      adapters_off: score with the LoRA adapters switched off (the frozen base), as a reference.
    """
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state: Any, batch: Batch) -> tuple[jax.Array, jax.Array]:
        m = nnx.merge(graphdef, state)
        if not adapters_off:
            return sequence_logps(m, batch)

        with disable_adapters(m):
            return sequence_logps(m, batch)

    def call(batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        # NumPy inputs are the same global value in every process; the outputs may span processes.
        logps, n = run(state, {k: np.asarray(batch[k]) for k in BATCH_KEYS})
        return host_array(logps), host_array(n)

    return call


def compute_reference_logps(
    model: nnx.Module | None,
    pairs: Sequence[PreferencePair | AnnotatedPair],
    *,
    batch_size: int,
    seq_len: int,
    pad_id: int,
    logps_fn: Callable[[Batch], tuple[np.ndarray, np.ndarray]] | None = None,
) -> list[AnnotatedPair]:
    """One pass of the reference model over every pair; returns the pairs carrying `ref_logps`.

    Done before training with full fine-tuning, so training holds one model instead of a frozen copy. Padding
    the last batch keeps one compiled shape.

    Args:
      model: the reference model (normally the policy before its first update); unused when `logps_fn` is given.
      pairs: tokenised pairs no longer than `seq_len`.
      batch_size: pairs per forward pass (2 * batch_size rows).
      logps_fn: a ready `jit_sequence_logps(...)` (or any batch -> (logps [2B], num_tokens [2B])).
    """
    if not pairs:
        raise DataError("no preference pairs to compute reference log-probs for")
    fn = logps_fn or jit_sequence_logps(model)
    items = annotate(pairs)
    out: list[AnnotatedPair] = []
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        batch = collate_pairs([it.pair for it in chunk], seq_len=seq_len, pad_id=pad_id, batch_size=batch_size)
        logps, _ = fn(batch)
        for j, it in enumerate(chunk):
            out.append(it.with_values(**{REF_LOGPS: (float(logps[j]), float(logps[batch_size + j]))}))
    return out
