"""`TrainerView`: what a batch source and a hook see of the trainer, and all they may use of it.

`Trainer.fit` hands its sources (`source.attach(trainer)`) and hooks (`hook.start(trainer)`, `info.trainer`,
`hook.end(trainer)`) this narrow view instead of the whole trainer, so a source or a hook depends on the members
named here rather than on the loop's internals, and the modules that define sources and hooks never import the
loop (an arrow back would be an import cycle). `tests/train/test_view.py` checks that the sources and hooks of
tempax read nothing else: one that needs more widens the view here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: the view itself needs neither JAX nor the model code
    import jax
    from flax import nnx
    from jax.sharding import Mesh

    from tempax.train.state import ModelParts, Params
    from tempax.train.step import LossFn


@runtime_checkable
class TrainerView(Protocol):
    """The trainer as its batch sources and hooks see it. `Trainer` provides every member itself; a test's
    stand-in provides the ones its source or hook reads.

        where the run stands   step, run_dir
        the weights            params (trainable arrays), rest (frozen arrays), parts (`ModelParts`: `merge(params,
                               rest)` rebuilds the model, also inside jit), model (the current model, merged),
                               full_finetune (every weight trains: a reference must be a frozen copy), loss_fn
                               (the loss the step was compiled with)
        the devices            mesh, put_batch(batch) (a global host batch onto the mesh), micro_batch_size (rows
                               of one forward pass: no-grad passes over a rollout go in chunks of it)
        the settings           batch_size, seq_len, seed, learning_rate (`train.*`; the peak of the schedule)
        side effects           write(text) (a message above the progress bar), log(step, metrics) (a record in
                               metrics.jsonl and the trackers), save_checkpoint(data_state), evaluate(batches)

    An on-policy source samples with `model` and runs its no-grad forward passes as jitted functions of
    `(params, rest, batch)` that call `parts.merge(params, rest)`, on `mesh`, `micro_batch_size` rows at a time
    placed with `put_batch` (`tempax.algorithms.grpo.source`). Members are read-only: what a source or hook changes
    goes through `log`, `write`, `save_checkpoint` or a hook's `Stop`.
    """

    # -- where the run stands ----------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        """Optimizer updates done so far (restored ones included)."""
        ...

    @property
    def run_dir(self) -> str:
        """The run directory (metrics.jsonl, checkpoints)."""
        ...

    # -- the weights ---------------------------------------------------------------------------------------------
    @property
    def params(self) -> Params:
        """The current trainable arrays, a flat dict (donated by every step: read them again after one)."""
        ...

    @property
    def rest(self) -> Any:
        """The frozen arrays (base weights under adapters, a teacher, quantised weights) on the mesh."""
        ...

    @property
    def parts(self) -> ModelParts:
        """The model's static graph and templates: `parts.merge(params, rest)` is the model."""
        ...

    @property
    def model(self) -> nnx.Module:
        """The current model (`params` merged with `rest`)."""
        ...

    @property
    def full_finetune(self) -> bool:
        """Every weight trains (no adapters): a reference model must then be a frozen copy, not adapters off."""
        ...

    @property
    def loss_fn(self) -> LossFn:
        """The loss the train step was compiled with (read what it states; calling it trains nothing)."""
        ...

    # -- the devices ---------------------------------------------------------------------------------------------
    @property
    def mesh(self) -> Mesh:
        """The device mesh the state lives on (run jitted passes under `use_mesh(mesh)`)."""
        ...

    @property
    def micro_batch_size(self) -> int:
        """Rows per forward pass of the train step; no-grad passes chunk a batch to it."""
        ...

    def put_batch(self, batch: dict[str, Any]) -> dict[str, jax.Array]:
        """A global host batch placed on the mesh, rows split over the data-parallel axes."""
        ...

    # -- the settings (`train.*`) ------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """`train.batch_size`: rows per optimizer step."""
        ...

    @property
    def seq_len(self) -> int:
        """`train.seq_len`: tokens per row."""
        ...

    @property
    def seed(self) -> int:
        """`train.seed`: sources derive their sampling seeds from it."""
        ...

    @property
    def learning_rate(self) -> float:
        """`train.optimizer.learning_rate`: the schedule's peak (advice messages quote it)."""
        ...

    # -- side effects ------------------------------------------------------------------------------------------
    def write(self, text: str) -> None:
        """Prints a message above the progress bar (plainly when there is none)."""
        ...

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Writes a record at `step` to metrics.jsonl and the trackers; a training record (no `eval/` key) also
        joins `TrainResult.history` and the progress bar."""
        ...

    def save_checkpoint(self, data_state: dict[str, Any] | None = None) -> str | None:
        """Checkpoints the current state with the source's `data_state`; the checkpoint's path."""
        ...

    def evaluate(self, batches: Iterable[dict[str, Any]], *, max_batches: int = 0) -> dict[str, float]:
        """The loss function's metrics over held-out `batches` (no gradient), averaged by their `loss_weight`."""
        ...
