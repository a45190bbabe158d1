"""A memory plan for one train step, made from the config and batch shape before anything is compiled, and the
choice of where the training state lives (`train.memory`).

What matters is naming the setting that brings a run under the device's limit before minutes of compilation:
where the state lives, a smaller micro-batch, remat, LoRA, or QLoRA. `MemoryPlan` gives the categories and their
formulas, `choose_memory` the setting `train.memory=auto` takes, `check_fits` and `explain_out_of_memory` the
message that names the settings that would fit.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

from tempax.errors import ConfigError, DeviceOutOfMemory, TempaxError
from tempax.models.config import ModelConfig
from tempax.runtime.host_memory import available_memory, resident_memory

GiB = 2**30
# The plan must stay this far under the capacity to count as fitting: the allocator's fragmentation and what
# the runtime holds besides the step's buffers.
HEADROOM = 0.05
# The working set of one layer's backward pass, as a multiple of that layer's residuals without remat: the
# layer's recomputed residuals (under remat) plus the cotangents of its intermediates. Fitted to XLA:CPU's
# memory_analysis of the SFT step, as the loss's peak (8 bytes a logit, 16 a hidden unit) is (the whole plan
# within 15% of XLA's figure: tests/train/test_memory.py).
WORKING_SET = {"none": 0.8, "dots": 1.0, "full": 1.6}
LOGIT_BYTES = 8  # float32 logits and their gradient
HIDDEN_BYTES = 16  # the loss's float32 hidden states and their gradient, and the head's input

# The `train.memory` settings, fastest first (`TrainConfig.memory` says what each keeps where): bf16_moments is
# `tempax.train.optim`'s, the two offloading settings stream the state through the device (`tempax.train.offload`).
MEMORY_SETTINGS = ("device", "bf16_moments", "offload_optimizer", "offload_optimizer_and_master")
MEMORY_CHOICES = ("auto", *MEMORY_SETTINGS)
_MEANING = {
    "device": "float32 master weights and optimizer state on the device",
    "bf16_moments": "the optimizer's moments in bfloat16 on the device",
    "offload_optimizer": "the optimizer's state in host memory, streamed through the device for the update",
    "offload_optimizer_and_master": "the optimizer's state and the float32 master weights in host memory",
}


class OutOfMemoryPlan(TempaxError):
    """The memory plan says the step cannot fit on the device."""


@dataclass(frozen=True)
class MemoryPlan:
    """Estimated peak bytes per device of one train step, by category.

    Per device, in bytes (P_t = trainable parameters, P_f = frozen ones, N = tokens of one micro-batch on one
    device, L layers, V vocabulary):

        weights       the float32 master P_t * 4 + the frozen weights at their storage bytes (4, 2, or ~0.56 for
                      NF4 QLoRA) + frozen arrays of other models (a distillation teacher), divided over the
                      parameter-sharding axes (fsdp x tensor). With the master in host memory it is not on the
                      device: it streams through in pieces, for the cast to the compute copy and for the update
        compute copy  the weights the forward pass reads in bf16, P_t * 2: with the master on the host, the device
                      copy (P_t * 4 under fp32); on an accelerator under bf16 also with the master on the device,
                      where XLA casts each float32 weight whole before the layer loop and keeps the copy for the
                      backward pass
        gradients     P_t * 4 (P_t * 2 for gradients of a bf16 device copy), plus a float32 accumulator with more
                      than one micro-batch
        optimizer     on the device: Adam's 2 moments P_t * 8 (float32) or P_t * 4 (bf16_moments, plus the
                      largest parameter's moments in float32 while its update computes them), SGD with momentum
                      half of that; offloaded: the state of the largest piece while it streams through (its
                      moments, and its master with the master on the host; `largest_piece`: one layer of a stacked
                      weight, a block of rows of the embedding), twice on an accelerator: one piece's new state
                      going back overlaps the next one's coming in
        activations   what autodiff keeps for the backward pass, traced, not guessed: the residuals of the model's
                      forward pass (`residual_bytes`: jax.vjp under `jax.eval_shape`, with this remat and
                      precision, on this backend's ops; of the trained model as built, adapters and all, when the
                      plan has its `residual_probe`, else of a plain decoder of its config, L layers), times the
                      decoder trunks the loss runs (2 for PPO with a separate critic)
        backward      the larger of the two peaks of the backward pass, which never coexist: the loss's,
                      N_l V 8 + N D 16 (float32 logits and their gradient, V split over tensor, for the N_l
                      positions whose logits the loss holds at once: all, a chunk, or none), and one layer's,
                      N x WORKING_SET[remat] x that layer's residuals without remat (the layer recomputed, and the
                      cotangents of its intermediates)
        held          models kept beside the trained one and never trained (a reward model, a frozen reference
                      copy), as given in bytes

    On XLA:CPU bfloat16 residuals count as float32: its compiler keeps bfloat16 elementwise work in float32. The
    total is meant to be XLA's own figure for the compiled step (arguments + outputs + temporaries - aliased,
    `compiled.memory_analysis()`): tests/train/test_memory.py holds it within 15% of that on XLA:CPU, and
    `bench/memory_plan.py` prints both for the Llama-3.2-1B shape.

    `host` is what the setting keeps in host memory instead (not counted in `total`)."""

    weights: int
    compute_copy: int
    gradients: int
    optimizer: int
    activations: int
    backward: int
    micro_batch_size: int
    remat: str
    capacity: int | None = None
    held: int = 0
    memory: str = "device"
    host: int = 0

    @property
    def total(self) -> int:
        return int(self.weights + self.compute_copy + self.gradients + self.optimizer + self.activations
                   + self.backward + self.held)

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.total <= self.capacity * (1 - HEADROOM)

    def format(self) -> str:
        cap = f" of {_size(self.capacity)} available" if self.capacity else ""
        host = f", in host memory {_size(self.host)}" if self.host else ""
        return (
            f"memory plan per device (micro-batch {self.micro_batch_size}, remat {self.remat}, memory {self.memory}): "
            f"weights {_size(self.weights)}, "
            + (f"compute copy {_size(self.compute_copy)}, " if self.compute_copy else "")
            + f"gradients {_size(self.gradients)}, optimizer {_size(self.optimizer)}, activations "
            f"{_size(self.activations)}, backward pass {_size(self.backward)}"
            + (f", held models {_size(self.held)}" if self.held else "") + host + "; "
            f"total ~{_size(self.total)}{cap}"
        )


def _size(x: int | float) -> str:
    return f"{x / GiB:.2f} GiB" if x >= GiB // 4 else f"{x / 2**20:.1f} MiB"


@dataclass(frozen=True)
class PlanInputs:
    """What the plan depends on. `mesh_shape` maps 'data'/'fsdp'/'tensor' to sizes."""

    model: ModelConfig
    micro_batch_size: int
    seq_len: int
    num_micro_batches: int = 1
    trainable_params: int | None = None  # None: every parameter (full fine-tuning)
    precision: str = "fp32"
    remat: str = "none"
    optimizer: str = "adamw"
    momentum: float = 0.0
    frozen_bytes_per_param: float | None = None  # None: the model's param_dtype; 0.5625 for NF4 blocks of 64
    mesh_shape: tuple[tuple[str, int], ...] = ()
    # The loss materialises logits for this many positions per row at a time; None: whole rows; 0: no vocabulary
    # logits at all (a reward model's scalar head).
    loss_chunk_len: int | None = None
    held_bytes: int = 0  # models held beside the trained one and outside it (reward model, frozen reference)
    trunks: int = 1  # decoder stacks the loss runs forward and backward (2: a policy and a separate critic)
    # Frozen arrays inside the trained module but outside `model`'s own parameters (a distillation teacher held
    # next to the student), in bytes.
    extra_frozen_bytes: int = 0
    memory: str = "device"  # one of MEMORY_SETTINGS (`choose_memory` resolves "auto")
    # Host memory is separate from the device's (an accelerator); False on XLA:CPU, where offloading saves nothing.
    host_is_separate: bool = True
    # Whose ops the activations are traced with ("cpu", "tpu", "gpu", "plain": `tempax.ops.BACKENDS`); None: this
    # process's backend.
    backend: str | None = None
    # remat -> bytes per token the trained model's backward pass keeps (`residual_probe`: the model as built, with
    # its adapters); None: a plain decoder of `model` is traced (`decoder_residuals`).
    probe: Callable[[str], float] | None = None


def train_plan_inputs(
    train: Any, model: ModelConfig, *, trainable_params: int | None, frozen_bytes_per_param: float | None = None,
    extra_frozen_bytes: int = 0, tokens_per_row: int | None = None, logit_positions: int | None = None,
    held_bytes: int = 0, trunks: int = 1, mesh_shape: tuple[tuple[str, int], ...] = (), remat: str | None = None,
    host_is_separate: bool = True, backend: str | None = None,
) -> PlanInputs:
    """The `PlanInputs` of a run of the `TrainConfig` `train` on `model` (the trainer's and `tempax validate`'s):
    its micro-batch, seq_len (or the rows' own `tokens_per_row`), precision, remat (`remat`, else the model's),
    optimizer and `train.memory` (auto: device, until `choose_memory` settles it)."""
    micro = train.micro_batch_size or train.batch_size
    return PlanInputs(
        model=model, micro_batch_size=micro, seq_len=tokens_per_row or train.seq_len,
        num_micro_batches=train.batch_size // micro, trainable_params=trainable_params, precision=train.precision,
        remat=remat or getattr(model, "remat", "none"), optimizer=train.optimizer.name,
        momentum=train.optimizer.momentum, frozen_bytes_per_param=frozen_bytes_per_param, mesh_shape=mesh_shape,
        loss_chunk_len=logit_positions, held_bytes=held_bytes, trunks=trunks, extra_frozen_bytes=extra_frozen_bytes,
        memory="device" if train.memory == "auto" else train.memory, host_is_separate=host_is_separate,
        backend=backend,
    )


def plan_memory(p: PlanInputs, capacity: int | None = None) -> MemoryPlan:
    """The `MemoryPlan` for `p` (`MemoryPlan` gives the formulas)."""
    if p.memory not in MEMORY_SETTINGS:
        raise ConfigError(f"train.memory={p.memory!r} is not a setting; use one of {', '.join(MEMORY_CHOICES)}")
    cfg = p.model
    mesh = dict(p.mesh_shape)
    dp = mesh.get("data", 1) * mesh.get("fsdp", 1)
    shard = mesh.get("fsdp", 1) * mesh.get("tensor", 1)
    tp = mesh.get("tensor", 1)
    total_params = cfg.num_params()
    trainable = total_params if p.trainable_params is None else p.trainable_params
    frozen = max(total_params - trainable, 0) if p.trainable_params is not None else 0
    storage = 2 if cfg.param_dtype == "bfloat16" else 4
    frozen_bytes = storage if p.frozen_bytes_per_param is None else p.frozen_bytes_per_param
    moments = {"adamw": 2, "adam": 2}.get(p.optimizer, 1 if p.momentum else 0)
    moment_bytes = 2 if p.memory == "bf16_moments" else 4
    optimizer_on_host = p.memory in ("offload_optimizer", "offload_optimizer_and_master")
    master_on_host = p.memory == "offload_optimizer_and_master"
    compute_bytes = 2 if p.precision == "bf16" else 4

    # Where the device has its own memory (an accelerator), the offloaded state streams through it in pieces
    # (`tempax.train.offload.stream_pieces`), one piece's new state going back while the next one's comes in;
    # the master never comes in whole. Under bf16 with the master on the device XLA casts each float32 weight
    # whole before the layer loop and keeps that copy through the backward pass. (A v5e's compiled step:
    # `bench/memory_plan_v5e.py`.)
    accelerator = p.host_is_separate
    in_flight = 2 if accelerator else 1
    frozen_weights = frozen * frozen_bytes + p.extra_frozen_bytes
    master = trainable * 4
    weights = (frozen_weights + (0 if master_on_host else master)) / shard
    compute_copy = trainable * 2 / shard if p.precision == "bf16" and accelerator else 0
    if master_on_host:
        compute_copy = trainable * compute_bytes / shard
    grad_bytes = compute_bytes if master_on_host else 4
    grads = trainable * grad_bytes / shard + (trainable * 4 / shard if p.num_micro_batches > 1 else 0)
    state = trainable * moments * moment_bytes / shard
    largest = largest_param(cfg) if trainable == total_params else trainable
    piece = largest_piece(cfg) if trainable == total_params else trainable
    streaming = min(piece, trainable) / shard * (moments * moment_bytes + (4 if master_on_host else 0)) * in_flight
    optimizer = streaming if optimizer_on_host else state
    if p.memory == "bf16_moments":  # the largest parameter's moments in float32 while its update computes them
        optimizer += min(largest, trainable) / shard * moments * 4
    host = (state if optimizer_on_host else 0) + (master / shard if master_on_host else 0)
    if not accelerator:  # host memory is the device's: what lives "on the host" counts all the same
        optimizer += state if optimizer_on_host else 0
        weights += master / shard if master_on_host else 0
        host = 0

    rows = math.ceil(p.micro_batch_size / dp)
    tokens = rows * p.seq_len
    unkept = decoder_residuals(cfg, p.seq_len, "none", p.precision, p.backend)
    if p.probe is not None:
        kept_per_token = p.probe(p.remat)
    else:
        kept = decoder_residuals(cfg, p.seq_len, p.remat, p.precision, p.backend)
        kept_per_token = kept.per_layer * cfg.num_layers + kept.other
    activations = tokens * kept_per_token / tp * p.trunks
    logit_tokens = tokens if p.loss_chunk_len is None else rows * min(p.seq_len, p.loss_chunk_len)
    loss_peak = logit_tokens * cfg.vocab_size / tp * LOGIT_BYTES + tokens * cfg.hidden_size * HIDDEN_BYTES
    layer_peak = tokens * WORKING_SET[p.remat] * unkept.per_layer / tp
    return MemoryPlan(
        weights=int(weights), compute_copy=int(compute_copy), gradients=int(grads), optimizer=int(optimizer),
        activations=int(activations), backward=int(max(loss_peak, layer_peak)), micro_batch_size=p.micro_batch_size,
        remat=p.remat,
        capacity=capacity, held=int(p.held_bytes), memory=p.memory, host=int(host),
    )


@dataclass(frozen=True)
class Residuals:
    """Bytes per token that autodiff keeps for the backward pass of a decoder: `per_layer` for each layer, `other`
    for the rest (the embedding's output, the final norm, attention masks shared by the layers)."""

    per_layer: float
    other: float


def decoder_residuals(cfg: ModelConfig, seq_len: int, remat: str, precision: str,
                      backend: str | None = None) -> Residuals:
    """What the backward pass of `cfg`'s decoder keeps per token, traced: the residuals of `jax.vjp` of its
    forward pass over one row of `seq_len` tokens, under `jax.eval_shape` (no memory, no compilation), with one
    layer and with two; their difference is one layer's. The trace runs the ops `backend` runs (None: this
    process's; `tempax.ops.backend`), so the figure follows the code rather than a formula about it. Residuals
    that are the parameters themselves (a weight the backward pass multiplies with) are not counted: they are
    the weights. On XLA:CPU bfloat16 residuals count 4 bytes (its compiler keeps them in float32)."""
    from tempax import ops  # deferred, as in `_trace_residuals`

    return _residuals(cfg, seq_len, remat, precision, backend or ops.backend())


@functools.lru_cache(maxsize=256)
def _residuals(cfg: ModelConfig, seq_len: int, remat: str, precision: str, backend: str) -> Residuals:
    from tempax import ops

    def trace(layers: int) -> int:
        with ops.use_backend(backend) if backend != ops.backend() else contextlib.nullcontext():
            return _trace_residuals(cfg, layers, seq_len, remat, precision, backend)

    # A hybrid stack (Qwen3.5) is traced a block of its unlike layers at a time: one block and two, the
    # difference over the block's length is its mean layer's.
    # Gemma 4's full layers of their own shape likewise, a block of its layer pattern at a time.
    block = (len(cfg.layer_block()) if cfg.linear_attention_layers
             else len(cfg.kind_block()) if cfg.full_attention_differs else 1)
    one, two = _outside_any_mesh(trace, block), _outside_any_mesh(trace, 2 * block)
    per_layer = max(two - one, 0) / block
    return Residuals(per_layer=per_layer / seq_len, other=max(one - per_layer * block, 0) / seq_len)


def _outside_any_mesh(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` with no mesh, JAX's or tempax's (`tempax.parallel.rules.use_mesh`): a model built from its
    config gets no shardings from the mesh of a training run the plan is made in (its logical axis names are not
    that mesh's axes)."""
    import jax

    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())):
        return contextvars.Context().run(fn, *args)


def _trace_residuals(cfg: ModelConfig, layers: int, seq_len: int, remat: str, precision: str, backend: str) -> int:
    # Deferred: the model code and JAX load only when a plan is made (`tempax validate` imports this module).
    from flax import nnx

    from tempax.models.decoder import Decoder

    shallow = cfg.replace(num_layers=layers, layer_types=cfg.layer_types[:layers],
                          nope_layers=tuple(i for i in cfg.nope_layers if i < layers),
                          linear_attention_layers=tuple(i for i in cfg.linear_attention_layers if i < layers),
                          kv_shared_layers=0, wide_shared_mlp=False)
    model = nnx.eval_shape(lambda: Decoder(shallow, rngs=nnx.Rngs(0)))
    return residual_bytes(model, nnx.Param, seq_len=seq_len, remat=remat, precision=precision, backend=backend)


def residual_bytes(model: Any, trainable: Any, *, seq_len: int, remat: str, precision: str, backend: str) -> int:
    """Bytes autodiff keeps for the backward pass of `model.hidden_states` over one row of `seq_len` tokens, with
    gradients for the `trainable` filter's parameters, `remat` and `precision` applied (`training_view`): the
    residuals of `jax.vjp` under `jax.eval_shape`, so nothing is computed or allocated (a model of shapes only
    does). Residuals that are the model's own variables (a weight the backward pass multiplies with), also as a
    scan over blocks of a layer pattern reads a stack ([groups, per_group, ...]), are not counted; with `backend` "cpu" bfloat16 residuals count 4 bytes (XLA:CPU keeps them in float32)."""
    import jax
    import jax.numpy as jnp

    from tempax.train.state import ModelParts, training_view

    parts, params = ModelParts.split(training_view(model, remat=remat, precision=precision), trainable)

    def forward(m: Any, tokens: jax.Array) -> jax.Array:
        hidden, _ = m.hidden_states(tokens)
        return jnp.sum(hidden.astype(jnp.float32))

    return kept_bytes(forward, parts, params, parts.rest, jax.ShapeDtypeStruct((1, seq_len), jnp.int32),
                      backend=backend)


def kept_bytes(fn: Callable[[Any, Any], Any], parts: Any, params: Any, rest: Any, inputs: Any, *,
               backend: str | None = None) -> int:
    """Bytes autodiff keeps for the backward pass of `fn(model, inputs)` (a scalar, or a tuple whose first item
    is) with respect to `params`, the model being `parts.merge(params, rest)`: the residuals of `jax.vjp` under
    `jax.eval_shape` (`params`, `rest` and `inputs` may be arrays or shapes), the model's own variables not
    counted (see `residual_bytes`)."""
    import collections

    import jax
    import jax.numpy as jnp

    if backend is None:
        from tempax import ops

        backend = ops.backend()
    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in params.items()}

    def scalar(p: Any, r: Any, x: Any) -> jax.Array:
        out = fn(parts.merge(p, r), x)
        return out[0] if isinstance(out, tuple) else out

    vjp = jax.eval_shape(lambda p, r, x: jax.vjp(lambda q: scalar(q, r, x), p)[1], shapes, rest, inputs)
    variables = [v for v in jax.tree.leaves((shapes, rest)) if hasattr(v, "shape") and hasattr(v, "dtype")]
    weights = collections.Counter((tuple(v.shape), jnp.dtype(v.dtype)) for v in variables)
    total = 0
    for leaf in jax.tree.leaves(vjp):
        key = (tuple(leaf.shape), jnp.dtype(leaf.dtype))
        # a stack's weights as the scan over blocks of a layer pattern reads them: [groups, per_group, ...]
        # (`Decoder._run_kind_blocks`), the same buffer
        grouped = None if leaf.ndim < 2 else ((leaf.shape[0] * leaf.shape[1], *leaf.shape[2:]), key[1])
        for seen in (key, grouped):
            if seen is not None and weights[seen] > 0:
                weights[seen] -= 1
                break
        else:
            itemsize = 4 if backend == "cpu" and key[1] == jnp.bfloat16 else key[1].itemsize
            total += math.prod(leaf.shape) * itemsize
    return total


def loss_probe(loss_fn: Callable[[Any, Any], Any], parts: Any, params: Any, rest: Any, batch: Any, *, tokens: int,
               p: PlanInputs) -> Callable[[str], float]:
    """`remat -> bytes per token` from what autodiff keeps for `loss_fn` itself on `batch` (one micro-batch of one
    device, shapes or arrays; `tokens` of its rows), with the model `parts.merge(params, rest)` under `p.remat`:
    exact for a loss whose rows are not one sequence (GRPO's prompt, then its completions against the prompt's
    cache). Another remat scales it by the ratio of a plain decoder's figures."""
    kept = _outside_any_mesh(lambda: kept_bytes(loss_fn, parts, params, rest, batch, backend=p.backend)) / tokens

    def per_token(remat: str) -> float:
        r = decoder_residuals(p.model, p.seq_len, remat, p.precision, p.backend)
        return r.per_layer * p.model.num_layers + r.other

    return lambda remat: kept if remat == p.remat else kept * per_token(remat) / max(per_token(p.remat), 1.0)


def residual_probe(model: Any, trainable: Any, *, seq_len: int, precision: str,
                   backend: str | None = None) -> Callable[[str], float]:
    """`remat -> bytes per token` that `model`'s backward pass keeps (`residual_bytes` over its whole depth,
    traced once per remat setting): the plan's activations for that model exactly as it is built (its adapters,
    a quantized base, experts), where a `PlanInputs` without a probe traces a plain decoder of its config."""
    from tempax import ops

    chosen = backend or ops.backend()
    seen: dict[str, float] = {}

    def probe(remat: str) -> float:
        if remat not in seen:
            with ops.use_backend(chosen) if chosen != ops.backend() else contextlib.nullcontext():
                seen[remat] = residual_bytes(model, trainable, seq_len=seq_len, remat=remat, precision=precision,
                                             backend=chosen) / seq_len
        return seen[remat]

    return probe


@functools.lru_cache(maxsize=64)
def largest_param(cfg: ModelConfig) -> int:
    """Elements of the largest parameter array of `cfg`'s decoder (a stacked layer weight, or the embedding)."""
    import jax
    from flax import nnx

    from tempax.models.weights import abstract_model

    model = _outside_any_mesh(abstract_model, cfg)
    return max(math.prod(v.shape) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))


def largest_piece(cfg: ModelConfig) -> int:
    """Elements of the largest piece of a parameter of `cfg`'s decoder that an offloaded update brings to the
    device at once (`tempax.train.offload.stream_pieces`: one layer of a stacked weight, a block of rows)."""
    import jax
    from flax import nnx

    from tempax.models.weights import abstract_model
    from tempax.train.offload import stream_pieces

    model = _outside_any_mesh(abstract_model, cfg)
    return max(math.prod(v.shape) // stream_pieces(v.shape) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))


def device_capacity(devices: Iterable[Any] | None = None) -> int | None:
    """Bytes one device can hold: the accelerator's limit, or on CPU the host memory available to this process
    divided by the local CPU devices (they share it). None when unknown."""
    import jax

    devices = list(jax.local_devices() if devices is None else devices)
    if not devices:
        return None
    dev = devices[0]
    if dev.platform != "cpu":
        try:
            stats = dev.memory_stats() or {}
        except Exception:  # some backends do not implement memory_stats
            stats = {}
        limit = stats.get("bytes_limit")
        return int(limit) if limit else None
    avail = available_memory()
    if avail is None:
        return None
    return int((avail + resident_memory()) / max(len(devices), 1))


def micro_batch_candidates(batch_size: int, data_parallel: int) -> list[int]:
    """Micro-batch sizes that divide the batch and spread evenly over the data-parallel devices, largest first."""
    return [m for m in range(batch_size, 0, -1) if batch_size % m == 0 and m % data_parallel == 0]


def largest_fitting_micro_batch(p: PlanInputs, batch_size: int, capacity: int) -> int | None:
    dp = dict(p.mesh_shape).get("data", 1) * dict(p.mesh_shape).get("fsdp", 1)
    for m in micro_batch_candidates(batch_size, dp):
        plan = plan_memory(replace(p, micro_batch_size=m, num_micro_batches=batch_size // m), capacity)
        if plan.fits:
            return m
    return None


def memory_settings(p: PlanInputs) -> tuple[str, ...]:
    """The `train.memory` settings worth trying for `p`, fastest first: offloading only where host memory is
    not the device's, and the master weights only when the device copy is smaller (bf16 compute)."""
    out = ["device"]
    if p.optimizer in ("adamw", "adam") or p.momentum:
        out.append("bf16_moments")
    if p.host_is_separate:
        out.append("offload_optimizer")
        if p.precision == "bf16":
            out.append("offload_optimizer_and_master")
    return tuple(out)


@dataclass(frozen=True)
class MemoryChoice:
    """What `choose_memory` settled: the setting, its plan, and the one line that says why."""

    setting: str
    plan: MemoryPlan
    reason: str


def choose_memory(p: PlanInputs, capacity: int | None, *, requested: str = "auto",
                  host_capacity: int | None = None) -> MemoryChoice:
    """`train.memory`: `requested` when it names a setting, else (auto) the fastest of `memory_settings(p)` whose
    plan fits `capacity` and whose part in host memory fits `host_capacity` (None: not checked), device when the
    capacity is unknown or nothing fits (`check_fits` then names fixes)."""
    if requested != "auto":
        if requested not in MEMORY_SETTINGS:
            raise ConfigError(f"train.memory={requested!r}: use one of {', '.join(MEMORY_CHOICES)}")
        plan = plan_memory(replace(p, memory=requested), capacity)
        return MemoryChoice(requested, plan, f"train.memory={requested}: {_MEANING[requested]} (as set)")
    first = plan_memory(replace(p, memory="device"), capacity)
    if capacity is None:
        return MemoryChoice("device", first, f"train.memory=auto chose device: {_MEANING['device']} (the device's "
                                             "capacity is unknown)")
    if first.fits:
        return MemoryChoice("device", first, f"train.memory=auto chose device: {_MEANING['device']} fits "
                                             f"(~{_size(first.total)} of {_size(capacity)})")
    for setting in memory_settings(p)[1:]:
        plan = plan_memory(replace(p, memory=setting), capacity)
        if plan.fits and (host_capacity is None or plan.host <= host_capacity * (1 - HEADROOM)):
            return MemoryChoice(setting, plan, (
                f"train.memory=auto chose {setting}: {_MEANING[setting]}; on the device the step needs "
                f"~{_size(plan.total)} of {_size(capacity)}, where with everything on the device it would need "
                f"~{_size(first.total)}"))
    return MemoryChoice("device", first, (
        f"train.memory=auto: no setting fits at micro-batch {p.micro_batch_size} and remat {p.remat} (with everything "
        f"on the device the step needs ~{_size(first.total)} of {_size(capacity)}); planned as device"))


def suggest_fixes(p: PlanInputs, batch_size: int, capacity: int) -> list[str]:
    """Settings that would make the step fit, cheapest in speed first."""
    out: list[str] = []
    for setting in memory_settings(p):
        if setting == p.memory or MEMORY_SETTINGS.index(setting) < MEMORY_SETTINGS.index(p.memory):
            continue
        if plan_memory(replace(p, memory=setting), capacity).fits:
            out.append(f"train.memory={setting}")
            break
    m = largest_fitting_micro_batch(p, batch_size, capacity)
    if m is not None and m < p.micro_batch_size:
        out.append(f"train.micro_batch_size={m} (gradient accumulation over {batch_size // m} passes)")
    for remat in ("dots", "full"):
        if remat == p.remat or (p.remat == "full" and remat == "dots"):
            continue
        q = replace(p, remat=remat)
        if plan_memory(q, capacity).fits:
            out.append(f"train.remat={remat}")
            break
        m = largest_fitting_micro_batch(q, batch_size, capacity)
        if m is not None:
            out.append(f"train.remat={remat} with train.micro_batch_size={m}")
            break
    if not out:  # nothing about the memory setting, micro-batch or remat alone: try them together
        for setting in memory_settings(p)[1:]:
            q = replace(p, memory=setting, remat="full")
            m = largest_fitting_micro_batch(q, batch_size, capacity)
            if m is not None:
                out.append(f"train.memory={setting} with train.remat=full and train.micro_batch_size={m}")
                break
    if p.trainable_params is None:
        out.extend(adapter_fixes(p, capacity))
    else:
        out.extend(lora_run_fixes(p, capacity))
    if p.precision == "fp32":
        q = replace(p, precision="bf16")
        if plan_memory(q, capacity).fits:
            out.append("train.precision=bf16")
    return out


NF4_BYTES_PER_PARAM = 0.5625  # QLoRA's base: 4-bit codes plus a float32 scale per block of 64 (4 / 8 + 4 / 64)
ATTENTION_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
LORA_RANK = 16  # the rank the plan's fixes and `tempax recommend` propose


@dataclass(frozen=True)
class AdapterParams:
    """Trainable parameters of LoRA on a decoder, by where the adapters sit (what the plan counts as P_t)."""

    projections: int  # `LoraLinear`s on attention, a dense MLP or a shared expert
    experts: int  # `LoraExperts`: each routed expert's own A and B
    router: int  # a mixture of experts' router (a `LoraLinear`)

    @property
    def total(self) -> int:
        return self.projections + self.experts + self.router

    def describe(self) -> str:
        """The count in words, e.g. 642.6M adapter parameters: 13.4M on projections, 629.1M on the routed
        experts."""
        parts = [f"{n / 1e6:.1f}M on {where}" for n, where in (
            (self.projections, "projections"), (self.experts, "the routed experts"), (self.router, "the router"))
            if n]
        return f"{self.total / 1e6:.1f}M adapter parameters" + (f": {', '.join(parts)}" if len(parts) > 1 else "")


@functools.lru_cache(maxsize=64)
def adapter_params(cfg: ModelConfig, rank: int, target_modules: tuple[str, ...] | None = None) -> AdapterParams:
    """The adapters rank-`rank` LoRA on `target_modules` (None: `tempax.models.lora.DEFAULT_TARGETS`) gives a
    decoder of `cfg`, counted from the layers LoRA itself selects (`tempax.models.lora.target_paths`, on a model of
    shapes only) and their shapes, L layers, E routed experts, hidden D, expert inner I:

        a linear layer [in, out] (attention, a dense or shared-expert MLP, the router [D, E])   L r (in + out)
        the routed experts' gate_up_proj (gate and up fused: one A [D, r], B [r, 2I] per expert)  L E r (D + 2I)
        the routed experts' down_proj (A [I, r], B [r, D] per expert)                              L E r (I + D)

    A layer adapted on some layers of the stack only (a regex over layer paths) still holds, trains and keeps
    optimizer state for A and B of every layer (zeros where its mask is 0), so it counts L layers. On a mixture of
    experts LoRA's default targets (gate_proj, up_proj, down_proj among them) adapt the routed experts too."""
    # Deferred: the model code and JAX load only when a plan is made (`tempax validate` imports this module).
    from tempax.models.lora import DEFAULT_TARGETS, LoraConfig, target_paths
    from tempax.models.weights import abstract_model, stacked_path

    lora = LoraConfig(rank=rank, target_modules=DEFAULT_TARGETS if target_modules is None else tuple(target_modules))
    model = _outside_any_mesh(abstract_model, cfg)
    counts = {"projections": 0, "experts": 0, "router": 0}
    # One stacked module per selected per-layer path ("layers", i, ...): the layer index dropped (a hybrid model's
    # linear-attention layers are their own stack, "linear_layers").
    for path in sorted({stacked_path(p, cfg)[0] for p in target_paths(model, lora)}, key=str):
        node = model
        for key in path[:-1]:
            node = getattr(node, key)
        if path[-2] == "experts":
            layers, experts, d, i = node.gate_proj.shape  # [L, E, D, I]
            counts["experts"] += layers * experts * rank * (d + 2 * i if path[-1] == "gate_up_proj" else i + d)
        else:
            layers, n_in, n_out = getattr(node, path[-1]).kernel.shape  # [L, in, out]
            counts["router" if path[-2:] == ("mlp", "gate") else "projections"] += layers * rank * (n_in + n_out)
    return AdapterParams(**counts)


def with_adapters(p: PlanInputs, adapters: int, *, base_bytes_per_param: float | None = None) -> PlanInputs:
    """`p` for LoRA: `adapters` trainable parameters beside the whole frozen base of `p.model` at
    `base_bytes_per_param` (None: its param_dtype; `NF4_BYTES_PER_PARAM` for QLoRA). The plan counts
    num_params - P_t frozen parameters, so the bytes per parameter are scaled to keep the base whole:
    num_params x bytes / (num_params - P_t)."""
    total = p.model.num_params()
    per_param = base_bytes_per_param
    if per_param is None:
        per_param = 2 if p.model.param_dtype == "bfloat16" else 4
    return replace(p, trainable_params=adapters,
                   frozen_bytes_per_param=per_param * total / max(total - adapters, 1))


def lora_choices(cfg: ModelConfig) -> list[tuple[tuple[str, ...] | None, str]]:
    """(target_modules, what they adapt) of the LoRA the plan's fixes and `tempax recommend` propose, most adapted
    first: LoRA's default targets, and on a mixture of experts (whose default targets adapt its routed experts, by
    far the most adapter parameters) the attention projections alone."""
    if cfg.moe is None:
        return [(None, "the attention and MLP projections")]
    return [(None, "the attention projections and the routed experts"), (ATTENTION_TARGETS, "the attention "
             "projections only")]


def adapter_fixes(p: PlanInputs, capacity: int) -> list[str]:
    """The LoRA and QLoRA settings under which a full fine-tune `p` would fit `capacity`, with full remat (or
    `p`'s): for each, the first of `lora_choices` that fits, with its adapter parameters."""
    out = []
    q = replace(p, remat="full" if p.remat == "none" else p.remat, memory="device")
    for quantized in (False, True):
        for targets, what in lora_choices(p.model):
            count = adapter_params(p.model, LORA_RANK, targets)
            plan = plan_memory(with_adapters(q, count.total, base_bytes_per_param=NF4_BYTES_PER_PARAM if quantized
                                             else None), capacity)
            if not plan.fits:
                continue
            setting = "" if targets is None else f", lora.target_modules=[{', '.join(targets)}]"
            name = ("QLoRA (lora.quantize_base=nf4" if quantized else "LoRA (add a `lora:` section, e.g. "
                    f"lora.rank={LORA_RANK}") + setting
            out.append(f"{name}; on {what}, {count.describe()}) with train.remat={q.remat}")
            break
    return out


def lora_run_fixes(p: PlanInputs, capacity: int) -> list[str]:
    """For a LoRA run `p` that does not fit `capacity`: the first of its adapters over a 4-bit base (QLoRA, when
    the base is not quantized yet) and, on a mixture of experts, rank-`LORA_RANK` adapters on the attention
    projections only (whose adapters are a small part of the routed experts'), over the run's base and then a
    4-bit one, that fits, with full remat (or `p`'s)."""
    total = p.model.num_params()
    # The run's base bytes per parameter of the whole model (`with_adapters` scaled them by num_params / (num_params
    # - P_t)); None: its param_dtype.
    own_base = (None if p.frozen_bytes_per_param is None
                else p.frozen_bytes_per_param * (total - p.trainable_params) / total)
    quantized = own_base is not None and own_base <= NF4_BYTES_PER_PARAM
    q = replace(p, remat="full" if p.remat == "none" else p.remat, memory="device")
    options: list[tuple[int, float | None, str]] = []
    if not quantized:
        options.append((p.trainable_params, NF4_BYTES_PER_PARAM, "lora.quantize_base=nf4 (QLoRA: the frozen base "
                                                                 "in 4 bits, the same adapters)"))
    if p.model.moe is not None:
        attention = adapter_params(p.model, LORA_RANK, ATTENTION_TARGETS)
        if attention.total < p.trainable_params:
            targets = f"lora.target_modules=[{', '.join(ATTENTION_TARGETS)}]"
            what = f"on the attention projections only, {attention.describe()} at rank {LORA_RANK}"
            options.append((attention.total, own_base, f"{targets} ({what})"))
            if not quantized:
                options.append((attention.total, NF4_BYTES_PER_PARAM, f"lora.quantize_base=nf4 with {targets} "
                                                                      f"(QLoRA {what})"))
    for adapters, base, setting in options:
        if plan_memory(with_adapters(q, adapters, base_bytes_per_param=base), capacity).fits:
            return [f"{setting} with train.remat={q.remat}"]
    return []


def not_fitting_message(plan: MemoryPlan, fixes: list[str], capacity: int, *, what: str) -> str:
    """One message: what needs how much, the plan, and the settings that would fit."""
    hint = ("; it would fit with: " + "; or ".join(fixes)) if fixes else (
        "; nothing tried fits (train.memory, a smaller micro-batch, remat, LoRA/QLoRA): use more devices "
        "(mesh.fsdp) or a shorter seq_len"
    )
    return (f"{what} about {plan.total / GiB:.2f} GiB per device but only {capacity / GiB:.2f} GiB is available "
            f"({plan.format()}){hint}.")


def check_fits(p: PlanInputs, batch_size: int, capacity: int | None) -> MemoryPlan:
    """The plan; raises `OutOfMemoryPlan` naming settings that fit when it does not."""
    plan = plan_memory(p, capacity)
    if plan.fits or capacity is None:
        return plan
    fixes = suggest_fixes(p, batch_size, capacity)
    raise OutOfMemoryPlan(not_fitting_message(plan, fixes, capacity, what="the train step needs"))


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def xla_bytes_needed(message: str) -> int | None:
    """The bytes XLA says a program needed, from its out-of-memory message ("Used 27.53G of 15.75G hbm"), or None
    when it does not say."""
    import re

    found = re.search(r"Used ([0-9.]+)([KMGT]?)i?B? of ([0-9.]+)([KMGT]?)", message)
    if not found:
        return None
    return int(float(found.group(1)) * _UNITS[found.group(2)])


def explain_out_of_memory(error: BaseException, p: PlanInputs, batch_size: int, capacity: int | None, *,
                          what: str = "the train step") -> DeviceOutOfMemory:
    """XLA's out-of-memory `error` for the step `p` plans, as one message: XLA's own line, the plan, and the
    settings that would fit. The plan under-counted this program, so the settings are sized by XLA's figure when
    its message gives one (each plan scaled by XLA's figure over this plan's total), else with 15% more room."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    plan = plan_memory(p, capacity)
    needed = xla_bytes_needed(str(error))
    scale = max(needed / plan.total, 1.0) if needed and plan.total else 1.15
    fixes = suggest_fixes(p, batch_size, int(capacity / scale)) if capacity else []
    hint = ("; it would fit with: " + "; or ".join(fixes)) if fixes else (
        "; nothing tried fits (train.memory, a smaller micro-batch, remat, LoRA/QLoRA): use more devices "
        "(mesh.fsdp) or a shorter seq_len")
    return DeviceOutOfMemory(f"the device ran out of memory for {what} ({first}); {plan.format()}{hint}.")


def validate_micro_batch(batch_size: int, micro: int, data_parallel: int) -> None:
    if micro % data_parallel:
        raise ConfigError(
            f"micro_batch_size={micro} (or batch_size) must be a multiple of the data-parallel devices "
            f"(mesh data x fsdp = {data_parallel}); valid: {micro_batch_candidates(batch_size, data_parallel)}"
        )
