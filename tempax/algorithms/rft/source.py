"""Rejection-sampling fine-tuning as a batch source for `Trainer.fit` (the protocol: `tempax.train.sources`).

    trainer = Trainer(model, make_rft_loss(chunk_len=64), cfg.train, trainable=lora_filter)
    source = RFTSource(tokenizer, PromptSampler(prompts), reward_fn, settings)
    result = trainer.fit(source)

`RFTSource` says what a round samples, keeps and trains on, and what it resumes from.
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from tempax.algorithms.rft.config import RFTKnobsConfig
from tempax.algorithms.rft.selection import Selection, completion_weights, select_completions
from tempax.data.formats import Example
from tempax.data.packing import collate_rows, plan_packing
from tempax.errors import TempaxError
from tempax.rl.rollout import PromptSampler, Rollout, concat_rollouts, episode_metrics, sample_rollout
from tempax.train.sources import decode_arrays, encode_arrays
from tempax.train.view import TrainerView

Batch = dict[str, np.ndarray]


class NothingAccepted(TempaxError):
    """Round after round, the checker accepted none of the policy's samples: there is nothing to fine-tune on."""


def kept_examples(rollout: Rollout, kept: np.ndarray, weights: np.ndarray) -> list[tuple[Example, float]]:
    """(SFT example, weight) per kept completion, problem by problem in sample order: the prompt's tokens then
    the completion's tokens as sampled (stop token included), the loss mask on the policy's tokens only (in a
    multi-turn episode the environment's messages stay in the context but carry no loss)."""
    out = []
    for i, prompt in enumerate(rollout.prompts):
        ids = np.asarray(prompt.ids, np.int32)
        for j in np.flatnonzero(kept[i]):
            n = int(rollout.lengths[i, j])
            tokens = np.concatenate([ids, rollout.completion_tokens[i, j, :n].astype(np.int32)])
            mask = np.concatenate([np.zeros(len(ids), bool), rollout.completion_mask[i, j, :n].astype(bool)])
            out.append((Example(tokens, mask, source=f"round problem {i} sample {int(j)}"), float(weights[i, j])))
    return out


def pack_round(
    examples: Sequence[tuple[Example, float]],
    *,
    batch_size: int,
    seq_len: int,
    pad_id: int,
    epochs: int,
    seed: int,
) -> list[Batch]:
    """The round's batches: per pass, the examples in the order `random.Random(f"{seed}:{pass}")` shuffles them
    to, greedily packed into rows (`plan_packing`); the rows of all passes, `batch_size` at a time (the last batch
    filled with empty rows, which carry no loss). Each batch has the data layer's keys plus `weights` [B, T]
    float32, the weight of the example each position belongs to (0 on padding)."""
    rows: list[list[int]] = []
    for e in range(epochs):
        order = list(range(len(examples)))
        random.Random(f"{seed}:{e}").shuffle(order)
        plan = plan_packing([len(examples[i][0]) for i in order], seq_len)
        rows.extend([order[k] for k in row] for row in plan)
    batches = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        batch = collate_rows([[examples[i][0] for i in row] for row in chunk], seq_len=seq_len, pad_id=pad_id,
                             num_rows=batch_size)
        weights = np.zeros((batch_size, seq_len), np.float32)
        for r, row in enumerate(chunk):
            off = 0
            for i in row:
                example, weight = examples[i]
                weights[r, off:off + len(example)] = weight
                off += len(example)
        batch["weights"] = weights
        batches.append(batch)
    return batches


def _stack(batches: Sequence[Batch]) -> Batch:
    return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


def _unstack(stacked: Batch) -> list[Batch]:
    n = next(iter(stacked.values())).shape[0]
    return [{k: v[i] for k, v in stacked.items()} for i in range(n)]


