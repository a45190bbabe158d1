"""What to generate: the sampling knobs of one request, validated once when the config is built."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tempax.errors import GenerationError


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled.

    Filters apply in this order to the temperature-scaled distribution: top-k, then top-p on the renormalised
    top-k distribution, then min-p (relative to the most likely token, so its set does not depend on
    renormalisation). A token survives only if every enabled filter keeps it.

    Attributes:
      max_new_tokens: most tokens generated per completion (> 0). The stop token, when one ends the completion,
        counts as one of them.
      temperature: softmax temperature; 0 means greedy (argmax, no randomness, the filters are ignored).
      top_k: keep the k most likely tokens; 0 disables the filter.
      top_p: nucleus sampling, keep the smallest set of most likely tokens whose probability reaches top_p;
        1.0 disables it. Must lie in (0, 1].
      min_p: keep tokens whose probability is at least min_p times the most likely token's; 0 disables it.
      n: completions per prompt (a recipe's `group_size`). They share one prefill of the prompt. Named `n` as in
        the OpenAI API and vLLM's sampling parameters, whose requests `tempax serve` takes as they are.
      seed: base of the random stream. Row (prompt i, sample j) draws from
        `fold_in(fold_in(key(seed), i), j)`, so results are reproducible and do not depend on how a request is
        split into calls (see `generate`'s `prompt_offset` / `sample_offset`).
      stop: strings that end a completion; the returned text is cut right before the first one.
      stop_token_ids: ids that end a completion (the stop token is kept in the token ids and mask, not in the
        text); None means the tokenizer's stop ids (EOS and end-of-turn tokens).
      ignore_eos: never stop on a token id (benchmarks that must generate exactly max_new_tokens).
      max_len: cap on prompt + completion length, below the model's context; None = the model's context.
      logprobs: compute per-token log-probabilities (two log-sum-exps over the vocabulary per step).
      decode_layout: "auto" (where the platform prefers it: XLA:CPU), "on" or "off": decode steps multiply a
        tied LM head with the embedding table as the left operand (`tempax.ops.tied_lm_head`), which XLA:CPU
        streams faster in few-row products; same logits, no copy of any weight. tempax `Decoder`s only.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    n: int = 1
    seed: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] | None = None
    ignore_eos: bool = False
    max_len: int | None = None
    logprobs: bool = True
    decode_layout: str = "auto"

    def __post_init__(self) -> None:
        # Accept lists from YAML / CLI callers; keep the dataclass hashable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if self.stop_token_ids is not None:
            object.__setattr__(self, "stop_token_ids", tuple(int(i) for i in self.stop_token_ids))
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise GenerationError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if not self.temperature >= 0.0:
            raise GenerationError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise GenerationError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise GenerationError(f"top_p must lie in (0, 1] (1 = off), got {self.top_p!r}")
        if not 0.0 <= self.min_p <= 1.0:
            raise GenerationError(f"min_p must lie in [0, 1] (0 = off), got {self.min_p!r}")
        if not isinstance(self.n, int) or self.n < 1:
            raise GenerationError(f"n (samples per prompt) must be an integer >= 1, got {self.n!r}")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise GenerationError(f"seed must be an integer in [0, 2**32), got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise GenerationError(f"stop strings must be non-empty strings, got {self.stop!r}")
        if self.decode_layout not in ("auto", "on", "off"):
            raise GenerationError(f"decode_layout must be 'auto', 'on' or 'off', got {self.decode_layout!r}")
        if self.max_len is not None and self.max_len < 2:
            raise GenerationError(f"max_len must be at least 2 (one prompt and one new token), got {self.max_len}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def replace(self, **changes: Any) -> "SamplingConfig":
        return dataclasses.replace(self, **changes)
