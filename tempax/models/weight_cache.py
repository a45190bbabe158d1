"""GGUF weights kept dequantised on disk, so a second load of the same file skips the dequantisation (with
llama.cpp's q/k permutation undone and the linears transposed, the largest part of a warm `tempax generate`'s time
to its first token: `docs/measurements/performance-history.md`, "Start-up"). The `tempax` command turns it on
(`TEMPAX_WEIGHTS_DIR`, `$TEMPAX_CACHE/weights`); `TEMPAX_WEIGHT_CACHE=0` turns it off, and models over
`TEMPAX_WEIGHT_CACHE_MAX_GIB` (default 4) are not cached: the disk is worth more than the seconds. An entry is
keyed so that an edited file or loader never reads a stale one (`entry_dir`) and written so that an interrupted
run never reads half of one (`store`). Its config is a pickle, so the folder must be as trusted as the Python
environment (it is the user's own cache folder).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import shutil
import tempfile
import warnings
from typing import Any

import jax
import numpy as np
from flax import nnx

from tempax.models.config import ModelConfig
from tempax.models.decoder import Decoder, as_dtype
from tempax.models.weights import param_table

WEIGHTS_DIR_ENV = "TEMPAX_WEIGHTS_DIR"
MAX_GIB_ENV = "TEMPAX_WEIGHT_CACHE_MAX_GIB"
DEFAULT_MAX_GIB = 4.0
_INDEX = "index.json"
_CONFIG = "config.pickle"
_DATA = "params.bin"
_VERSION = "1"


def cache_dir() -> str | None:
    """The folder `TEMPAX_WEIGHTS_DIR` names, or None when it is unset or empty (the cache is off)."""
    return os.environ.get(WEIGHTS_DIR_ENV) or None


@functools.cache
def _code_digest() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256(_VERSION.encode())
    for name in ("gguf_io.py", "weights.py", "weight_cache.py", "config.py"):
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def entry_dir(root: str, gguf_path: str | os.PathLike, variant: str) -> str:
    """The entry folder for one GGUF file loaded one way (`variant`: the dtypes asked for); a changed, moved or
    re-loaded-by-new-code file gets a new one: the key holds the file's absolute path, size and modification
    time, the dtypes and a digest of the loading code (`gguf_io.py`, `weights.py`, `config.py`, this file)."""
    path = os.path.abspath(os.fspath(gguf_path))
    st = os.stat(path)
    key = hashlib.sha256(
        f"{st.st_size}|{st.st_mtime_ns}|{variant}|{_code_digest()}".encode()
    ).hexdigest()[:16]
    return os.path.join(root, f"{_file_prefix(path)}{key}")


def _file_prefix(path: str) -> str:
    """The part of an entry's name shared by every entry of one GGUF path: its name and a digest of the path."""
    stem = os.path.splitext(os.path.basename(path))[0]
    return f"{stem}-{hashlib.sha256(path.encode()).hexdigest()[:8]}-"


def _params(model: Decoder) -> list[tuple[str, nnx.Variable]]:
    return [("/".join(str(p) for p in path), var) for path, var in param_table(model).items()]


def cached_config(folder: str) -> ModelConfig | None:
    """The model config an entry was stored with, or None (no entry, or an unreadable one)."""
    try:
        with open(os.path.join(folder, _CONFIG), "rb") as f:
            cfg = pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - any unreadable pickle is a miss; the GGUF file is read instead
        return None
    return cfg if isinstance(cfg, ModelConfig) else None