class RFTSource:
    """Rounds of sample -> check -> keep -> SFT batches, from the current policy.

    Each round, drawn lazily when `fit` asks for a batch and the previous round's batches are used up (so from the
    weights the last step produced):
      1. sample k completions for each of `problems_per_round` problems with the current policy (`trainer.model`;
         the k samples of a problem share one prefill), score them with the checker's reward functions
         (`tempax.rl.rollout.sample_rollout`, the rollout machinery GRPO uses);
      2. keep the accepted, distinct, capped completions and weigh them (`selection.select_completions`,
         `selection.completion_weights`);
      3. turn each kept completion into an SFT example, prompt + completion tokens exactly as sampled (no
         re-tokenisation), with the loss on the completion only (its stop token included), and pack the examples, in
         a seeded shuffled order per pass, into [train.batch_size, train.seq_len] rows (`tempax.data.packing`);
         `epochs_per_round` passes;
      4. yield those batches one per optimizer step.

    A round that keeps nothing is sampled again (new problems), up to `max_empty_rounds` in a row.

    Resume (the boundary rule of `tempax.train.sources`): `state()` holds the problem sampler's position, the round
    count (which seeds sampling and the shuffles) and the round's batches not yet trained (`encode_arrays`), so a
    checkpoint or a stop at any step, also in the middle of a round, resumes into exactly the batches of the
    uninterrupted run, never re-sampling a round with weights it was not sampled with.

    Metrics (on a round's first step): reward mean of all samples (the on-policy reward, the curve that should
    rise), accept rate, kept per problem, problems with a kept completion, duplicates and capped completions dropped,
    the round's steps, and the time split `perf/generation_s`, `perf/reward_s`; every step reports `rft/round`.

    Args:
      tokenizer: the policy's tokenizer.
      sampler: where problems come from (its position is part of `state()`).
      reward_fn: the checker, a `tempax.rewards.CombinedReward` (never raises; failures score 0).
      settings: the algorithm knobs.
      env_factory: builds one episode's environment (`EnvironmentConfig.build`); None: one reply per problem.
      max_turns: the policy's replies in an episode (the environment config's `max_turns`).
      episode_tokens: the completion budget after the prompt, derived once by the caller
        (`EnvironmentConfig.episode_tokens`); None: `settings.max_new_tokens` (one reply).
    """

    def __init__(self, tokenizer: Any, sampler: PromptSampler, reward_fn: Any, settings: RFTKnobsConfig, *,
                 env_factory: Callable[[], Any] | None = None, max_turns: int = 1,
                 episode_tokens: int | None = None):
        self.tokenizer = tokenizer
        self.env_factory = env_factory
        self.max_turns = max_turns
        self.episode_tokens = episode_tokens or settings.max_new_tokens
        self.sampler = sampler
        self.reward_fn = reward_fn
        self.settings = settings
        self.trainer: TrainerView | None = None
        self.rounds_done = 0
        self.last_selection: Selection | None = None
        self._pending: list[Batch] = []
        self._metrics: dict[str, float] = {}

    # -- the protocol -----------------------------------------------------------------------------------------
    def attach(self, trainer: TrainerView) -> None:
        self.trainer = trainer

    def __iter__(self) -> Iterator[Batch]:
        while True:
            if not self._pending:
                self._next_round()
            else:
                self._metrics = {}  # a round's numbers belong to its first step
            self._metrics["rft/round"] = float(self.rounds_done)
            yield self._pending.pop(0)

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"sampler": self.sampler.state(), "rounds": self.rounds_done}
        if self._pending:
            state["pending"] = encode_arrays(_stack(self._pending))
        return state

    def restore(self, state: dict[str, Any]) -> None:
        if state.get("sampler"):
            self.sampler.restore(state["sampler"])
        self.rounds_done = int(state.get("rounds", 0))
        pending = state.get("pending")
        self._pending = _unstack(decode_arrays(pending)) if pending else []

    def batch_metrics(self) -> dict[str, float]:
        return self._metrics

    # -- pieces -----------------------------------------------------------------------------------------------
    def _attached(self) -> TrainerView:
        if self.trainer is None:
            raise RuntimeError("RFTSource.attach(trainer) must run first (Trainer.fit does it)")
        return self.trainer

    def sample(self) -> Rollout:
        """One round's samples: k completions for each of `problems_per_round` problems, scored."""
        trainer, s = self._attached(), self.settings
        problems = self.sampler.next(s.problems_per_round)
        model = trainer.model
        parts = []
        for c, start in enumerate(range(0, len(problems), s.sampling_batch)):
            seed = (trainer.seed * 1_000_003 + self.rounds_done * 101 + c) % (2**31 - 1)
            parts.append(sample_rollout(
                model, self.tokenizer, problems[start:start + s.sampling_batch], self.reward_fn,
                group_size=s.group_size, max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                top_p=s.top_p, seed=seed,
                advantage="dr_grpo",  # unused by RFT; the one estimator defined for a single sample per problem
                env_factory=self.env_factory, max_turns=self.max_turns, episode_tokens=self.episode_tokens,
            ))
        return concat_rollouts(parts)

    def _next_round(self) -> None:
        trainer, s = self._attached(), self.settings
        for empty in range(s.max_empty_rounds):
            t0 = time.perf_counter()
            rollout = self.sample()
            selection = select_completions(rollout.rewards, rollout.truncated, rollout.texts,
                                           threshold=s.threshold, cap=s.max_per_problem,
                                           allow_truncated=s.keep_truncated)
            examples = kept_examples(rollout, selection.kept,
                                     completion_weights(selection.kept, weighting=s.weighting))
            self.rounds_done += 1
            self.last_selection = selection
            if not examples:
                continue
            self._pending = pack_round(
                examples, batch_size=trainer.batch_size, seq_len=trainer.seq_len,
                pad_id=self.tokenizer.pad_id, epochs=s.epochs_per_round,
                seed=trainer.seed * 1_000_003 + self.rounds_done)
            self._metrics = {**round_metrics(rollout, selection), "rft/round_steps": float(len(self._pending)),
                             "rft/empty_rounds_before": float(empty), "perf/rollout_s": time.perf_counter() - t0}
            return
        stop = "" if s.keep_truncated else f" with a stop token within rft.max_new_tokens={s.max_new_tokens}"
        raise NothingAccepted(
            f"rft: {s.max_empty_rounds} rounds in a row kept no completion (none reached rft.threshold="
            f"{float(s.threshold)}{stop}); warm-start the policy with SFT on the answer format, lower rft.threshold, or "
            "raise rft.group_size")


def round_metrics(rollout: Rollout, selection: Selection) -> dict[str, float]:
    """The round's numbers: rewards of all its samples (total and per function), lengths, the selection's
    counts (`Selection.metrics`), and the time spent generating and scoring."""
    m: dict[str, float] = {"reward/total_mean": float(rollout.rewards.mean())}
    for name, values in rollout.reward_parts.items():
        m[f"reward/{name}_mean"] = float(values.mean())
        m[f"reward/{name}_failures"] = float(rollout.reward_failures.get(name, 0))
    m["completion/length_mean"] = float(rollout.lengths.mean())
    m["completion/truncated_frac"] = float(rollout.truncated.mean())
    if rollout.turns is not None:
        m.update(episode_metrics(rollout))
    m.update(selection.metrics())
    m["perf/generation_s"] = rollout.seconds.get("generation", 0.0)
    m["perf/reward_s"] = rollout.seconds.get("reward", 0.0)
    return m
