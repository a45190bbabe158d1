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

Integrity: once Orbax has finished a checkpoint, the size of each of its files is recorded in
`<step>/tempax_files.json` (OCDBT keeps no checksums, so a truncated data file is otherwise found only by
TensorStore, mid-read). Before anything is read, `verify(step)` checks the folder with Orbax's own records (the step
is finalized, `_CHECKPOINT_METADATA` and every item's metadata file parse, the saved array shapes and keys match the
model about to receive them) and against that size record. A failure while reading the arrays (a truncated or
missing data file: TensorStore's OUT_OF_RANGE / NOT_FOUND) becomes a `DamagedCheckpoint` naming the file.
`restore_newest_intact` walks the steps newest first, says in one line which step it skipped and why, moves that
folder to `<run_dir>/damaged_checkpoints/` (so the run can write that step again) and restores the newest intact
one. A checkpoint of another shape is not damage: it raises `CheckpointMismatch` with the way out, before
TensorStore is asked for a single byte.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp

from tempax.errors import CheckpointError
from tempax.parallel.process import is_writer
from tempax.train.state import TrainState

ITEMS = ("params", "opt_state", "train", "data", "meta")
ARRAY_ITEMS = ("params", "opt_state", "train")  # StandardSave: `_METADATA` + an OCDBT store
JSON_ITEMS = ("data", "meta")  # JsonSave: one `metadata` file
DAMAGED_DIR = "damaged_checkpoints"
FILES_RECORD = "tempax_files.json"  # {"files": {relative path: size in bytes}} of a finished checkpoint


class DamagedCheckpoint(CheckpointError):
    """A checkpoint folder whose files are missing, truncated or unreadable.

    Attributes: step, path (the damaged file or folder), reason (one line).
    """

    def __init__(self, step: int, path: str, reason: str):
        self.step, self.path, self.reason = step, path, reason
        super().__init__(f"checkpoint step {step} is damaged: {path} {reason}")


class CheckpointMismatch(CheckpointError):
    """An intact checkpoint written for another model, trainable set or optimizer."""


def describe_storage_error(error: BaseException) -> tuple[str | None, str]:
    """(file, one-line reason) of an exception raised while Orbax/TensorStore read a checkpoint.

    TensorStore reports `... local file "<path>": Requested byte range [0, 799) is not valid for value of size
    300 [tensorstore_spec=...]`; the file is the last quoted local file and the reason the text after it, without
    the spec. Python's `FileNotFoundError` carries the path in `filename`.
    """
    text = str(error)
    if isinstance(error, FileNotFoundError):
        path = error.filename or (re.findall(r"(/\S+)", text) or [None])[-1]
        return (os.fspath(path).rstrip(".") if path else None), "is missing"
    text = text.split(" [tensorstore_spec", 1)[0]
    files = re.findall(r'local file "([^"]+)"', text)
    path = files[-1] if files else None
    m = re.search(r"byte range \[(\d+), (\d+)\) is not valid for value of size (\d+)", text)
    if m:
        return path, f"is truncated: {m.group(3)} bytes on disk, the checkpoint's index reads up to byte {m.group(2)}"
    if "NOT_FOUND" in text or "not found" in text.lower():
        return path, "is missing"
    lines = text.strip().splitlines()
    tail = text.rsplit(": ", 1)[-1].strip() if path else (lines[0] if lines else "")
    return path, f"cannot be read ({tail[:200] or type(error).__name__})"


def unfinished_saves(directory: str) -> list[int]:
    """Steps whose save never finished (the process died while writing): Orbax writes `<step>` under a temporary
    name and renames it when done, and the next `Checkpointer` on the folder deletes what is left."""
    if not os.path.isdir(directory):
        return []
    names = [n.split(ocp.path.atomicity_types.TMP_DIR_SUFFIX)[0] for n in os.listdir(directory)
             if ocp.path.atomicity_types.TMP_DIR_SUFFIX in n]
    return sorted(int(n) for n in names if n.isdigit())


def _read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


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
        self._unrecorded: set[int] = set()  # started steps whose file sizes are not yet in FILES_RECORD

    # -- queries ----------------------------------------------------------------------------------------------
    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def path(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def verify(self, step: int, target: dict[str, Any] | None = None, *, items: tuple[str, ...] = ITEMS) -> None:
        """Checks checkpoint `step` without reading its arrays; raises `DamagedCheckpoint` or `CheckpointMismatch`.

        Damage: the folder is not finalized, or `_CHECKPOINT_METADATA`, an item's `_METADATA` / `metadata` or its
        OCDBT manifest is missing or does not parse. Mismatch: `target` maps item names ("params", "opt_state",
        "train") to {key: array or ShapeDtypeStruct}; the saved keys and shapes must be exactly those. `items`:
        the items to check (export needs only params and meta).
        """
        from etils import epath

        folder = self.path(step)
        if not os.path.isdir(folder):
            raise DamagedCheckpoint(step, folder, "is missing")
        if not ocp.path.step.is_checkpoint_finalized(epath.Path(folder)):
            raise DamagedCheckpoint(step, folder, "was never finished (a save was cut short)")
        self._check_json(step, os.path.join(folder, "_CHECKPOINT_METADATA"))
        self._check_sizes(step, folder, items)
        for item in (i for i in JSON_ITEMS if i in items):
            self._check_json(step, os.path.join(folder, item, "metadata"))
        handler = ocp.StandardCheckpointHandler()
        for item in (i for i in ARRAY_ITEMS if i in items):
            item_dir = os.path.join(folder, item)
            self._check_json(step, os.path.join(item_dir, "_METADATA"))
            manifest = os.path.join(item_dir, "manifest.ocdbt")
            if not os.path.isfile(manifest):
                raise DamagedCheckpoint(step, manifest, "is missing")
            if target is None or item not in target:
                continue
            try:
                saved = dict(handler.metadata(epath.Path(item_dir)).tree)
            except Exception as e:  # noqa: BLE001 - any failure to read Orbax's own record is damage
                path, reason = describe_storage_error(e)
                raise DamagedCheckpoint(step, path or os.path.join(item_dir, "_METADATA"), reason) from None
            _compare_shapes(step, folder, item, saved, target[item])

    def _check_sizes(self, step: int, folder: str, items: tuple[str, ...]) -> None:
        record = os.path.join(folder, FILES_RECORD)
        if not os.path.isfile(record):
            return  # written by an older tempax, or killed between Orbax's finish and the record: Orbax's checks only
        self._check_json(step, record)
        for rel, size in sorted(_read_json(record).get("files", {}).items()):
            if os.sep in rel and rel.split(os.sep, 1)[0] not in items:
                continue
            path = os.path.join(folder, rel)
            if not os.path.isfile(path):
                raise DamagedCheckpoint(step, path, "is missing")
            now = os.path.getsize(path)
            if now < size:
                raise DamagedCheckpoint(step, path, f"is truncated: {now} bytes on disk, {size} when saved")
            if now != size:
                raise DamagedCheckpoint(step, path, f"changed size since it was saved ({size} -> {now} bytes)")

    def _record_finished(self) -> None:
        """Writes FILES_RECORD for each step this object saved whose background write has finished."""
        from etils import epath

        if not is_writer():  # every process wrote its shards; process 0 records the finished folder
            self._unrecorded.clear()
            return
        for step in sorted(self._unrecorded):
            folder = self.path(step)
            if not os.path.isdir(folder) or not ocp.path.step.is_checkpoint_finalized(epath.Path(folder)):
                continue
            files = {}
            for root, _, names in os.walk(folder):
                for name in names:
                    full = os.path.join(root, name)
                    files[os.path.relpath(full, folder)] = os.path.getsize(full)
            files.pop(FILES_RECORD, None)
            tmp = os.path.join(folder, FILES_RECORD + ".tmp")
            with open(tmp, "w") as f:
                json.dump({"files": files}, f, indent=0, sort_keys=True)
            os.replace(tmp, os.path.join(folder, FILES_RECORD))  # never a half-written record
            self._unrecorded.discard(step)

    def _check_json(self, step: int, path: str) -> None:
        if not os.path.isfile(path):
            raise DamagedCheckpoint(step, path, "is missing")
        try:
            _read_json(path)
        except (OSError, ValueError) as e:
            raise DamagedCheckpoint(step, path, f"does not parse as JSON ({e})") from None

    def intact_steps(self, target: dict[str, Any] | None = None, *, read_params: Any = None) -> list[int]:
        """Steps (newest first) that pass `verify`; with `read_params` (abstract params) also whose params read."""
        out = []
        for step in sorted(self.all_steps(), reverse=True):
            try:
                self.verify(step, target, items=tuple(target or ITEMS))
                if read_params is not None:
                    self.restore_params(read_params, step)
            except CheckpointError:
                continue
            out.append(step)
        return out

    # -- save / restore -----------------------------------------------------------------------------------------
    def save(self, state: TrainState, *, data_state: dict[str, Any] | None = None,
             meta: dict[str, Any] | None = None) -> int:
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
        self._manager.wait_until_finished()  # Orbax waits for the previous save anyway; then its files are final
        self._record_finished()
        self._manager.save(step, args=args, force=True)
        self._started.add(step)
        self._unrecorded.add(step)
        self._record_finished()  # a synchronous save is final already
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
        items = {
            "params": dict(abstract.params),
            "opt_state": {f"{i:06d}": leaf for i, leaf in enumerate(opt_leaves)},
            "train": {"step": abstract.step, "rng": abstract.rng, "bad_step": abstract.bad_step},
        }
        self.verify(step, items)
        args = ocp.args.Composite(
            data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore(),
            **{name: ocp.args.StandardRestore(tree) for name, tree in items.items()},
        )
        out = self._read(step, args)
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
        self.verify(step, {"params": abstract}, items=("params", "meta"))
        out = self._read(step, ocp.args.Composite(params=ocp.args.StandardRestore(abstract)))
        return dict(out["params"])

    def read_meta(self, step: int | None = None) -> dict[str, Any]:
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint found in {self.directory}")
        path = os.path.join(self.path(step), "meta", "metadata")
        self._check_json(step, path)
        return dict(_read_json(path) or {})

    def _read(self, step: int, args: Any) -> Any:
        """Orbax's restore; any failure of a verified checkpoint is damage to a data file, named by path."""
        try:
            return self._manager.restore(step, args=args)
        except Exception as e:  # noqa: BLE001 - TensorStore raises ValueError/OSError/RuntimeError alike
            path, reason = describe_storage_error(e)
            if path is None:  # not traceable to a file: report it, but do not call the checkpoint damaged
                raise CheckpointError(f"cannot read checkpoint {self.path(step)}: {reason}") from None
            raise DamagedCheckpoint(step, path, reason) from None

    def restore_newest_intact(
        self, target: TrainState, *, say: Callable[[str], None] = print
    ) -> tuple[int, TrainState, dict[str, Any], dict[str, Any]] | None:
        """Restores the newest checkpoint that reads completely: (step, state, data_state, meta), None if none.

        Each damaged step on the way is reported in one line and moved to `<run_dir>/damaged_checkpoints/<step>`
        (kept for inspection; the run writes that step again). Raises `CheckpointMismatch` at once (an older
        step of the same run would not match either) and `CheckpointError` when every step is damaged.
        """
        damaged: list[DamagedCheckpoint] = []
        for step in sorted(self.all_steps(), reverse=True):
            try:
                state, data_state, meta = self.restore(target, step)
            except DamagedCheckpoint as e:
                moved = self.set_aside(step)
                say(f"skipping checkpoint step {step}: {e.path} {e.reason} (moved to {moved})")
                damaged.append(e)
                continue
            return step, state, data_state, meta
        if damaged:
            raise CheckpointError(
                f"no intact checkpoint in {self.directory}: " + "; ".join(str(e) for e in damaged)
                + ". Start over with a new train.run_dir, or train.checkpoint.resume=false."
            )
        return None

    def set_aside(self, step: int) -> str:
        """Moves checkpoint `step` to `<run_dir>/damaged_checkpoints/<step>[.N]`; returns the new path."""
        base = os.path.join(os.path.dirname(self.directory), DAMAGED_DIR, str(step))
        dest, n = base, 1
        while os.path.exists(dest):
            dest, n = f"{base}.{n}", n + 1
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.move(self.path(step), dest)
        self._manager.reload()
        self._started.discard(step)
        return dest

    def wait(self) -> None:
        """Blocks until background writes are finished."""
        self._manager.wait_until_finished()
        self._record_finished()

    def close(self) -> None:
        self.wait()
        self._manager.close()


def _compare_shapes(step: int, folder: str, item: str, saved: dict[str, Any], wanted: dict[str, Any]) -> None:
    """Raises `CheckpointMismatch` naming the first differences between saved and wanted {key: shape}."""
    what = {"params": "trainable arrays", "opt_state": "optimizer-state arrays", "train": "loop-state arrays"}[item]
    missing, extra = sorted(set(wanted) - set(saved)), sorted(set(saved) - set(wanted))
    shapes = [
        f"{k}: saved {tuple(saved[k].shape)}, model {tuple(wanted[k].shape)}"
        for k in sorted(set(saved) & set(wanted))
        if tuple(getattr(saved[k], "shape", ())) != tuple(getattr(wanted[k], "shape", ()))
    ]
    if not (missing or extra or shapes):
        return
    parts = []
    if missing or extra:
        parts.append(f"it holds {len(saved)} {what}, this run has {len(wanted)}")
        if missing:
            parts.append("not in the checkpoint: " + ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else ""))
        if extra:
            parts.append("only in the checkpoint: " + ", ".join(extra[:3]) + (" ..." if len(extra) > 3 else ""))
    if shapes:
        parts.append("; ".join(shapes[:3]) + (f" (+{len(shapes) - 3} more)" if len(shapes) > 3 else ""))
    raise CheckpointMismatch(
        f"checkpoint {folder} was written for another model, trainable set or optimizer ({'; '.join(parts)}). "
        "Use a new train.run_dir for this config, or train.checkpoint.resume=false to start over in this one."
    )


def _abstract(x: Any) -> Any:
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    if isinstance(x, np.ndarray):
        return jax.ShapeDtypeStruct(x.shape, x.dtype)
    return x
