"""Orbax checkpoints of a training run: everything needed to continue it exactly.

One folder per saved step under `<run_dir>/checkpoints`; `Checkpointer` says what each holds, how its files are
recorded and checked so that damage is found before anything is read, and `Checkpointer.save` what a failed save
leaves behind.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import glob
import json
import logging
import os
import re
import shutil
import sys
import time
import zlib
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp

from tempax.errors import CheckpointError
from tempax.parallel.process import is_writer
from tempax.train.state import TrainState
from tempax.train.storage import StorageError, describe_write_failure, write_atomic

ITEMS = ("params", "opt_state", "train", "data", "meta")
ARRAY_ITEMS = ("params", "opt_state", "train")  # StandardSave: `_METADATA` + an OCDBT store
JSON_ITEMS = ("data", "meta")  # JsonSave: one `metadata` file
DAMAGED_DIR = "damaged_checkpoints"
FILES_RECORD = "tempax_files.json"  # {"files": {relative path: size}, "crc32": {relative path: CRC-32}}
_READ_BLOCK = 8 << 20  # checksums read files in blocks of this many bytes


class DamagedCheckpoint(CheckpointError):
    """A checkpoint folder whose files are missing, truncated or unreadable.

    Attributes: step, path (the damaged file or folder), reason (one line).
    """

    def __init__(self, step: int, path: str, reason: str):
        self.step, self.path, self.reason = step, path, reason
        super().__init__(f"checkpoint step {step} is damaged: {path} {reason}")


class CheckpointMismatch(CheckpointError):
    """An intact checkpoint written for another model, trainable set or optimizer."""


class CheckpointSaveFailed(StorageError):
    """A checkpoint could not be written (disk full, file-size limit, I/O error); nothing of it was kept.

    Attributes: step (the one not saved), newest (the newest intact checkpoint's step, or None); exit status 4.
    """

    def __init__(self, message: str, step: int, newest: int | None):
        self.step, self.newest = step, newest
        super().__init__(message)


def file_crc32(path: str) -> int:
    """CRC-32 (zlib) of a whole file, read in blocks."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(_READ_BLOCK):
            crc = zlib.crc32(block, crc)
    return crc


class _OrbaxFailureFilter(logging.Filter):
    """Drops Orbax's error logs (with their tracebacks) and asyncio's reports of Orbax tasks: a failed save is
    reported once, by `CheckpointSaveFailed`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and "orbax" in record.pathname.replace(os.sep, "/").split("/"):
            return False
        return not (record.name == "asyncio" and "orbax" in record.getMessage())


_quiet = False


def _quiet_orbax_failures() -> None:
    """Installs `_OrbaxFailureFilter` and an unraisable-exception hook that drops asyncio's "Event loop is closed"
    from Orbax's finished event loops (once per process)."""
    global _quiet
    if _quiet:
        return
    _quiet = True
    for name in ("absl", "asyncio"):
        logging.getLogger(name).addFilter(_OrbaxFailureFilter())
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, RuntimeError) and "Event loop is closed" in str(unraisable.exc_value):
            return
        previous(unraisable)

    sys.unraisablehook = hook


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
    """Saves and restores `TrainState`s (plus data position) under `<run_dir>/checkpoints`.

    Layout (`<run_dir>/checkpoints/<step>/`, one folder per saved step; Orbax writes each into a temporary folder and
    renames it when complete, so a killed run never leaves a half-written checkpoint that looks valid):

        params/     the trainable arrays, keyed like the model ("layers.mlp.up_proj.kernel", one array for every layer):
                    every weight for full fine-tuning, only the adapters for LoRA/QLoRA (the base comes from the model
                    source). A checkpoint written before the decoder stacked its layers keys each layer on its own
                    ("layers.0.mlp.up_proj.kernel"); `restore` and `restore_params` read it and stack (`legacy_layers`).
        opt_state/  the optimizer state's leaves, keyed "000000", "000001"... in `jax.tree.leaves` order (optax
                    states are namedtuples; leaf order is stable for one optimizer config)
        train/      step, rng key data, bad_step
        data/       the data loader's `state()` (JSON), so batches continue where they stopped
        meta/       JSON: which parameters are trainable ("full" or "adapters") and the parameter keys

    Only the last `keep` checkpoints stay. Saving is asynchronous when `async_save` is on: arrays are copied to the
    host before `save` returns (the next step may donate them), and files are written in the background.

    Integrity: once Orbax has finished a checkpoint, the size and the CRC-32 of each of its files are recorded in
    `<step>/tempax_files.json` (Orbax 0.12's OCDBT stores keep no content checksums: a truncated data file is found only
    by TensorStore mid-read, and a flipped byte that keeps the size not at all). The record is computed in a background
    thread from the finished files (zlib's CRC-32 runs at well over a GB/s and releases the GIL), so saving is not
    slowed; `wait()` waits for it. Before anything is read, `verify(step)` checks the folder with Orbax's own records
    (the step is finalized, `_CHECKPOINT_METADATA` and every item's metadata file parse, the saved array shapes and keys
    match the model about to receive them) and against that record: every file present, of its size, with its checksum.
    A checkpoint without checksums (an older tempax's, or one whose record the kill came before) is read in full before
    it is trusted, with one line saying so, and its record is then written. A failure while reading the arrays (a
    truncated or missing data file: TensorStore's OUT_OF_RANGE / NOT_FOUND) becomes a `DamagedCheckpoint` naming the
    file. `restore_newest_intact` walks the steps newest first, says in one line which step it skipped and why, moves
    that folder to `<run_dir>/damaged_checkpoints/` (so the run can write that step again) and restores the newest
    intact one. A checkpoint of another shape is not damage: it raises `CheckpointMismatch` with the way out, before
    TensorStore is asked for a single byte.
    """

    def __init__(self, directory: str | os.PathLike, *, keep: int = 2, async_save: bool = True,
                 read_only: bool = False):
        """`read_only`: a reader of another run's checkpoints (export, generate from a run dir) creates nothing
        and leaves its temporary folders alone: that run may be writing one right now."""
        self.directory = os.path.abspath(os.fspath(directory))
        self._options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=not read_only, enable_async_checkpointing=async_save, save_interval_steps=1,
            # a run killed mid-write leaves a temporary folder; drop it on restart (Orbax's own read_only flag
            # logs three warnings for options it then ignores, so a reader just creates and cleans nothing)
            cleanup_tmp_directories=not read_only,
        )
        _quiet_orbax_failures()
        self._manager = self._open_manager()
        self._started: set[int] = set()  # steps whose (possibly still running) save was started by this object
        self._unrecorded: set[int] = set()  # started steps whose file record is not yet written
        self._pending: tuple[int, int] | None = None  # (step, bytes) of the save Orbax may still be writing
        self._recorder = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tempax-record")
        self._recording: list[concurrent.futures.Future] = []
        self._failed_leftovers: list[str] = []  # temporary folders of failed saves (glob patterns)

    def _open_manager(self) -> ocp.CheckpointManager:
        try:
            return ocp.CheckpointManager(self.directory, options=self._options, item_names=ITEMS)
        except OSError as e:
            raise StorageError(describe_write_failure("the checkpoint folder", e, directory=self.directory)
                               + "; free some space or point train.run_dir at a writable folder") from None

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

    def has_checksums(self, step: int) -> bool:
        """True when checkpoint `step` has a file record with content checksums (the class docstring)."""
        record = os.path.join(self.path(step), FILES_RECORD)
        try:
            return bool(_read_json(record).get("crc32"))
        except (OSError, ValueError, AttributeError):
            return False

    def _check_sizes(self, step: int, folder: str, items: tuple[str, ...]) -> None:
        record_path = os.path.join(folder, FILES_RECORD)
        if not os.path.isfile(record_path):
            return  # an older tempax's, or killed before the record: Orbax's checks, then a full read (restore)
        self._check_json(step, record_path)
        record = _read_json(record_path)
        crcs = record.get("crc32", {})
        for rel, size in sorted(record.get("files", {}).items()):
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
            if rel in crcs:
                try:
                    crc = file_crc32(path)
                except OSError as e:
                    raise DamagedCheckpoint(step, path, f"cannot be read ({e.strerror})") from None
                if crc != crcs[rel]:
                    raise DamagedCheckpoint(step, path, f"changed content since it was saved (CRC-32 {crcs[rel]:08x} "
                                                        f"when saved, {crc:08x} now; same size)")

    def _record_finished(self) -> None:
        """Starts writing FILES_RECORD (in the background) for each step this object saved that Orbax finished."""
        from etils import epath

        if not is_writer():  # every process wrote its shards; process 0 records the finished folder
            self._unrecorded.clear()
            return
        for step in sorted(self._unrecorded):
            folder = self.path(step)
            if not os.path.isdir(folder) or not ocp.path.step.is_checkpoint_finalized(epath.Path(folder)):
                continue
            self._unrecorded.discard(step)
            self._recording.append(self._recorder.submit(self._write_record, step))

    def _write_record(self, step: int) -> None:
        """Sizes and CRC-32s of every file of finished checkpoint `step`, written atomically. A folder Orbax deletes
        meanwhile (`keep`) gets no record; a failed write leaves none (the step is then read in full on resume)."""
        folder = self.path(step)
        files, crcs = {}, {}
        try:
            for root, _, names in os.walk(folder):
                for name in names:
                    full = os.path.join(root, name)
                    rel = os.path.relpath(full, folder)
                    if rel in (FILES_RECORD, FILES_RECORD + ".tmp"):
                        continue
                    files[rel], crcs[rel] = os.path.getsize(full), file_crc32(full)
            if os.path.isdir(folder):
                write_atomic(os.path.join(folder, FILES_RECORD),
                             json.dumps({"files": files, "crc32": crcs}, indent=0, sort_keys=True))
        except (OSError, StorageError):
            return

    def _wait_records(self) -> None:
        for future in self._recording:
            future.result()
        self._recording.clear()

    def _check_json(self, step: int, path: str) -> None:
        if not os.path.isfile(path):
            raise DamagedCheckpoint(step, path, "is missing")
        try:
            _read_json(path)
        except (OSError, ValueError) as e:
            raise DamagedCheckpoint(step, path, f"does not parse as JSON ({e})") from None

    def newest_intact(self) -> int | None:
        """The newest step that passes `verify` (checksums included; no arrays decoded), or None."""
        for step in sorted(self.all_steps(), reverse=True):
            try:
                self.verify(step)
            except CheckpointError:
                continue
            return step
        return None

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
        """Starts writing `state` as checkpoint `state.step`; returns the step. Refuses a non-finite state.

        A save that fails (a full disk, a file-size limit, an I/O error; in Orbax's background threads or in `save`
        itself) commits nothing: Orbax renames a step's folder into place only when every file is written, so the
        previous checkpoint stays the newest intact one, and the half-written temporary folder is removed here to give
        the space back. The failure becomes one `CheckpointSaveFailed` (exit status 4) saying which file, why, how much
        the save needed and how much was free, and what to do; Orbax's own error logs and tracebacks of that failure
        (its threads, asyncio's "Task exception was never retrieved" and "Event loop is closed") are kept from the
        console.
        """
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
        self._finish_pending()  # Orbax waits for the previous save anyway; then its files are final
        needed = sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(
            (state.params, state.opt_state, state.step, state.rng, state.bad_step)))
        self._pending = (step, needed)
        try:
            self._manager.save(step, args=args, force=True)
        except Exception as e:  # noqa: BLE001 - a synchronous save (or the start of an async one) failed
            self._save_failed(e)
        self._started.add(step)
        self._unrecorded.add(step)
        if not self._options.enable_async_checkpointing:
            self._finish_pending()  # a synchronous save is final already
        return step

    def _finish_pending(self) -> None:
        """Waits for Orbax's background write; its failure becomes `CheckpointSaveFailed`. Then records files."""
        try:
            self._manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - whatever Orbax's threads raised while writing
            self._save_failed(e)
        self._pending = None
        self._record_finished()

    def _save_failed(self, error: BaseException) -> None:
        """Drops what the failed save wrote, opens a fresh Orbax manager and raises `CheckpointSaveFailed`."""
        step, needed = self._pending or (-1, None)
        self._pending = None
        with contextlib.suppress(Exception):
            self._manager.close()
        leftovers = os.path.join(self.directory, f"{step}.orbax-checkpoint-tmp*")
        _remove_leftovers(leftovers)
        self._failed_leftovers.append(leftovers)  # checked again, until quiet, when the checkpointer closes
        self._started.discard(step)
        self._unrecorded.discard(step)
        self._manager = self._open_manager()
        self._wait_records()
        newest = self.newest_intact()
        kept = (f"checkpoint step {newest} is the newest intact one" if newest is not None
                else "there is no earlier checkpoint")
        failed = describe_write_failure(f"checkpoint step {step} was not saved", error, directory=self.directory,
                                        needed=needed)
        raise CheckpointSaveFailed(
            failed + f". Nothing of step {step} was kept and {kept}. Free some space (or raise the limit), then run the same "
            "command again to resume; train.checkpoint.on_save_error=retry keeps training and tries again at the "
            "next checkpoint.",
            step, newest,
        ) from None

    def restore(self, target: TrainState, step: int | None = None) -> tuple[TrainState, dict[str, Any], dict[str, Any]]:
        """Restores checkpoint `step` (default: latest) into arrays shaped and sharded like `target`.

        `target` may hold concrete arrays or `jax.ShapeDtypeStruct`s with shardings. Returns (state, data_state,
        meta).
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint found in {self.directory}")
        abstract = jax.tree.map(_abstract, target)
        layers = self._legacy_layers(step, dict(abstract.params))
        if layers:
            abstract = abstract.replace(params=unstack_layers(abstract.params, layers),
                                        opt_state=_map_param_dicts(abstract.opt_state, abstract.params,
                                                                   lambda d: unstack_layers(d, layers)))
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
        if layers:
            wanted = jax.tree.map(_abstract, target)
            state = state.replace(params=stack_layers(state.params, wanted.params),
                                  opt_state=_map_param_dicts(state.opt_state, abstract.params,
                                                             lambda d: stack_layers(d, wanted.params)))
        return state, dict(out["data"] or {}), dict(out["meta"] or {})

    def restore_params(self, abstract_params: dict[str, Any], step: int | None = None, *,
                       say: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Only the trainable arrays of a checkpoint (for export and evaluation). A checkpoint without checksums is
        read in full before it is trusted, after one line to `say`."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint found in {self.directory}")
        wanted = jax.tree.map(_abstract, abstract_params)
        layers = self._legacy_layers(step, dict(wanted))
        abstract = unstack_layers(wanted, layers) if layers else wanted
        if not self.has_checksums(step):
            if say is not None:
                say(_no_checksums_line(step))
            self._read_every_file(step, items=("params", "meta"))
        self.verify(step, {"params": abstract}, items=("params", "meta"))
        out = self._read(step, ocp.args.Composite(params=ocp.args.StandardRestore(abstract)))
        return stack_layers(dict(out["params"]), wanted) if layers else dict(out["params"])

    def _legacy_layers(self, step: int, wanted: dict[str, Any]) -> int:
        """The number of layers when checkpoint `step` keys each layer's arrays on its own (written before the
        decoder stacked its layers) where `wanted` holds them stacked; else 0."""
        from etils import epath

        stacked = [k for k in wanted if k.startswith("layers.")]
        if not stacked:
            return 0
        try:
            saved = dict(ocp.StandardCheckpointHandler().metadata(epath.Path(self.path(step), "params")).tree)
        except Exception:  # noqa: BLE001 - a damaged record is `verify`'s to name
            return 0
        layers = int(getattr(wanted[stacked[0]], "shape", (0,))[0])
        rest = stacked[0][len("layers."):]
        if layers and f"layers.0.{rest}" in saved and stacked[0] not in saved:
            return layers
        return 0

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
                unchecked = not self.has_checksums(step)
                if unchecked:
                    say(_no_checksums_line(step))
                    self._read_every_file(step)
                state, data_state, meta = self.restore(target, step)
                if unchecked and is_writer():
                    self._write_record(step)  # verified by the full read: trusted from now on
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

    def _read_every_file(self, step: int, items: tuple[str, ...] = ITEMS) -> None:
        """Reads every file of checkpoint `step` (of `items`) to its end, an I/O error being damage; the restore
        after it decodes every array, so a truncated or unreadable file is found before the state is used."""
        folder = self.path(step)
        for root, _, names in os.walk(folder):
            rel = os.path.relpath(root, folder)
            if rel != "." and rel.split(os.sep, 1)[0] not in items:
                continue
            for name in names:
                path = os.path.join(root, name)
                try:
                    file_crc32(path)
                except OSError as e:
                    raise DamagedCheckpoint(step, path, f"cannot be read ({e.strerror})") from None

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
        """Blocks until background writes (Orbax's and the file records) are finished; raises
        `CheckpointSaveFailed` when Orbax's failed."""
        self._finish_pending()
        self._wait_records()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            with contextlib.suppress(Exception):
                self._manager.close()
            self._recorder.shutdown(wait=True)
            for leftovers in self._failed_leftovers:
                _remove_leftovers(leftovers, settle=4)


def unstack_layers(params: dict[str, Any], layers: int) -> dict[str, Any]:
    """{key: abstract array} with each stacked "layers.<rest>" [L, ...] as L keys "layers.<i>.<rest>" [...]: the
    keys and shapes a checkpoint written before the decoder stacked its layers holds."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if not key.startswith("layers."):
            out[key] = value
            continue
        sharding = getattr(value, "sharding", None)
        if isinstance(sharding, jax.sharding.NamedSharding):
            sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*sharding.spec[1:]))
        for i in range(layers):
            out[f"layers.{i}.{key[len('layers.'):]}"] = jax.ShapeDtypeStruct(value.shape[1:], value.dtype,
                                                                              sharding=sharding)
    return out


def stack_layers(params: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `unstack_layers` on arrays: per-layer arrays stacked into `wanted`'s keys and placed with its
    shardings."""
    out: dict[str, Any] = {}
    for key, target in wanted.items():
        if not key.startswith("layers."):
            out[key] = params[key]
            continue
        rest = key[len("layers."):]
        value = np.stack([np.asarray(jax.device_get(params[f"layers.{i}.{rest}"])) for i in range(target.shape[0])])
        sharding = getattr(target, "sharding", None)
        out[key] = jax.device_put(value, sharding) if sharding is not None else jax.numpy.asarray(value)
    return out


def _map_param_dicts(tree: Any, params: dict[str, Any], fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """`tree` (an optimizer state) with `fn` applied to every dict in it keyed like `params` (Adam's moments)."""
    keys = set(params)
    is_params = lambda x: isinstance(x, dict) and set(x) == keys  # noqa: E731
    return jax.tree.map(lambda x: fn(x) if is_params(x) else x, tree, is_leaf=is_params)


def _no_checksums_line(step: int) -> str:
    return (f"checkpoint step {step} has no content checksums (an older tempax wrote it, or the run stopped before "
            "its record was written): reading it in full to verify it before it is trusted")


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


def _remove_leftovers(pattern: str, *, settle: int = 1, tries: int = 40, pause_s: float = 0.05) -> None:
    """Removes the folders matching `pattern` until `settle` checks in a row (`pause_s` apart) find none: after a
    failed save, array writes of the same save that were already under way can still create files in its
    temporary folder once `rmtree` has passed (seen in full-disk test runs beside another test process)."""
    quiet = 0
    for attempt in range(tries):
        leftovers = glob.glob(pattern)
        quiet = 0 if leftovers else quiet + 1
        if quiet >= settle:
            return
        for leftover in leftovers:
            shutil.rmtree(leftover, ignore_errors=True)
        time.sleep(pause_s)
