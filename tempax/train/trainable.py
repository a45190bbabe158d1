"""What the `Trainer` needs from the model it trains, declared once: the `TrainableModel` protocol, a training
view (remat and precision applied to a new graph over the same arrays, so the trainer never edits the caller's
model) and a memory profile (what the memory plan sizes). `Trainable` is the adapter for a plain `Decoder` and
states what a run adds to the profile, so no config is rewritten to feed the plan.

    trainer = Trainer(model, loss_fn, cfg.train)                             # a Decoder: the default adapter
    trainer = Trainer(Trainable(model, logit_positions=64), loss_fn, cfg.train)  # a chunked loss
    trainer = Trainer(Trainable(actor_critic, tokens_per_row=n, held_bytes=b), loss_fn, cfg.train)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from flax import nnx

from tempax.train.state import training_view


@dataclass(frozen=True)
class MemoryProfile:
    """What one training row costs, for the memory plan (`tempax.train.memory.PlanInputs`).

    Attributes:
      model: the `ModelConfig` of the decoder the plan sizes (a composite's trained trunk); None: no plan (a
        model without a config, e.g. a lookup table in tests).
      tokens_per_row: tokens one batch row runs through the model; None: `train.seq_len`. A GRPO row is one
        prompt plus its G completions.
      logit_positions: the loss materialises vocabulary logits for this many positions per row at a time (a
        chunked or fused loss); None: whole rows; 0: none (a scalar head reads hidden states).
      held_bytes: models kept beside the trained one and never trained (a reward model, a frozen reference).
      trunks: decoder stacks the loss runs forward and backward (2: a policy and a separate critic).
      full_params: trainable parameters when every `nnx.Param` trains, when that is more than `model`'s count
        (a critic trunk and a value head beside the policy); None: `model.num_params()`.
    """

    model: Any = None
    tokens_per_row: int | None = None
    logit_positions: int | None = None
    held_bytes: int = 0
    trunks: int = 1
    full_params: int | None = None


@runtime_checkable
class TrainableModel(Protocol):
    """What the `Trainer` needs from a model. A plain `Decoder` (or any module whose `config` carries `remat`)
    needs nothing: `Trainable(module)` is its adapter, and the trainer wraps a bare module in it. A composite model
    (a policy with a value head, a student beside its teacher) implements both methods itself, naming its trunks.
    What a run adds (a row longer than `train.seq_len` because it holds a prompt and its G completions, models held
    beside the trained one, a loss that materialises logits chunk by chunk) is stated with `Trainable(model, ...)`."""

    def training_view(self, *, remat: str | None, precision: str) -> nnx.Module:
        """A new graph over the same arrays with `remat` on its decoder trunks and `precision` compute."""
        ...

    def memory_profile(self) -> MemoryProfile:
        """What one training row costs, for the memory plan."""
        ...


@dataclass(frozen=True)
class Trainable:
    """The default `TrainableModel`: a module plus what a run adds to its memory profile.

    Args:
      module: a `Decoder` (its config gets `remat`), or a composite that implements `TrainableModel` itself
        (its own view and profile are used, and the fields below override its profile).
      trunks: for a composite that does not: the attribute names of its decoders that get `remat`; the plan
        sizes the first (a reward model: `("backbone",)`). Empty: the module is the decoder.
      tokens_per_row, logit_positions, held_bytes: as in `MemoryProfile`; None / 0 keep the module's own.
    """

    module: Any
    trunks: tuple[str, ...] = ()
    tokens_per_row: int | None = None
    logit_positions: int | None = None
    held_bytes: int = 0

    def training_view(self, *, remat: str | None, precision: str) -> nnx.Module:
        if isinstance(self.module, TrainableModel):
            return self.module.training_view(remat=remat, precision=precision)
        return training_view(self.module, remat=remat, precision=precision, trunks=self.trunks)

    def memory_profile(self) -> MemoryProfile:
        if isinstance(self.module, TrainableModel):
            base = self.module.memory_profile()
        else:
            decoder = getattr(self.module, self.trunks[0]) if self.trunks else self.module
            config = getattr(decoder, "config", None)
            base = MemoryProfile(model=config if hasattr(config, "num_params") else None)
        changes: dict[str, Any] = {}
        if self.tokens_per_row is not None:
            changes["tokens_per_row"] = self.tokens_per_row
        if self.logit_positions is not None:
            changes["logit_positions"] = self.logit_positions
        if self.held_bytes:
            changes["held_bytes"] = self.held_bytes
        return dataclasses.replace(base, **changes)


def as_trainable(model: Any) -> TrainableModel:
    """`model` when it implements `TrainableModel`, else its default adapter `Trainable(model)`."""
    return model if isinstance(model, TrainableModel) else Trainable(model)
