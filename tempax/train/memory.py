"""A memory plan for one train step, made from the config and batch shape before anything is compiled.

Per device, in bytes (P = all parameters, P_t = trainable ones, N = tokens of one micro-batch on one device,
a = bytes per activation element: 4 in fp32, 2 in bf16):

    weights       trainable P_t * 4 (float32 master) + frozen (P - P_t) * their storage bytes (4, 2, or ~0.56 for
                  NF4 QLoRA) + frozen arrays of other models (a distillation teacher), divided over the
                  parameter-sharding axes (fsdp x tensor)
    compute copy  bf16 only: a 2-byte copy of the weights used by the matmuls
    gradients     P_t * 4, plus an accumulator of the same size with more than one micro-batch
    optimizer     Adam/AdamW: 2 moments, P_t * 8; SGD with momentum: P_t * 4
    activations   what the backward pass keeps per layer and token (L layers, D hidden, I mlp, n/k heads, h
                  head dim, T sequence length):
                    none: (5 D + 3 n h + 4 k h + 4 I) a + n T (4 + a)      every intermediate, incl. attention
                    dots: (2 D + n h + 2 k h + 2 I) a                        matmul outputs only
                    full: D a                                                the layer input only
                  times N L, plus (remat only) one layer fully materialised while it is recomputed; times the
                  number of decoder trunks the loss runs (2 for PPO with a separate critic)
    logits        N V (4 + 4 + 4): float32 logits, their softmax and their gradient (V split over tensor)
    held          models kept beside the trained one and never trained (a reward model, a frozen reference
                  copy), as given in bytes

The sum gets 10% for XLA temporaries and fragmentation. The numbers are estimates meant to be within ~25% (the
benchmark checks them against measured peaks); what matters is naming the setting that brings a run under the
limit before minutes of compilation: a smaller micro-batch, remat, LoRA, or QLoRA.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Iterable

from tempax.errors import ConfigError, TempaxError
from tempax.models.config import ModelConfig
from tempax.runtime.host_memory import available_memory, resident_memory

GiB = 2**30
OVERHEAD = 1.10


class OutOfMemoryPlan(TempaxError):
    """The memory plan says the step cannot fit on the device."""


@dataclass(frozen=True)
class MemoryPlan:
    """Estimated peak bytes per device of one train step, by category (see the module docstring)."""

    weights: int
    compute_copy: int
    gradients: int
    optimizer: int
    activations: int
    logits: int
    micro_batch_size: int
    remat: str
    capacity: int | None = None
    held: int = 0

    @property
    def total(self) -> int:
        parts = (self.weights + self.compute_copy + self.gradients + self.optimizer + self.activations + self.logits
                 + self.held)
        return int(parts * OVERHEAD)

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.total <= self.capacity

    def format(self) -> str:
        def g(x: int) -> str:
            return f"{x / GiB:.2f} GiB" if x >= GiB // 4 else f"{x / 2**20:.1f} MiB"

        cap = f" of {g(self.capacity)} available" if self.capacity else ""
        return (
            f"memory plan per device (micro-batch {self.micro_batch_size}, remat {self.remat}): "
            f"weights {g(self.weights)}, compute copy {g(self.compute_copy)}, gradients {g(self.gradients)}, "
            f"optimizer {g(self.optimizer)}, activations {g(self.activations)}, logits {g(self.logits)}"
            + (f", held models {g(self.held)}" if self.held else "") + "; "
            f"total ~{g(self.total)} (incl. 10% overhead){cap}"
        )


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
    # Frozen arrays inside the trained module but outside `model`'s own parameters (a distillation teacher held next to the student), in bytes.
    extra_frozen_bytes: int = 0


def plan_memory(p: PlanInputs, capacity: int | None = None) -> MemoryPlan:
    """The `MemoryPlan` for `p` (see the module docstring for the formulas)."""
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
    a = 2 if p.precision == "bf16" else 4

    weights = (trainable * 4 + frozen * frozen_bytes + p.extra_frozen_bytes) / shard
    compute_copy = total_params * 2 / shard if p.precision == "bf16" else 0
    grads = trainable * 4 / shard * (2 if p.num_micro_batches > 1 else 1)
    if p.optimizer in ("adamw", "adam"):
        opt = trainable * 8 / shard
    else:
        opt = trainable * 4 / shard if p.momentum else 0

    tokens = math.ceil(p.micro_batch_size / dp) * p.seq_len
    d, i, n, k, h, t = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                        p.seq_len)
    full_layer = (5 * d + (3 * n * h + 4 * k * h) / tp + 4 * i / tp) * a + (n / tp) * t * (4 + a)
    if p.remat == "none":
        per_layer, extra = full_layer, 0.0
    elif p.remat == "dots":
        per_layer, extra = (2 * d + (n * h + 2 * k * h + 2 * i) / tp) * a, full_layer
    else:
        per_layer, extra = d * a, full_layer
    activations = tokens * (per_layer * cfg.num_layers + extra + 4 * d * a) * p.trunks
    rows = math.ceil(p.micro_batch_size / dp)
    logit_tokens = tokens if p.loss_chunk_len is None else rows * min(p.seq_len, p.loss_chunk_len)
    logits = logit_tokens * cfg.vocab_size / tp * 12
    return MemoryPlan(
        weights=int(weights), compute_copy=int(compute_copy), gradients=int(grads), optimizer=int(opt),
        activations=int(activations), logits=int(logits), micro_batch_size=p.micro_batch_size, remat=p.remat,
        capacity=capacity, held=int(p.held_bytes),
    )


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


def suggest_fixes(p: PlanInputs, batch_size: int, capacity: int) -> list[str]:
    """Settings that would make the step fit, cheapest in speed first."""
    out: list[str] = []
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
    if p.trainable_params is None:
        lora_params = lora_param_estimate(p.model, rank=16)
        q = replace(p, trainable_params=lora_params, remat="full" if p.remat == "none" else p.remat)
        if plan_memory(q, capacity).fits:
            out.append("LoRA (add a `lora:` section, e.g. lora.rank=16) with train.remat=full")
        q = replace(q, frozen_bytes_per_param=0.5625)
        if plan_memory(q, capacity).fits:
            out.append("QLoRA (lora.quantize=nf4)")
    if p.precision == "fp32":
        q = replace(p, precision="bf16")
        if plan_memory(q, capacity).fits:
            out.append("train.precision=bf16")
    return out


def lora_param_estimate(cfg: ModelConfig, rank: int) -> int:
    """Trainable parameters of rank-`rank` LoRA on every attention and MLP projection: r (in + out) per matrix. A
    mixture of experts adapts its attention (and a shared expert's projections) only: its routed experts and
    router take no adapters (`tempax.models.lora.target_paths`)."""
    d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    i = cfg.intermediate_size if cfg.moe is None else cfg.moe.shared_expert_intermediate_size
    mlp = 2 * (d + i) + (i + d) if i else 0
    per_layer = rank * ((d + n * h) * 2 + (d + k * h) * 2 + mlp)
    return per_layer * cfg.num_layers


def check_fits(p: PlanInputs, batch_size: int, capacity: int | None) -> MemoryPlan:
    """The plan; raises `OutOfMemoryPlan` naming settings that fit when it does not."""
    plan = plan_memory(p, capacity)
    if plan.fits or capacity is None:
        return plan
    fixes = suggest_fixes(p, batch_size, capacity)
    hint = ("; it would fit with: " + "; or ".join(fixes)) if fixes else (
        "; nothing tried fits (smaller micro-batch, remat, LoRA/QLoRA): use more devices (mesh.fsdp) or a "
        "shorter seq_len"
    )
    raise OutOfMemoryPlan(
        f"the train step needs about {plan.total / GiB:.2f} GiB per device but only {capacity / GiB:.2f} GiB is "
        f"available ({plan.format()}){hint}."
    )


def validate_micro_batch(batch_size: int, micro: int, data_parallel: int) -> None:
    if micro % data_parallel:
        raise ConfigError(
            f"micro_batch_size={micro} (or batch_size) must be a multiple of the data-parallel devices "
            f"(mesh data x fsdp = {data_parallel}); valid: {micro_batch_candidates(batch_size, data_parallel)}"
        )
