"""Optimizer state, and float32 master weights, in host memory: JAX memory kinds, streamed through the device for
the update (`train.memory=offload_optimizer` / `offload_optimizer_and_master`, chosen by `tempax.train.memory`).

A step whose state does not fit the device can fit when that state waits in host memory and comes in a piece at
a time for the update. `Placement` says what lives on the host, `host_state_shardings` puts it there and
`StreamedUpdate` moves it through the device inside the jitted step. Where the host's memory is the device's
(XLA:CPU) the moves compile to nothing, so the same program runs and gives the same numbers on a CPU; there it
saves nothing, and `train.memory=auto` does not choose it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding

from tempax.train.state import Params, TrainState, init_state

# Every array of the training state has a sharding, and every sharding a memory kind: "device" (the accelerator's
# own memory, the default) or "pinned_host" (the host's memory, which the accelerator reads and writes by DMA).
HOST = "pinned_host"
DEVICE = "device"


@dataclass(frozen=True)
class Placement:
    """Which parts of the training state live in host memory.

    offload_optimizer              Adam's moments (SGD's momentum) live on the host. The forward and backward pass
                                   never see them; the update brings them in one parameter at a time, updates
                                   that parameter, and sends them back before the next one comes in.
    offload_optimizer_and_master   the float32 master weights live on the host too. The step makes the weights
                                   the forward pass reads from them on the device, cast to the compute dtype
                                   (bfloat16 under train.precision=bf16), one parameter at a time; the gradients
                                   come out in that dtype, and the update brings each master weight in with its
                                   moments (ZeRO-Offload's split of the state, Ren et al. 2021, with the update
                                   on the accelerator rather than the host's CPU).

    Attributes:
      optimizer_on_host: the optimizer's per-parameter state (moments) lives in host memory.
      master_on_host: the trainable (float32 master) weights live in host memory too.
      compute_dtype: the dtype of the device copy the forward pass reads when the master is on the host
        (bfloat16 under bf16 precision; None keeps the master's dtype).
    """

    optimizer_on_host: bool = False
    master_on_host: bool = False
    compute_dtype: Any = None

    @property
    def offloaded(self) -> bool:
        return self.optimizer_on_host or self.master_on_host


def with_kind(shardings: Any, kind: str) -> Any:
    """Every sharding in the tree with memory kind `kind`."""
    return jax.tree.map(lambda s: s.with_memory_kind(kind), shardings,
                        is_leaf=lambda s: isinstance(s, jax.sharding.Sharding))


def host_state_shardings(
    shardings: TrainState, optimizer: optax.GradientTransformation, abstract: TrainState, placement: Placement
) -> TrainState:
    """`shardings` (the device shardings of a `TrainState`) with the parts `placement` offloads in host memory:
    the optimizer's per-parameter leaves and, with `master_on_host`, the params. Scalars (the step, update
    counts) stay on the device."""
    if not placement.offloaded:
        return shardings
    opt = shardings.opt_state
    if placement.optimizer_on_host:
        # As `tempax.train.state.state_shardings` places them: per-parameter leaves follow their parameter (here
        # in host memory), the rest is the step's own (replicated, on the device).
        opt = optax.tree_map_params(optimizer, lambda _, s: s, abstract.opt_state, with_kind(shardings.params, HOST),
                                    transform_non_params=lambda _: shardings.step)
    params = with_kind(shardings.params, HOST) if placement.master_on_host else shardings.params
    return shardings.replace(params=params, opt_state=opt)


def _is_param_dict(tree: Any, keys: frozenset[str]) -> bool:
    return isinstance(tree, dict) and bool(tree) and set(tree) <= keys


def select_params(tree: Any, names: tuple[str, ...], keys: frozenset[str]) -> Any:
    """The part of an optimizer state (or of a tree of its shardings) for the parameters `names`: every dict keyed
    by parameter names (moments, traces) cut down to `names`; everything else (counts, empty states) kept."""
    if _is_param_dict(tree, keys):
        return {n: tree[n] for n in names}
    if isinstance(tree, tuple):
        items = [select_params(t, names, keys) for t in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    return tree


def merge_params(parts: list[Any], keys: frozenset[str]) -> Any:
    """Inverse of `select_params` over parts that together name every parameter once (in their order); the
    leaves outside parameter dicts (update counts) are equal in every part and taken from the first."""
    first = parts[0]
    if _is_param_dict(first, keys):
        out: dict[str, Any] = {}
        for part in parts:
            out.update(part)
        return out
    if isinstance(first, tuple):
        items = [merge_params([p[i] for p in parts], keys) for i in range(len(first))]
        return type(first)(*items) if hasattr(first, "_fields") else type(first)(items)
    return first


@dataclass(frozen=True)
class StreamedUpdate:
    """The optimizer update of a step whose state is partly in host memory.

    The host-resident arrays move in the jitted step itself, with `jax.device_put` to a sharding of the other
    memory kind, which XLA compiles into transfers. The update streams one parameter at a time, a large one in
    blocks of rows (`stream_pieces`) that go through a loop (`_update_in_pieces`): XLA reorders straight-line code
    (it drops the optimization barriers that chain one parameter after the next when it schedules the transfers)
    but does not hoist a transfer out of a loop's iteration. The device copy of a host-resident master is made the
    same way, block by block into a buffer of the compute dtype (`device_params`). So beside the weights the
    forward pass reads and their gradients, the device holds about two pieces' state at once (one going back
    while the next comes in: what `tempax.train.memory` plans).

    An optimizer applied to a part of the parameters with the matching part of its state is exact because the
    optimizer after clipping is elementwise (`tempax.train.optim.optimizer_parts`); clipping by the norm of all
    gradients comes first, on the device, where the gradients are.

    Attributes:
      placement: what lives on the host.
      clip: global-norm clipping (`optimizer_parts`' first part), or None.
      update: the elementwise rest of the optimizer.
      param_device: per trainable key, the device sharding of the weight (and of its gradient).
      opt_device: the device shardings of the whole optimizer state.
      opt_host: the shardings the state lives in between steps (host kinds where offloaded).
    """

    placement: Placement
    clip: optax.GradientTransformation | None
    update: optax.GradientTransformation
    param_device: dict[str, NamedSharding]
    opt_device: Any
    opt_host: Any

    def init_state(self, params: Params, seed: int, shardings: TrainState) -> TrainState:
        """A fresh `TrainState` (as `tempax.train.state.init_state` makes it) whose optimizer state is created one
        parameter at a time straight into its shardings, so the device never holds all of it at once."""
        keys = frozenset(params)
        inner_host = self.opt_host[1] if self.clip is not None else self.opt_host
        parts = []
        for key, value in params.items():
            out = select_params(inner_host, (key,), keys)
            parts.append(jax.jit(lambda p, k=key: self.update.init({k: p}), out_shardings=out)(value))
        inner = merge_params(parts, keys)
        opt_state = inner if self.clip is None else (self.clip.init(params), inner)
        shell = jax.jit(lambda: init_state({}, optax.identity(), seed),
                        out_shardings=shardings.replace(params={}, opt_state=optax.EmptyState()))()
        return shell.replace(params=params, opt_state=opt_state)

    def device_params(self, params: Params) -> Params:
        """Inside jit: the weights the forward pass reads, on the device. With the master on the host, each one is
        brought in (after the previous one) and cast to the compute dtype, a large one piece by piece
        (`stream_pieces`); otherwise `params` itself."""
        if not self.placement.master_on_host:
            return params
        dtype = self.placement.compute_dtype
        out: Params = {}
        done = None
        for key, host in params.items():
            if done is not None:
                done, host = jax.lax.optimization_barrier((done, host))
            device = self.param_device[key]
            cast = dtype if dtype is not None and jnp.issubdtype(host.dtype, jnp.floating) else host.dtype
            count = stream_pieces(host.shape, device.spec)
            if count == 1:
                value = jax.device_put(host, device).astype(cast)
            else:
                rows = host.shape[0] // count

                def bring(buffer: jax.Array, i: jax.Array, host=host, device=device, cast=cast, rows=rows):
                    piece = jax.device_put(jax.lax.dynamic_slice_in_dim(host, i * rows, rows), device).astype(cast)
                    return jax.lax.dynamic_update_slice_in_dim(buffer, piece, i * rows, 0), None

                empty = jax.lax.with_sharding_constraint(jnp.zeros(host.shape, cast), device)
                value, _ = jax.lax.scan(bring, empty, jnp.arange(count))
            out[key] = done = value
        return out

    def apply(self, grads: Params, opt_state: Any, params: Params, ok: jax.Array) -> tuple[Params, Any]:
        """Inside jit: (new params, new optimizer state), one parameter at a time and a large parameter piece by
        piece (`stream_pieces`), each new value kept only when `ok` (a finite step), as the device-resident step
        keeps them."""
        if self.clip is not None:
            grads, _ = self.clip.update(grads, self.clip.init(grads))  # stateless: the norm of all gradients
            clip_state, inner = opt_state
        else:
            clip_state, inner = None, opt_state
        keys = frozenset(params)
        inner_device = self.opt_device[1] if self.clip is not None else self.opt_device
        inner_host = self.opt_host[1] if self.clip is not None else self.opt_host
        new_params: Params = {}
        new_states: list[Any] = []
        done = None
        for key in params:
            names = (key,)
            incoming = (select_params(inner, names, keys), params[key])
            if done is not None:  # parameter i + 1 comes in once parameter i's state has gone back
                done, incoming = jax.lax.optimization_barrier((done, incoming))
            shardings = (select_params(inner_device, names, keys), select_params(inner_host, names, keys))
            count = stream_pieces(params[key].shape, self.param_device[key].spec)
            if count == 1:
                new_master, new_state = self._update_piece(key, grads[key], *incoming, shardings, ok)
            else:
                new_master, new_state = self._update_in_pieces(key, grads[key], *incoming, shardings, ok, count)
            new_params[key] = new_master
            new_states.append(new_state)
            done = (new_master, new_state) if self.placement.master_on_host else new_state
        merged = merge_params(new_states, keys)
        return new_params, (merged if self.clip is None else (clip_state, merged))

    def _update_piece(self, key: str, grad: jax.Array, state: Any, master: jax.Array, shardings: tuple[Any, Any],
                      ok: jax.Array) -> tuple[jax.Array, Any]:
        """(new master, new state) of parameter `key` (or of rows of it: `grad`, `state`'s arrays and `master` cut
        alike), brought to the device, updated and, where they live on the host, sent back."""
        device, host = shardings
        master_on_host = self.placement.master_on_host
        state = jax.device_put(state, device)
        master = jax.device_put(master, self.param_device[key]) if master_on_host else master
        updates, new_state = self.update.update({key: grad}, state, {key: master})
        new_master = optax.apply_updates({key: master}, updates)[key]
        new_master = jnp.where(ok, new_master, master)
        new_state = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new_state, state)
        new_state = jax.device_put(new_state, host)
        if master_on_host:
            new_master = jax.device_put(new_master, self.param_device[key].with_memory_kind(HOST))
        return new_master, new_state

    def _update_in_pieces(self, key: str, grad: jax.Array, state: Any, master: jax.Array,
                          shardings: tuple[Any, Any], ok: jax.Array, count: int) -> tuple[jax.Array, Any]:
        """`_update_piece` over `count` equal blocks of rows (leading axis) in turn, in a loop: iteration i reads
        block i of the state and master the loop carries and writes its new values there, so block i + 1 comes
        in only after block i has gone back (a loop's iterations run in order; XLA does not hoist a transfer out
        of one as it reorders straight-line code). The same update as the whole parameter's up to float32
        rounding (it is elementwise; tests/train/test_offload.py compares within 1e-6), and a block keeps every
        axis (a stacked norm weight's block is still a matrix to the weight-decay mask). The update counts are
        the same in every block (each block starts from the step's old count); the loop returns the first's."""
        keys = frozenset((key,))
        rows = master.shape[0] // count

        def body(carry: tuple[Any, jax.Array], i: jax.Array) -> tuple[tuple[Any, jax.Array], Any]:
            state_all, master_all = carry
            cut = lambda x: jax.lax.dynamic_slice_in_dim(x, i * rows, rows)  # noqa: E731
            new_master, new_state = self._update_piece(key, cut(grad), _map_params(cut, state_all, keys),
                                                       cut(master_all), shardings, ok)
            put = lambda whole, part: jax.lax.dynamic_update_slice_in_dim(whole, part, i * rows, 0)  # noqa: E731
            state_all = _zip_params(put, state_all, new_state, keys)
            return (state_all, put(master_all, new_master)), _without_params(new_state, keys)

        (state, master), counts = jax.lax.scan(body, (state, master), jnp.arange(count))
        return master, _with_params(state, jax.tree.map(lambda c: c[0], counts), keys)


# The most elements of one parameter the update brings to the device at once: 2^24 elements, one layer of the
# Llama-3.2-1B shape's MLP kernel, so that a stacked weight streams one layer at a time (in float32, that piece
# and Adam's two moments and the master are four arrays of 2^26 bytes each).
PIECE_ELEMENTS = 2**24


def stream_pieces(shape: tuple[int, ...], spec: Any = ()) -> int:
    """How many blocks of rows (leading axis) a parameter of `shape` streams through the device in: the fewest that
    divide its leading axis into blocks of at most `PIECE_ELEMENTS` elements, else one row each (one layer of a
    weight stacked on the "layers" axis). 1 (whole) for a scalar, a parameter that small, or one whose leading
    axis is split over devices (`spec`, its PartitionSpec): cutting that axis would move data between devices."""
    if not shape or (len(spec) and spec[0] is not None):
        return 1
    size = math.prod(shape)
    for count in range(1, shape[0] + 1):
        if shape[0] % count == 0 and size // count <= PIECE_ELEMENTS:
            return count
    return shape[0]


def _zip_params(fn: Any, tree: Any, other: Any, keys: frozenset[str]) -> Any:
    """`tree` with every array in a dict keyed by parameter names (`select_params`) replaced by `fn(array, the
    array at the same place in other)`; everything else (update counts) kept from `tree`."""
    if _is_param_dict(tree, keys):
        return {n: jax.tree.map(fn, tree[n], other[n]) for n in tree}
    if isinstance(tree, tuple):
        items = [_zip_params(fn, t, o, keys) for t, o in zip(tree, other)]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    return tree


def _map_params(fn: Any, tree: Any, keys: frozenset[str]) -> Any:
    return _zip_params(lambda x, _: fn(x), tree, tree, keys)


def _without_params(tree: Any, keys: frozenset[str]) -> Any:
    """`tree` with its parameter dicts emptied: what is left are the leaves outside them (update counts)."""
    if _is_param_dict(tree, keys):
        return {}
    if isinstance(tree, tuple):
        items = [_without_params(t, keys) for t in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    return tree


def _with_params(params_from: Any, rest_from: Any, keys: frozenset[str]) -> Any:
    """Inverse of `_without_params`: the parameter dicts of `params_from`, the other leaves of `rest_from`."""
    if _is_param_dict(params_from, keys):
        return params_from
    if isinstance(params_from, tuple):
        items = [_with_params(p, r, keys) for p, r in zip(params_from, rest_from)]
        return type(params_from)(*items) if hasattr(params_from, "_fields") else type(params_from)(items)
    return rest_from
