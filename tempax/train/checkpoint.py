"""Orbax checkpoints of a training run: everything needed to continue it exactly.

Layout (`<run_dir>/checkpoints/<step>/`, one folder per saved step; Orbax writes each into a temporary folder and
renames it when complete, so a killed run never leaves a half-written checkpoint that looks valid):

    params/     the trainable arrays, keyed like the model ("layers.0.mlp.up_proj.kernel"): every weight for full
                fine-tuning, only the adapters for LoRA/QLoRA (the base comes from the model source)
    opt_state/  the optimizer state's leaves, keyed "000000", "000001"... in `jax.tree.leaves` order (optax
                states are namedtuples; leaf order is stable for one optimizer config)
    train/      step, rng key data, bad_step
    data/       the data loader's `state()` (JSON), so batches continue where they stopped
    meta/       JSON: which parameters are trainable ("full" or "adapters") and the parameter keys

Only the last `keep` checkpoints stay. Saving is asynchronous when `async_save` is on: arrays are copied to the
host before `save` returns (the next step may donate them), and files are written in the background.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from tempax.errors import CheckpointError
from tempax.train.state import TrainState

ITEMS = ("params", "opt_state", "train", "data", "meta")


def _leaves_dict(tree: Any) -> dict[str, Any]:
    return {f"{i:06d}": leaf for i, leaf in enumerate(jax.tree.leaves(tree))}


class Checkpointer:
    """Saves and restores `TrainState`s (plus data position) under `<run_dir>/checkpoints`."""

    def __init__(self, directory: str | os.PathLike, *, keep: int = 2, async_save: bool = True):
        self.directory = os.path.abspath(os.fspath(directory))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=async_save, save_interval_steps=1,
            cleanup_tmp_directories=True,  # a run killed mid-write leaves a temporary folder; drop it on restart
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)
        self._started: set[int] = set()  # steps whose (possibly still running) save was started by this object

    # -- queries ----------------------------------------------------------------------------------------------
    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def path(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    # -- save / restore -----------------------------------------------------------------------------------------
    def save(self, state: TrainState, *, data_state: dict[str, Any] | None = None, meta: dict[str, Any] | None = None,
             force: bool = False) -> int:
        """Starts writing `state` as checkpoint `state.step`; returns the step. Refuses a non-finite state."""
        step, bad = (int(x) for x in jax.device_get((state.step, state.bad_step)))
        if bad >= 0:
            raise CheckpointError(f"refusing to save a checkpoint at step {step}: step {bad} was not finite")
        if step in self._started or step in self.all_steps():
            return step
        args = ocp.args.Composite(
            params=ocp.args.StandardSave(state.params),
            opt_state=ocp.args.StandardSave(_leaves_dict(state.opt_state)),
            train=ocp.args.StandardSave({"step": state.step, "rng": state.rng, "bad_step": state.bad_step}),
            data=ocp.args.JsonSave(data_state or {}),
            meta=ocp.args.JsonSave(meta or {}),
        )
        self._manager.save(step, args=args, force=True)
        self._started.add(step)
        return step

    def restore(self, target: TrainState, step: int | None = None) -> tuple[TrainState, dict[str, Any], dict[str, Any]]:
        """Restores checkpoint `step` (default: latest) into arrays shaped and sharded like `target`.

        `target` may hold concrete arrays or `jax.ShapeDtypeStruct`s with shardings. Returns (state, data_state,
        meta).
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint found in {self.directory}")
        abstract = jax.tree.map(_abstract, target)
        opt_leaves, opt_def = jax.tree.flatten(abstract.opt_state)
        args = ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract.params),
            opt_state=ocp.args.StandardRestore({f"{i:06d}": leaf for i, leaf in enumerate(opt_leaves)}),
            train=ocp.args.StandardRestore({"step": abstract.step, "rng": abstract.rng, "bad_step": abstract.bad_step}),
            data=ocp.args.JsonRestore(),
            meta=ocp.args.JsonRestore(),
        )
        try:
            out = self._manager.restore(step, args=args)
        except (ValueError, KeyError, FileNotFoundError) as e:
            raise CheckpointError(
                f"cannot restore checkpoint {self.path(step)}: {e}. It was written by a different model, trainable "
                "set or optimizer; use a fresh run_dir or set checkpoint.resume=false."
            ) from e
        opt = out["opt_state"]
        state = TrainState(
            step=out["train"]["step"],
            params=dict(out["params"]),
            opt_state=jax.tree.unflatten(opt_def, [opt[f"{i:06d}"] for i in range(len(opt_leaves))]),
            rng=out["train"]["rng"],
            bad_step=out["train"]["bad_step"],
        )
        return state, dict(out["data"] or {}), dict(out["meta"] or {})

    def restore_params(self, abstract_params: dict[str, Any], step: int | None = None) -> dict[str, Any]:
        """Only the trainable arrays of a checkpoint (for export and evaluation)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint found in {self.directory}")
        abstract = jax.tree.map(_abstract, abstract_params)
        out = self._manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract)))
        return dict(out["params"])

    def read_meta(self, step: int | None = None) -> dict[str, Any]:
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint found in {self.directory}")
        out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out["meta"] or {})

    def wait(self) -> None:
        """Blocks until background writes are finished."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def _abstract(x: Any) -> Any:
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    if isinstance(x, np.ndarray):
        return jax.ShapeDtypeStruct(x.shape, x.dtype)
    return x
