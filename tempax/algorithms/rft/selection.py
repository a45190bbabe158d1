"""Which sampled completions rejection-sampling fine-tuning keeps, and how much each weighs: pure functions.

One RFT round samples k completions for each of P problems ([P, k] arrays) and keeps

    accepted[i, j] = reward[i, j] >= threshold  and  not truncated[i, j]   (unless truncation is allowed)
    kept[i, j]     = accepted, the first of its normalised text within problem i (dedup),
                     and among the first `cap` survivors of problem i by reward (sample order breaks ties)

A truncated completion (cut by the token budget before its stop token) is not kept by default, whatever its
reward: training on it would teach the policy not to stop. Tasks whose answers have no stop token allow it.
Deduplication compares `normalize_completion` (whitespace runs collapsed, ends stripped), so two samples that
differ only in spacing count once, as in ReST-EM (Singh et al. 2023, "Beyond Human Data") and STaR (Zelikman
et al. 2022), which keep distinct correct solutions per problem, and the cap stops easy problems (where all k
samples pass) from filling the fine-tuning set.

Weights (`completion_weights`) say how much each kept completion's tokens count in the SFT loss:
    uniform:      w[i, j] = 1                       every kept completion counts the same
    per_problem:  w[i, j] = 1 / kept_i              every problem with a kept completion counts the same
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

WEIGHTINGS = ("uniform", "per_problem")

_WHITESPACE = re.compile(r"\s+")


def normalize_completion(text: str) -> str:
    """The text deduplication compares: runs of whitespace as one space, leading / trailing space removed."""
    return _WHITESPACE.sub(" ", text).strip()


def accept_mask(rewards: np.ndarray, truncated: np.ndarray, *, threshold: float,
                allow_truncated: bool = False) -> np.ndarray:
    """[P, k] bool: the checker's verdict, reward >= threshold, for completions that ended with a stop token
    (or for all, with `allow_truncated`)."""
    passed = np.asarray(rewards, np.float64) >= threshold
    return passed if allow_truncated else passed & ~np.asarray(truncated, bool)


def dedup_mask(texts: Sequence[Sequence[str]], accepted: np.ndarray) -> np.ndarray:
    """[P, k] bool: the accepted completions whose normalised text did not appear earlier among problem i's
    accepted completions (the first occurrence, in sample order, is kept)."""
    accepted = np.asarray(accepted, bool)
    out = np.zeros_like(accepted)
    for i, group in enumerate(texts):
        seen: set[str] = set()
        for j, text in enumerate(group):
            if not accepted[i, j]:
                continue
            key = normalize_completion(text)
            if key not in seen:
                seen.add(key)
                out[i, j] = True
    return out


def cap_mask(candidates: np.ndarray, rewards: np.ndarray, *, cap: int) -> np.ndarray:
    """[P, k] bool: at most `cap` of each problem's candidates, highest reward first (earlier sample wins a tie);
    cap 0 keeps every candidate."""
    candidates = np.asarray(candidates, bool)
    if cap <= 0:
        return candidates.copy()
    out = np.zeros_like(candidates)
    rewards = np.asarray(rewards, np.float64)
    for i in range(candidates.shape[0]):
        idx = [j for j in range(candidates.shape[1]) if candidates[i, j]]
        idx.sort(key=lambda j: (-rewards[i, j], j))  # stable: ties stay in sample order
        out[i, idx[:cap]] = True
    return out


@dataclass(frozen=True)
class Selection:
    """The outcome of one round's selection: masks [P, k] and the counts the metrics report."""

    accepted: np.ndarray  # [P, k] bool, passed the checker
    kept: np.ndarray  # [P, k] bool, accepted, deduplicated and capped
    duplicates: int  # accepted completions dropped as repeats within their problem
    capped: int  # distinct accepted completions dropped by the per-problem cap

    def metrics(self) -> dict[str, float]:
        """accept rate (over all samples), kept per problem (mean over problems), problems with a kept
        completion (the round's pass@k), duplicates and capped completions dropped."""
        p, k = self.accepted.shape
        kept_per_problem = self.kept.sum(axis=1)
        return {
            "rft/accept_rate": float(self.accepted.sum()) / max(p * k, 1),
            "rft/kept": float(self.kept.sum()),
            "rft/kept_per_problem": float(kept_per_problem.mean()) if p else 0.0,
            "rft/problems_solved_frac": float((kept_per_problem > 0).mean()) if p else 0.0,
            "rft/duplicates_dropped": float(self.duplicates),
            "rft/capped": float(self.capped),
        }


def select_completions(
    rewards: np.ndarray,
    truncated: np.ndarray,
    texts: Sequence[Sequence[str]],
    *,
    threshold: float,
    cap: int = 0,
    allow_truncated: bool = False,
) -> Selection:
    """accept -> dedup -> cap (see the module docstring)."""
    accepted = accept_mask(rewards, truncated, threshold=threshold, allow_truncated=allow_truncated)
    distinct = dedup_mask(texts, accepted)
    kept = cap_mask(distinct, rewards, cap=cap)
    return Selection(accepted=accepted, kept=kept, duplicates=int(accepted.sum() - distinct.sum()),
                     capped=int(distinct.sum() - kept.sum()))


def completion_weights(kept: np.ndarray, *, weighting: str = "uniform") -> np.ndarray:
    """[P, k] float32 loss weight of each kept completion (0 where not kept); see the module docstring."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"unknown weighting {weighting!r}; choose one of {WEIGHTINGS}")
    kept = np.asarray(kept, bool)
    if weighting == "uniform":
        return kept.astype(np.float32)
    per_problem = kept.sum(axis=1, keepdims=True)
    return np.where(kept, 1.0 / np.maximum(per_problem, 1), 0.0).astype(np.float32)
