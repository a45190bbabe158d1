"""On-policy distillation (GKD; Agarwal et al. 2024, "On-policy distillation of language models: learning from
self-generated mistakes") as a batch source of the one training loop.

Each step's batch is, with probability lambda, on-policy: the current student samples a completion for each of
`batch_size` training prompts, and the batch is prompt + the student's completion with the loss on the completion
tokens; the loss function then runs the teacher on those very tokens, so the teacher scores the student's own
mistakes token by token. Otherwise (probability 1 - lambda) the batch is the dataset's next off-policy batch (the
rows' own completions, as in `mode: off_policy`). lambda = 0 is supervised KD, lambda = 1 is purely on-policy;
the paper's best settings pair lambda in [0.5, 1] with the generalised JSD (`loss.kind: jsd`).

What we do differently: the paper draws on- vs off-policy per batch like this, but samples at temperature 1 from
the student without truncation; `temperature` here is a knob (default 1). Gradients do not flow through the
sampling (as in the paper).

The choice and the sampling are seeded by (train.seed, batch number), and the source's state (batches drawn, the
prompt order position, the offline loader's position) is checkpointed with every step, so a resumed run draws
the same batches from the same weights.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tempax.configlib import help_field
from tempax.errors import ConfigError
from tempax.data.formats import Example
from tempax.data.packing import collate_rows
from tempax.generate import SamplingConfig, generate
from tempax.train.view import TrainerView


@dataclass(frozen=True)
class OnPolicyConfig:
    """On-policy GKD batches (`mode: on_policy`)."""

    lmbda: float = help_field("Probability that a batch is the student's own samples (GKD's lambda); else off-policy.",
                         0.5)
    max_new_tokens: int = help_field("Most tokens the student samples per prompt.", 64)
    temperature: float = help_field("Student sampling temperature (GKD: 1).", 1.0)

    def validate(self) -> None:
        if not 0.0 <= self.lmbda <= 1.0:
            raise ConfigError(f"on_policy.lmbda must lie in [0, 1], got {self.lmbda}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"on_policy.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature > 0:
            raise ConfigError(f"on_policy.temperature must be > 0 (on-policy samples), got {self.temperature}")


def completion_batch(
    prompt_ids: list[list[int]], completions: list[list[int]], *, seq_len: int, pad_id: int, num_rows: int
) -> dict[str, np.ndarray]:
    """A fixed-shape training batch of prompt + completion rows with the loss on the completion tokens only
    (`tempax.data.packing.collate_rows` keys), one example per row."""
    rows = []
    for prompt, completion in zip(prompt_ids, completions):
        tokens = np.asarray(list(prompt) + list(completion), np.int32)[:seq_len]
        mask = np.zeros(len(tokens), bool)
        mask[len(prompt):] = True
        rows.append([Example(tokens=tokens, loss_mask=mask)])
    return collate_rows(rows, seq_len=seq_len, pad_id=pad_id, num_rows=num_rows)


class GKDSource:
    """Batches mixing the student's own samples (probability lambda) with the dataset's batches (module docstring).

    Args:
      offline: the dataset's batch loader (`tempax.data.loader.BatchLoader` or any iterator of batches).
      prompt_ids: token ids of the training prompts (chat template with the generation prompt applied); each must
        leave `spec.max_new_tokens` within `seq_len`.
      tokenizer: for the stop tokens of sampling.
      spec: lambda and the sampling knobs.
      batch_size, seq_len, pad_id: the shape of the batches the train step was compiled for.
      seed: train.seed.
    """

    def __init__(self, offline: Any, prompt_ids: list[list[int]], tokenizer: Any, spec: OnPolicyConfig, *,
                 batch_size: int, seq_len: int, pad_id: int, seed: int = 0):
        if not prompt_ids:
            raise ConfigError("on-policy distillation needs at least one prompt")
        self.offline = offline
        self.prompt_ids = prompt_ids
        self.tokenizer = tokenizer
        self.spec = spec
        self.batch_size, self.seq_len, self.pad_id, self.seed = batch_size, seq_len, pad_id, seed
        self.drawn = 0  # batches yielded so far
        self.prompt_pos = 0  # prompts used so far (a seeded order, reshuffled every pass)
        self.trainer: TrainerView | None = None
        self._metrics: dict[str, float] = {}

    # -- the batch-source protocol ---------------------------------------------------------------------------
    def attach(self, trainer: TrainerView) -> None:
        self.trainer = trainer

    def __iter__(self) -> "GKDSource":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        on_policy = self.is_on_policy(self.drawn)
        if on_policy:
            batch = self._sample()
        else:
            batch = next(self.offline)
            self._metrics = {"gkd/on_policy": 0.0}
        self.drawn += 1
        return batch

    def state(self) -> dict[str, Any]:
        offline = self.offline.state() if hasattr(self.offline, "state") else None
        return {"drawn": self.drawn, "prompt_pos": self.prompt_pos, "offline": offline}

    def restore(self, state: dict[str, Any]) -> None:
        self.drawn, self.prompt_pos = int(state["drawn"]), int(state["prompt_pos"])
        if state.get("offline") is not None and hasattr(self.offline, "restore"):
            self.offline.restore(state["offline"])

    def batch_metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    # -- internals ---------------------------------------------------------------------------------------------
    def is_on_policy(self, batch_index: int) -> bool:
        """Whether batch `batch_index` is on-policy: a seeded draw u < lambda (PCG64 streams are stable across
        numpy versions)."""
        u = np.random.default_rng([self.seed, batch_index, 0x6B64]).random()
        return bool(u < self.spec.lmbda)

    def _next_prompts(self) -> list[list[int]]:
        n = len(self.prompt_ids)
        out = []
        for _ in range(self.batch_size):
            epoch, i = divmod(self.prompt_pos, n)
            order = np.random.default_rng([self.seed, epoch, 0x7072]).permutation(n)
            out.append(self.prompt_ids[int(order[i])])
            self.prompt_pos += 1
        return out

    def _sample(self) -> dict[str, np.ndarray]:
        if self.trainer is None:
            raise ConfigError("GKDSource samples from the trainer's student: pass it to Trainer.fit, which attaches it")
        prompts = self._next_prompts()
        sampling = SamplingConfig(max_new_tokens=self.spec.max_new_tokens, temperature=self.spec.temperature,
                                  seed=(self.seed * 1_000_003 + self.drawn) % 2**32, logprobs=False)
        start = time.perf_counter()
        result = generate(self.trainer.model.student, self.tokenizer, prompts, sampling)
        completions = [list(result.token_ids[r][: int(result.lengths[r])]) for r in range(len(prompts))]
        self._metrics = {
            "gkd/on_policy": 1.0,
            "gkd/generation_s": time.perf_counter() - start,
            "gkd/completion_len": float(np.mean(result.lengths)),
        }
        return completion_batch(prompts, completions, seq_len=self.seq_len, pad_id=self.pad_id,
                                num_rows=self.batch_size)
