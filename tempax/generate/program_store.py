"""Compiled generation programs kept on disk, so that a later process skips tracing and lowering as well as
compiling: JAX's persistent cache skips only XLA's compilation, and tracing and lowering a 30-layer model is most
of what a second `tempax generate` spends before its first token. `tempax generate` and `tempax chat` use it in
place of JAX's cache (`TEMPAX_PROGRAMS_DIR`, set by `tempax.runtime.process.compilation_cache_env`); one process
on one device only. `ProgramStore` says what the key holds and how files are read and written.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import re
import tempfile
from typing import Any

import jax

from tempax.runtime.caches import jax_cache_in_use

PROGRAMS_DIR_ENV = "TEMPAX_PROGRAMS_DIR"
_FORMAT = 1  # bump when the file layout changes
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


@functools.cache
def source_digest() -> str:
    """sha256 over tempax's Python source files (paths and contents), computed once per process."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()


def _describe(value: Any) -> str:
    """A text that is the same in every process for the same value (function reprs lose their addresses)."""
    return _ADDRESS.sub("", repr(value))


def _aval(x: Any) -> str:
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is None or dtype is None:  # a Python scalar: jit gives it a weak type
        return f"py:{type(x).__name__}"
    return f"{tuple(shape)}:{dtype}:{getattr(x, 'weak_type', False)}"


def program_key(name: str, static: dict[str, Any], dynamic: tuple) -> str:
    """The key of program `name` called with `static` arguments (graph definitions, specs, ints) and `dynamic`
    ones (pytrees of arrays): everything that decides the compiled code, without tracing."""
    leaves, tree = jax.tree.flatten(dynamic)
    device = jax.devices()[0]
    parts = [
        f"format {_FORMAT}", name, source_digest(), jax.__version__, jax.lib.__version__,
        os.environ.get("XLA_FLAGS", ""), device.platform, device.device_kind,
        str(jax.config.jax_enable_x64), str(jax.config.jax_default_matmul_precision),
        *(f"{k}={_describe(static[k])}" for k in sorted(static)),
        _describe(tree), *(_aval(x) for x in leaves),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def single_device(dynamic: tuple) -> bool:
    """True where the store may serve a call: one process, and every argument either left uncommitted or placed
    on the default device, which is where a stored program is loaded to run (a mesh, or another device, compiles
    as before)."""
    if jax.process_count() != 1:
        return False
    default = {jax.devices()[0]}
    return not any(isinstance(x, jax.Array) and x.committed and x.sharding.device_set != default
                   for x in jax.tree.leaves(dynamic))


def decode_key(prefill_key: str) -> str:
    """The key of the decode program that follows a prefill: prefill's key fixes its spec, layout and the decode
    state's shapes, so it is derived rather than traced."""
    return program_key("decode", {"prefill": prefill_key}, ())


class ProgramStore:
    """Serialised executables in one folder, one file per key.

    The compiled executable itself is kept (`jax.experimental.serialize_executable`) under a key computed without
    tracing (`program_key`): the program's name and static arguments, the model's graph definition, the shapes,
    dtypes and tree of its array arguments, the jax and jaxlib versions, the XLA flags, the device kind and a
    digest of tempax's own source (any change to the package makes a new key, so an edited model never runs a
    stale program). A file that cannot be read or loaded (truncated, written by another jaxlib) is ignored and
    replaced; a file that cannot be written (a full disk) costs only the next start's time; files are written
    whole and renamed into place. Loading a stored executable runs machine code from the file, so the folder must
    be as trusted as the Python environment itself (it is the user's own cache folder)."""

    def __init__(self, folder: str):
        self.folder = folder

    def _path(self, key: str) -> str:
        return os.path.join(self.folder, f"{key}.program")

    def load(self, key: str) -> Any | None:
        """The stored `jax.stages.Compiled` for `key`, or None (absent, unreadable or not loadable here)."""
        from jax.experimental.serialize_executable import deserialize_and_load

        try:
            with open(self._path(key), "rb") as f:
                payload, in_tree, out_tree = pickle.load(f)
            # On the default device, where the program was compiled (a host may show several CPU devices).
            return deserialize_and_load(payload, in_tree, out_tree, execution_devices=[jax.devices()[0]])
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001 - a damaged or foreign file is a cache miss; the caller compiles
            return None

    def save(self, key: str, compiled: Any) -> bool:
        """Writes `compiled` under `key` (whole, then renamed into place); False where it could not be written
        or the executable cannot be serialised."""
        from jax.experimental.serialize_executable import serialize

        try:
            blob = pickle.dumps(serialize(compiled), protocol=pickle.HIGHEST_PROTOCOL)
            os.makedirs(self.folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".partial-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(blob)
                os.replace(tmp, self._path(key))
            except BaseException:
                os.unlink(tmp)
                raise
            return True
        except Exception:  # noqa: BLE001 - a full disk or an unserialisable program: the next start compiles
            return False


def default_store() -> ProgramStore | None:
    """The store `TEMPAX_PROGRAMS_DIR` names, or None when it is unset or empty, or when JAX's persistent
    compilation cache is on in this process: a program compiled where JAX has loaded executables from that cache
    can serialise without some of its functions (XLA:CPU: "Function ... not found" when the stored copy runs)."""
    folder = os.environ.get(PROGRAMS_DIR_ENV, "")
    if not folder or jax_cache_in_use():
        return None
    return ProgramStore(folder)