def fill_from_cache(model: Decoder, folder: str) -> bool:
    """Fills an abstract `model` from an entry; False (and the entry removed) when it is missing, incomplete or
    does not match the model's parameters, so the caller reads the GGUF instead."""
    index_path = os.path.join(folder, _INDEX)
    if not os.path.isfile(index_path):
        return False
    try:
        with open(index_path) as f:
            index = json.load(f)
        entries = index["params"]
        params = _params(model)
        dtype = as_dtype(model.config.param_dtype)
        if [name for name, _ in params] != [e["name"] for e in entries]:
            raise ValueError("the parameter names differ from the model's")
        data_path = os.path.join(folder, _DATA)
        size = os.path.getsize(data_path)
        if size != index["bytes"]:
            raise ValueError(f"{_DATA} holds {size} bytes, the index says {index['bytes']}")
        for (name, var), e in zip(params, entries):
            if tuple(e["shape"]) != tuple(var.shape) or np.dtype(e["dtype"]) != np.dtype(dtype):
                raise ValueError(f"{name}: {e['dtype']}{e['shape']}, the model wants {np.dtype(dtype)}{var.shape}")
        values = []
        # Read one array at a time (not a map of the whole file, whose pages would count in the process's
        # resident memory beside the copies: `docs/measurements/memory.md`); all are checked before any is set.
        with open(data_path, "rb") as f:
            for e in entries:
                count = int(np.prod(e["shape"], dtype=np.int64))
                f.seek(e["offset"])
                array = np.fromfile(f, dtype=np.dtype(e["dtype"]), count=count)
                if array.size != count:
                    raise ValueError(f"{_DATA} ends inside {e['name']}")
                values.append(jax.device_put(array.reshape(e["shape"])))  # a copy, half jnp.asarray's time
        for (_, var), value in zip(params, values):
            var.set_value(value)
        return True
    except (OSError, ValueError, KeyError, TypeError) as e:
        warnings.warn(f"the cached weights in {folder} are unusable ({e}); reading the GGUF file again",
                      stacklevel=2)
        shutil.rmtree(folder, ignore_errors=True)
        return False


def _max_bytes() -> float:
    try:
        return float(os.environ.get(MAX_GIB_ENV, DEFAULT_MAX_GIB)) * 2**30
    except ValueError:
        warnings.warn(f"{MAX_GIB_ENV}={os.environ[MAX_GIB_ENV]!r} is not a number; using {DEFAULT_MAX_GIB}",
                      stacklevel=3)
        return DEFAULT_MAX_GIB * 2**30


def store(model: Decoder, folder: str) -> bool:
    """Writes the model's parameters as an entry at `folder` (atomically) and removes the older entries of the
    same file; False when the model is over the size limit or the write failed (with a warning: a full disk
    costs only the speed-up). The parameters, in tempax's own layout and dtype, go to one raw file beside a JSON
    index and the model's config, so a later load reads neither the GGUF header nor its tensors and copies each
    parameter straight into its array; it is written to a temporary folder and renamed into place, the index
    last, so an interrupted or concurrent run never reads half an entry (a damaged entry is removed and the GGUF
    read again)."""
    params = _params(model)
    entries: list[dict[str, Any]] = []
    offset = 0
    for name, var in params:
        nbytes = int(np.prod(var.shape, dtype=np.int64)) * np.dtype(var.dtype).itemsize
        entries.append({"name": name, "shape": list(var.shape), "dtype": np.dtype(var.dtype).name, "offset": offset})
        offset += nbytes
    if offset > _max_bytes():
        return False
    parent = os.path.dirname(folder)
    tmp = None
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
        with open(os.path.join(tmp, _DATA), "wb") as f:  # the arrays back to back, in `entries`' order
            for _, var in params:
                f.write(np.ascontiguousarray(np.asarray(var[...])).tobytes())
        with open(os.path.join(tmp, _CONFIG), "wb") as f:
            pickle.dump(model.config, f, protocol=pickle.HIGHEST_PROTOCOL)
        with open(os.path.join(tmp, _INDEX), "w") as f:  # written last: its presence marks a whole entry
            json.dump({"bytes": offset, "params": entries}, f)
        try:
            os.replace(tmp, folder)
        except OSError:  # another process stored the same entry first; its copy is as good
            shutil.rmtree(tmp, ignore_errors=True)
            return os.path.isfile(os.path.join(folder, _INDEX))
    except OSError as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        warnings.warn(f"could not cache the dequantised weights under {parent}: {e}; the next load reads the "
                      "GGUF file again", stacklevel=2)
        return False
    prefix = os.path.basename(folder).rsplit("-", 1)[0] + "-"
    for other in os.listdir(parent):
        if other.startswith(prefix) and other != os.path.basename(folder) and not other.startswith(".tmp-"):
            shutil.rmtree(os.path.join(parent, other), ignore_errors=True)
    return True
