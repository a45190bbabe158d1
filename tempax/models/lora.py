"""LoRA and QLoRA adapters for the tempax `Decoder`: apply, switch off, merge, save and load (PEFT layout).

`apply_lora` swaps each targeted projection for a `LoraLinear`, which adds a trainable low-rank update to the frozen
kernel (QLoRA: a base stored in 4-bit NormalFloat, `tempax.models.quant`), so fine-tuning trains and stores only the
adapters. `LoraLinear` holds the formula, the papers, where it differs from PEFT and why it is hand-written rather
than built on qwix.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tempax.errors import CheckpointError, ConfigError
from tempax.models.config import LAYER_STACKS
from tempax.models.decoder import Decoder, as_dtype
from tempax.models.fused import fused_projections
from tempax.models.moe import (EXPERT_KERNELS, QuantizedRoutedExperts, RoutedExperts, expert_lora_from_peft,
                               expert_lora_to_peft, not_recording_router_statistics, peft_moe_names)
from tempax.models.quant import QUANT_KINDS, QuantizedLinear
from tempax.models.weights import abstract_model, stacked_path
from tempax.ops import matmul
from tempax.ops.experts import ExpertAdapter
from tempax.parallel.process import host_array, is_writer
from tempax.models.hf_io import save_safetensors

DEFAULT_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

EXPERT_PARAMS: tuple[str, ...] = ("gate_up_proj", "down_proj")
"""A mixture of experts' adaptable expert parameters, as transformers 5 names them (`mlp.experts.gate_up_proj`, the
gate and up kernels fused, and `mlp.experts.down_proj`) and PEFT adapts them (`target_parameters`)."""

# Target names that also select an expert parameter or the router: the per-expert module names of the checkpoints
# (Qwen's gate_proj / up_proj / down_proj, Mixtral's w1 / w3 / w2) and gpt-oss's name for the router.
_EXPERT_ALIASES = {"gate_up_proj": ("gate_proj", "up_proj", "w1", "w3"), "down_proj": ("w2",)}
_ROUTER_ALIASES = ("router",)

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
_PEFT_PREFIX = "base_model.model."

lora_filter = nnx.LoRAParam
"""nnx filter selecting only adapter weights: `nnx.Optimizer(model, tx, wrt=lora_filter)`,
`nnx.value_and_grad(loss, argnums=nnx.DiffState(0, lora_filter))`."""


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters and, optionally, a quantized frozen base (QLoRA).

    Attributes:
      rank: r, the inner dimension of A [in, r] and B [r, out].
      alpha: the update is scaled by alpha / r.
      dropout: dropout rate on the adapter input (0 = none); active in `model.train()` mode.
      target_modules: which linear layers get adapters. Each pattern matches a layer whose name equals it
        ("q_proj"), or that `re.fullmatch`es its tempax path ("layers.3.self_attn.q_proj") or its Hugging Face
        name ("model.layers.3.self_attn.q_proj"). Every pattern must match at least one layer. On a mixture of
        experts, "gate_up_proj" (or "gate_proj" with "up_proj", Mixtral's "w1" with "w3") adapts the routed
        experts' gate and up kernels, "down_proj" ("w2") their down kernels, "experts" both (`LoraExperts`), and
        "gate" or "router" the router; paths such as "layers.3.mlp.experts.down_proj" select layers.
      quantize_base: None keeps the base weights as they are; "nf4" (QLoRA) or "int8" stores every attention and
        MLP projection kernel blockwise-quantized and frozen, whether or not it has adapters.
      block_size: weights per quantization block (one float32 absmax scale each); QLoRA uses 64.
    """

    rank: int = field(default=16, metadata={"help": "LoRA rank r (A is [in, r], B is [r, out])."})
    alpha: float = field(default=32.0, metadata={"help": "LoRA alpha; the update is scaled by alpha / rank."})
    dropout: float = field(default=0.0, metadata={"help": "Dropout rate on the adapter input; 0 disables it."})
    target_modules: tuple[str, ...] = field(
        default=DEFAULT_TARGETS,
        metadata={"help": "Layers to adapt: names (q_proj) or regexes over paths (layers\\.[0-3]\\..*q_proj)."},
    )
    quantize_base: Literal["nf4", "int8"] | None = field(
        default=None, metadata={"help": "Quantize the frozen base projections: null, nf4 (QLoRA) or int8."}
    )
    block_size: int = field(default=64, metadata={"help": "Weights per quantization block (QLoRA: 64)."})

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.rank <= 0:
            raise ConfigError(f"LoRA rank must be positive, got {self.rank}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"LoRA dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ConfigError("LoRA target_modules is empty; name at least one layer, e.g. [q_proj, v_proj]")
        for pattern in self.target_modules:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ConfigError(f"LoRA target_modules: {pattern!r} is not a valid regex ({e})") from e
        if self.quantize_base is not None and self.quantize_base not in QUANT_KINDS:
            raise ConfigError(
                f"LoRA quantize_base must be null or one of {', '.join(QUANT_KINDS)}, got {self.quantize_base!r}"
            )
        if self.block_size <= 0 or self.block_size % 2:
            raise ConfigError(f"LoRA block_size must be a positive even number, got {self.block_size}")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def apply(self, model: Decoder, *, rngs: nnx.Rngs) -> Decoder:
        """`apply_lora(model, self, rngs=rngs)`."""
        return apply_lora(model, self, rngs=rngs)


# --------------------------------------------------------------------------------------------------------------
class LoraLayerMask(nnx.Variable):
    """1.0 for the layers of a stack whose projection has an adapter, 0.0 for the others: present only when
    `target_modules` selects some layers of a projection and not others (a regex over layer paths). Frozen;
    not an `nnx.Param`."""


class LoraLinear(nnx.Module):
    """`base_layer(x) + (alpha / r) * dropout(x) @ A @ B`, a drop-in for the `nnx.Linear` it wraps.

    LoRA (Hu et al. 2021, arXiv:2106.09685) freezes a linear layer's kernel W [in, out] and learns a low-rank update:

        y = x W + b + (alpha / r) * dropout(x) A B,     A [in, r] random, B [r, out] zeros

    so at initialisation the model is exactly the base model. QLoRA (Dettmers et al. 2023, arXiv:2305.14314) stores
    the frozen W in 4-bit NormalFloat (see `tempax.models.quant`) and trains A, B in float32.

    A, B are stored float32; the adapter matmuls run in the layer's compute dtype, like the base matmul (PEFT
    computes them in the adapters' dtype and casts back).

    What we do differently from PEFT: A is initialised like PEFT's default (kaiming-uniform with a = sqrt(5), i.e.
    U(-1/sqrt(in), 1/sqrt(in))), but from JAX's random stream, so values differ; dropout follows `model.train()` /
    `model.eval()` (nnx's `deterministic` switch) and is on by default, as nnx.Dropout is.

    Why hand-written rather than qwix 0.1.8 (`qwix.LoraProvider` + `weight_qtype="nf4"`) on XLA:CPU with jax 0.10.2
    (the comparison's figures: `docs/measurements/memory.md`, "QLoRA against qwix"):
      * QLoRA memory: qwix stores NF4 codes as `jnp.uint4`, one byte per code on XLA:CPU, so its quantized
        projections take (8 + 0.5) / 16 of their bfloat16 bytes; the packed codes here take 4.5 / 16 (4.5 bits per
        weight).
      * qwix adapters attach only to a kernel qwix itself quantized (its `find_param` looks for `nnx.Param` or its
        own `WithAux`), so the packed NF4 base rules out qwix adapters, and keeping one adapter implementation for
        LoRA and QLoRA keeps disable / merge / save / load written once.
      * Speed and step memory: no difference beyond noise; both compute x W + ((x A) B) * alpha / r.
      * From qwix's source: its adapter dropout is always on (`nnx.Dropout(rate, deterministic=False)`, no eval
        mode), and its adapters take the base parameter dtype, so with float32 parameters and bfloat16 compute it
        adds a float32 delta to each bfloat16 matmul output, promoting the residual stream to float32.

    The decoder stacks its layers, so a projection and its adapters hold one value per layer on a leading axis
    (the decoder's scan hands each layer its own slice).

    Attributes:
      base_layer: the frozen `nnx.Linear` or `QuantizedLinear`.
      lora_a: [L, in, r] `nnx.LoRAParam`, float32, logical axes ("layers", kernel's input axis, "lora_rank").
      lora_b: [L, r, out] `nnx.LoRAParam`, float32, zeros at init.
      layer_mask: [L] `LoraLayerMask` when only some layers are adapted, else None.
      rank, alpha, scaling: static; scaling = alpha / rank.
      dropout: `nnx.Dropout` on the adapter input, or None.
      adapters_enabled: static switch; False computes `base_layer(x)` only (see `disable_adapters`).
    """

    def __init__(self, base_layer: nnx.Linear | QuantizedLinear, *, rank: int, alpha: float, dropout: float,
                 lora_a: jax.Array, layer_mask: np.ndarray | None, rngs: nnx.Rngs):
        if isinstance(base_layer, QuantizedLinear):
            n_out = base_layer.out_features
            names = base_layer.codes.get_metadata().get("out_sharding")
        else:
            n_out = base_layer.kernel.shape[-1]
            names = base_layer.kernel.get_metadata().get("out_sharding")
        layers_name, in_name, out_name = names if names else (None, None, None)
        with nnx.use_eager_sharding(False):
            self.lora_a = nnx.LoRAParam(lora_a, out_sharding=(layers_name, in_name, "lora_rank"))
            self.lora_b = nnx.LoRAParam(jnp.zeros((lora_a.shape[0], rank, n_out), jnp.float32),
                                        out_sharding=(layers_name, "lora_rank", out_name))
            self.layer_mask = (None if layer_mask is None else
                               LoraLayerMask(jnp.asarray(layer_mask, jnp.float32), out_sharding=(layers_name,)))
        self.base_layer = base_layer
        self.rank = rank
        self.alpha = float(alpha)
        self.scaling = float(alpha) / rank
        self.dropout = nnx.Dropout(dropout, rngs=rngs) if dropout > 0 else None
        self.dtype = base_layer.dtype or jnp.float32
        self.adapters_enabled = True

    def adapted_layers(self) -> list[int]:
        """Indices of the layers whose projection has an adapter."""
        if self.layer_mask is None:
            return list(range(self.lora_a.shape[0]))
        return [i for i, on in enumerate(np.asarray(jax.device_get(self.layer_mask[...]))) if on]

    def delta_kernel(self) -> jax.Array:
        """(alpha / r) * A @ B in float32, [L, in, out] over the stack (or [in, out] for one layer inside the
        decoder's scan): what merging adds to the kernel."""
        a, b = self.lora_a[...].astype(jnp.float32), self.lora_b[...].astype(jnp.float32)
        delta = self.scaling * jnp.matmul(a, b)
        if self.layer_mask is not None:
            delta = delta * self.layer_mask[...][..., None, None]
        return delta

    def adapter(self, x: jax.Array) -> jax.Array:
        """(alpha / r) * dropout(x) @ A @ B in the layer's dtype (one layer's slice, inside the decoder's scan);
        zeros when adapters are disabled."""
        if not self.adapters_enabled:
            return jnp.zeros((*x.shape[:-1], self.lora_b.shape[-1]), self.dtype)
        h = x if self.dropout is None else self.dropout(x)
        h = matmul(h.astype(self.dtype), self.lora_a[...].astype(self.dtype))
        scale = jnp.asarray(self.scaling, self.dtype)
        if self.layer_mask is not None:
            scale = scale * self.layer_mask[...].astype(self.dtype)
        return matmul(h, self.lora_b[...].astype(self.dtype)) * scale

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.base_layer(x)
        if not self.adapters_enabled:
            return y
        return y + self.adapter(x).astype(y.dtype)


def _expert_dims(experts: RoutedExperts | QuantizedRoutedExperts) -> tuple[int, int, int]:
    """(E, hidden D, inner I) of stacked experts, float or quantized."""
    if isinstance(experts, QuantizedRoutedExperts):
        d, _, i = experts.spec.in_features
        return int(experts.gate_proj_codes.shape[-3]), d, i
    return tuple(int(n) for n in experts.gate_proj.shape[-3:])  # type: ignore[return-value]


class LoraExperts(nnx.Module):
    """LoRA on a mixture of experts' routed experts: expert e's kernels W_e become W_e + (alpha / r) A_e B_e.

    For the stacked experts of `tempax.models.moe.RoutedExperts` (or QLoRA's `QuantizedRoutedExperts`, whose
    4-bit kernels stay frozen), each expert has its own low-rank pair (LoRA, Hu et al. 2021, arXiv:2106.09685):

        [gate_e | up_e](x) = x [G_e | U_e] + (alpha / r) (x A^gu_e) B^gu_e    gate_up_proj: A [D, r], B [r, 2I]
        down_e(h) = h D_e + (alpha / r) (h A^d_e) B^d_e                      down_proj: A [I, r], B [r, D]

    The gate and up kernels share one pair because transformers 5 fuses them into one parameter
    (`mlp.experts.gate_up_proj`), which PEFT adapts as a whole (`target_parameters`, its `ParamWrapper`), so the
    adapters save to and load from PEFT as they are. The updates stay factored and join the experts' grouped
    products (`tempax.ops.experts.low_rank_update`: two more grouped products per adapted parameter, never a loop
    over experts or the [E, in, out] product A B); merging folds A B into the kernels.

    What we do differently from PEFT: PEFT adds the [E, in, out] product A B to the weight on every forward pass;
    here it is never formed outside merging. A is drawn as PEFT draws it (U(-1/sqrt(in), 1/sqrt(in)) per expert)
    from JAX's random stream. There is no adapter dropout: PEFT's target_parameters LoRA has none (x cannot be
    factored out of the folded weight), so `LoraConfig.dropout` must be 0 with expert targets.

    Attributes:
      base_layer: the frozen `RoutedExperts` or `QuantizedRoutedExperts`.
      gate_up_a: [L, E, D, r], gate_up_b: [L, E, r, 2I] (gate columns, then up) `nnx.LoRAParam`s, or None.
      down_a: [L, E, I, r], down_b: [L, E, r, D] `nnx.LoRAParam`s, or None.
      gate_up_mask, down_mask: [L] `LoraLayerMask` when only some layers are adapted, else None.
      rank, alpha, scaling: static; scaling = alpha / rank.
      adapters_enabled: static switch; False computes the base experts only (`disable_adapters`).
    """

    def __init__(self, base_layer: RoutedExperts | QuantizedRoutedExperts, *, rank: int, alpha: float,
                 lora_a: dict[str, jax.Array], layer_masks: dict[str, np.ndarray | None]):
        _, d, i = _expert_dims(base_layer)
        io = {"gate_up_proj": (("embed", "mlp"), 2 * i), "down_proj": (("mlp", "embed"), d)}
        with nnx.use_eager_sharding(False):
            for name, prefix in (("gate_up_proj", "gate_up"), ("down_proj", "down")):
                a = lora_a.get(name)
                (in_name, out_name), n_out = io[name]
                mask = layer_masks.get(name)
                setattr(self, f"{prefix}_a", None if a is None else nnx.LoRAParam(
                    a, out_sharding=("layers", "expert", in_name, "lora_rank")))
                setattr(self, f"{prefix}_b", None if a is None else nnx.LoRAParam(
                    jnp.zeros((*a.shape[:2], rank, n_out), jnp.float32),
                    out_sharding=("layers", "expert", "lora_rank", out_name)))
                setattr(self, f"{prefix}_mask", None if mask is None else LoraLayerMask(
                    jnp.asarray(mask, jnp.float32), out_sharding=("layers",)))
        self.base_layer = base_layer
        self.rank = rank
        self.alpha = float(alpha)
        self.scaling = float(alpha) / rank
        self.dropout = None
        self.adapters_enabled = True

    def _parts(self, name: str) -> tuple[nnx.LoRAParam | None, nnx.LoRAParam | None, LoraLayerMask | None]:
        prefix = "gate_up" if name == "gate_up_proj" else "down"
        return getattr(self, f"{prefix}_a"), getattr(self, f"{prefix}_b"), getattr(self, f"{prefix}_mask")

    def adapted_params(self) -> list[str]:
        """The adapted expert parameters, of `EXPERT_PARAMS`."""
        return [name for name in EXPERT_PARAMS if self._parts(name)[0] is not None]

    def adapted_layers(self, name: str) -> list[int]:
        """Indices of the layers whose expert parameter `name` has an adapter."""
        a, _, mask = self._parts(name)
        if a is None:
            return []
        if mask is None:
            return list(range(a.shape[0]))
        return [i for i, on in enumerate(np.asarray(jax.device_get(mask[...]))) if on]

    def factors(self, name: str) -> tuple[nnx.LoRAParam, nnx.LoRAParam]:
        """(A, B) of the adapted parameter `name`."""
        a, b, _ = self._parts(name)
        return a, b  # type: ignore[return-value]

    def adapter(self, name: str) -> ExpertAdapter | None:
        """The adapter of `name` for the experts' grouped products (one layer's slice, inside the decoder's scan)."""
        a, b, mask = self._parts(name)
        if a is None:
            return None
        scale = jnp.float32(self.scaling) if mask is None else self.scaling * mask[...]
        return ExpertAdapter(a[...], b[...], scale)

    def delta_kernels(self) -> dict[str, jax.Array]:
        """{kernel name: (alpha / r) A B} in float32 for each adapted kernel ("gate_proj", "up_proj", "down_proj"),
        [L, E, in, out] over the stack: what merging adds to the experts' kernels."""
        out = {}
        for name in self.adapted_params():
            a, b, mask = self._parts(name)
            delta = self.scaling * jnp.matmul(a[...].astype(jnp.float32), b[...].astype(jnp.float32))
            if mask is not None:
                delta = delta * mask[...][:, None, None, None]
            if name == "down_proj":
                out["down_proj"] = delta
            else:
                inner = delta.shape[-1] // 2
                out["gate_proj"], out["up_proj"] = delta[..., :inner], delta[..., inner:]
        return out

    def __call__(self, x_nd: jax.Array, expert_ids_nk: jax.Array, weights_nk: jax.Array) -> jax.Array:
        if not self.adapters_enabled:
            return self.base_layer(x_nd, expert_ids_nk, weights_nk)
        return self.base_layer(x_nd, expert_ids_nk, weights_nk, gate_up_adapter=self.adapter("gate_up_proj"),
                               down_adapter=self.adapter("down_proj"))


# --------------------------------------------------------------------------------------------------------------
def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path)


_STACKS = LAYER_STACKS  # the decoder's layer stacks (`ModelConfig.layer_stacks`)


def _stack_members(model: Decoder, stack: str) -> tuple[int, ...]:
    """The model's layer indices held by a layer stack, entry by entry."""
    return model.config.layer_stacks()[stack]


def _per_layer(model: Decoder, stacked: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Each stacked path (its first entry a stack) once per layer of its stack as ("layers", i, ...), layer-major,
    the stacked paths' order within a layer."""
    out = [(i, k, ("layers", i, *p[1:])) for k, p in enumerate(stacked) for i in _stack_members(model, p[0])]
    return [path for _, _, path in sorted(out, key=lambda e: (e[0], e[1]))]


def _projections(model: Decoder) -> list[tuple[tuple[Any, ...], nnx.Module]]:
    """(path, layer) of every linear layer inside the decoder layers, in graph order (the LM head is excluded)."""
    out = []
    for path, module in nnx.iter_modules(model):
        # A LoraLinear's own base_layer is part of it, not a separate projection.
        if path and path[0] in _STACKS and "base_layer" not in path and isinstance(
            module, (nnx.Linear, QuantizedLinear, LoraLinear)
        ):
            out.append((tuple(path), module))
    return out


def _matches(pattern: str, path: tuple[Any, ...]) -> bool:
    dotted = _dotted(path)
    return pattern == str(path[-1]) or bool(re.fullmatch(pattern, dotted) or re.fullmatch(pattern, "model." + dotted))


def _linear_paths(model: Decoder) -> list[tuple[Any, ...]]:
    """Every linear projection once per layer, ("layers", i, "self_attn", "q_proj"), layer-major: the paths users
    and Hugging Face name (the model holds one stacked projection for all i). A mixture of experts' router is one."""
    return _per_layer(model, [p for p, _ in _projections(model)])


_EXPERTS_PATH = ("layers", "mlp", "experts")


def _experts_paths(model: Decoder) -> list[tuple[Any, ...]]:
    """The stacked paths of the model's routed experts: one per layer stack."""
    if model.config.moe is None:
        return []
    return [(stack, *_EXPERTS_PATH[1:]) for stack in _STACKS
            if stack == "layers" or getattr(model, stack, None) is not None]


def _layer_paths(model: Decoder) -> list[tuple[Any, ...]]:
    """Every adaptable weight once per layer, layer-major: the linear projections and, for a mixture of experts,
    its expert parameters ("layers", i, "mlp", "experts", "gate_up_proj")."""
    experts = [(*path, name) for path in _experts_paths(model) for name in EXPERT_PARAMS]
    return _per_layer(model, [p for p, _ in _projections(model)] + experts)


def _is_router(path: tuple[Any, ...]) -> bool:
    """A mixture of experts' router (`SparseMoeBlock.gate`), by its stacked or per-layer path."""
    return tuple(path[-2:]) == ("mlp", "gate")


def _is_expert_param(path: tuple[Any, ...]) -> bool:
    """An expert parameter's per-layer path ("layers", i, "mlp", "experts", "down_proj")."""
    return len(path) >= 2 and path[-2] == "experts" and path[-1] in EXPERT_PARAMS


def _selects(pattern: str, path: tuple[Any, ...]) -> bool:
    """Whether a `target_modules` pattern selects the weight at a per-layer path: `_matches`, plus the experts'
    module ("experts", "layers.3.mlp.experts") and the aliases of an expert parameter or the router."""
    if _matches(pattern, path):
        return True
    if _is_expert_param(path):
        return pattern in _EXPERT_ALIASES[path[-1]] or _matches(pattern, path[:-1])
    return _is_router(path) and pattern in _ROUTER_ALIASES


def target_paths(model: Decoder, cfg: LoraConfig) -> list[tuple[Any, ...]]:
    """Per-layer paths ("layers", 3, "self_attn", "q_proj") of the weights `cfg.target_modules` selects,
    layer-major: linear projections (a mixture of experts' router among them) and expert parameters
    ("layers", 3, "mlp", "experts", "gate_up_proj"; `LoraExperts`).

    Refused with the fix: a pattern that selects nothing; on a mixture of experts, the gate kernels without the
    up kernels or the reverse (transformers fuses them into one parameter, which PEFT adapts whole), and adapter
    dropout on the experts or the router (PEFT's target_parameters LoRA has none)."""
    paths = _layer_paths(model)
    for pattern in cfg.target_modules:
        if not any(_selects(pattern, p) for p in paths):
            names = sorted({str(p[-1]) for p in paths} | ({"experts", "router"} if model.config.moe else set()))
            raise ConfigError(
                f"lora.target_modules: {pattern!r} matches no linear layer"
                f"{' or expert parameter' if model.config.moe else ''} of this model. Names: "
                f"{', '.join(names)}; or a regex over paths such as {_dotted(paths[0])!r}."
            )
    selected = [p for p in paths if any(_selects(pat, p) for pat in cfg.target_modules)]
    if model.config.moe is None:
        return selected
    gate_up = [p for p in selected if _is_expert_param(p) and p[-1] == "gate_up_proj"]
    by_alias = {pat for pat in cfg.target_modules if pat in _EXPERT_ALIASES["gate_up_proj"]}
    direct = any(_matches(pat, p) or _matches(pat, p[:-1]) for pat in cfg.target_modules for p in gate_up)
    if gate_up and not direct and not ({"gate_proj", "up_proj"} <= by_alias or {"w1", "w3"} <= by_alias):
        raise ConfigError(
            f"lora.target_modules: {', '.join(sorted(by_alias))} names half of the routed experts' gate and up "
            f"kernels of this mixture-of-experts model ({model.config.family}); transformers fuses them into one "
            "parameter (mlp.experts.gate_up_proj), which LoRA adapts whole, as PEFT does. Name both "
            "(gate_proj and up_proj) or gate_up_proj.")
    if cfg.dropout > 0 and any(_is_expert_param(p) or _is_router(p) for p in selected):
        raise ConfigError(
            f"lora.dropout={cfg.dropout} with adapters on the routed experts or the router: PEFT's LoRA on such "
            "parameters (target_parameters) has no dropout, so neither has tempax's. Set lora.dropout=0, or adapt "
            "only the attention projections: lora.target_modules=[q_proj, k_proj, v_proj, o_proj].")
    return selected


def _module_path(model: Decoder, layer_path: tuple[Any, ...]) -> tuple[tuple[Any, ...], int]:
    """(the stacked projection's path in the model, the layer's index in its stack) for a per-layer path."""
    return stacked_path(layer_path, model.config)


def _parent(model: nnx.Module, path: tuple[Any, ...]) -> nnx.Module:
    node = model
    for key in path[:-1]:
        node = node[key] if isinstance(key, int) else getattr(node, key)
    return node


def lora_layers(model: nnx.Module) -> Iterator[tuple[tuple[Any, ...], LoraLinear]]:
    """(path, layer) of every `LoraLinear` in the model."""
    for path, module in nnx.iter_modules(model):
        if isinstance(module, LoraLinear):
            yield tuple(path), module


def lora_experts(model: nnx.Module) -> Iterator[tuple[tuple[Any, ...], LoraExperts]]:
    """(path, module) of every `LoraExperts` in the model (a mixture of experts' adapted routed experts)."""
    for path, module in nnx.iter_modules(model):
        if isinstance(module, LoraExperts):
            yield tuple(path), module


def _adapter_modules(model: nnx.Module) -> list[LoraLinear | LoraExperts]:
    return [m for _, m in lora_layers(model)] + [m for _, m in lora_experts(model)]


def has_adapters(model: nnx.Module) -> bool:
    return bool(_adapter_modules(model))


def apply_lora(model: Decoder, cfg: LoraConfig, *, rngs: nnx.Rngs) -> Decoder:
    """A copy of `model` with adapters on the `cfg.target_modules` layers (and, for QLoRA, a quantized base).

    The copy shares the base arrays with `model` (nothing is duplicated); `model` itself is unchanged. With
    `quantize_base`, drop your reference to `model` to free its float kernels. Called like the base model;
    train only the adapters with `wrt=lora_filter`.

    Each targeted `nnx.Linear` becomes a `LoraLinear` at the same module path (`layers.3.self_attn.q_proj`),
    holding the original layer as `base_layer` and the adapters as `lora_a` / `lora_b` (`nnx.LoRAParam`, so
    `lora_filter` selects exactly them for gradients and optimizer state); targeted routed experts become a
    `LoraExperts` at `layers.mlp.experts`. The model keeps its class and call signature, KV cache included.
    """
    if has_adapters(model) or any(isinstance(m, (QuantizedLinear, QuantizedRoutedExperts))
                                  for _, m in nnx.iter_modules(model)):
        raise ConfigError("the model already has adapters or a quantized base; apply_lora takes a plain model")
    selected = target_paths(model, cfg)
    targets = [p for p in selected if not _is_expert_param(p)]
    masks: dict[tuple[Any, ...], np.ndarray] = {}
    for path in targets:
        stacked, index = _module_path(model, path)
        masks.setdefault(stacked, np.zeros(len(_stack_members(model, stacked[0])), bool))[index] = True
    original = model
    model = nnx.clone(model) if cfg.quantize_base is None else quantize_base(model, cfg.quantize_base, cfg.block_size)
    layers = dict(_projections(model))
    # A is drawn layer by layer, in the order of the per-layer paths, as adapters on separate layers would be;
    # layers without an adapter keep zeros (their mask is 0).
    # PEFT's default: kaiming_uniform(a=sqrt(5)) on A, i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    init_a = nnx.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")
    draws = {path: [None] * len(mask) for path, mask in masks.items()}
    for path in targets:
        stacked, index = _module_path(original, path)
        draws[stacked][index] = init_a(rngs.params(), (_in_features(layers[stacked]), cfg.rank), jnp.float32)
    for path, mask in masks.items():
        n_in = _in_features(layers[path])
        a = jnp.stack([d if d is not None else jnp.zeros((n_in, cfg.rank), jnp.float32) for d in draws[path]])
        setattr(_parent(model, path), path[-1],
                LoraLinear(layers[path], rank=cfg.rank, alpha=cfg.alpha, dropout=cfg.dropout, lora_a=a,
                           layer_mask=None if mask.all() else mask, rngs=rngs))
    expert_targets = [p for p in selected if _is_expert_param(p)]
    if expert_targets:
        _apply_expert_lora(model, expert_targets, cfg, rngs)
    return model


def _apply_expert_lora(model: Decoder, targets: list[tuple[Any, ...]], cfg: LoraConfig, rngs: nnx.Rngs) -> None:
    """Wraps the model's routed experts (each layer stack's) in a `LoraExperts` adapting the per-layer expert
    parameters `targets`."""
    # PEFT's ParamWrapper draws each expert's A as lora.Linear does (U(-1/sqrt(in), 1/sqrt(in))); the experts are
    # a batch axis, not part of the fan-in. Layer by layer, in the order of the per-layer paths.
    init_a = nnx.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform", batch_axis=(0,))
    stacks = [p[0] for p in _experts_paths(model)]
    on = {stack: {name: np.zeros(len(_stack_members(model, stack)), bool) for name in EXPERT_PARAMS}
          for stack in stacks}
    for path in targets:
        stacked, index = _module_path(model, path)
        on[stacked[0]][path[-1]][index] = True
    draws: dict[str, dict[str, list[jax.Array | None]]] = {
        stack: {name: [None] * len(_stack_members(model, stack)) for name in EXPERT_PARAMS} for stack in stacks}
    for path in targets:  # layer-major over the model, whichever stack holds the layer
        stacked, index = _module_path(model, path)
        num_experts, d, i = _expert_dims(_parent(model, stacked))  # the stack's routed experts
        n_in = {"gate_up_proj": d, "down_proj": i}[path[-1]]
        draws[stacked[0]][path[-1]][index] = init_a(rngs.params(), (num_experts, n_in, cfg.rank), jnp.float32)
    for stack in stacks:
        if not any(on[stack][name].any() for name in EXPERT_PARAMS):
            continue
        parent = _parent(model, (stack, *_EXPERTS_PATH[1:]))
        experts = parent.experts
        num_experts, d, i = _expert_dims(experts)
        n_in = {"gate_up_proj": d, "down_proj": i}
        lora_a = {name: jnp.stack([a if a is not None else jnp.zeros((num_experts, n_in[name], cfg.rank), jnp.float32)
                                   for a in draws[stack][name]])
                  for name in EXPERT_PARAMS if on[stack][name].any()}
        masks = {name: None if on[stack][name].all() else on[stack][name] for name in lora_a}
        parent.experts = LoraExperts(experts, rank=cfg.rank, alpha=cfg.alpha, lora_a=lora_a, layer_masks=masks)


def _in_features(layer: nnx.Module) -> int:
    return layer.in_features if isinstance(layer, QuantizedLinear) else layer.kernel.shape[-2]


def quantize_base(model: Decoder, kind: str = "nf4", block_size: int = 64) -> Decoder:
    """A copy of `model` with every attention and MLP projection stored blockwise-quantized and frozen
    (`QuantizedLinear`; embeddings, norms and the LM head stay float), and a mixture of experts' expert kernels
    too (`tempax.models.moe.QuantizedRoutedExperts`; its router stays float). QLoRA's base without adapters, e.g.
    a frozen distillation teacher in 4.5 / 16 of bfloat16's bytes (NF4). Drop your reference to `model` to free
    its float kernels."""
    if kind not in QUANT_KINDS:
        raise ConfigError(f"quantization kind must be one of {', '.join(QUANT_KINDS)}, got {kind!r}")
    model = nnx.clone(model)
    for path, layer in _projections(model):
        # A mixture of experts' router stays float: tiny, and its scores decide which experts run.
        if isinstance(layer, nnx.Linear) and not _is_router(path):
            setattr(_parent(model, path), path[-1], QuantizedLinear(layer, kind=kind, block_size=block_size))
    for path, module in [(tuple(p), m) for p, m in nnx.iter_modules(model) if isinstance(m, RoutedExperts)]:
        setattr(_parent(model, path), path[-1], QuantizedRoutedExperts(module, kind=kind, block_size=block_size))
    return model


@contextlib.contextmanager
def disable_adapters(model: nnx.Module) -> Iterator[nnx.Module]:
    """Within the block, `model` computes its base (adapters skipped exactly, quantized base kept).

    Gives reference log-probs for DPO / GRPO without a second copy of the model:

        with disable_adapters(model):
            ref_logits, _ = model(tokens)

    Works eagerly and inside `nnx.jit` / `nnx.grad` (the switch is a static attribute, so jitting a function
    called inside the block compiles it once for the "off" state).
    """
    layers = _adapter_modules(model)
    if not layers:
        raise ConfigError(
            "disable_adapters: the model has no LoRA adapters, so it has no separate base to fall back to. "
            "Use a separate reference model for full fine-tuning."
        )
    before = [layer.adapters_enabled for layer in layers]
    for layer in layers:
        layer.adapters_enabled = False
    try:
        # The base is a reference here, not the model being trained: a mixture of experts' routing in the block
        # stays out of the training loss's load-balancing term (`tempax.models.moe.with_router_aux_loss`).
        with not_recording_router_statistics():
            yield model
    finally:
        for layer, enabled in zip(layers, before):
            layer.adapters_enabled = enabled


# --------------------------------------------------------------------------------------------------------------
def _base_kernel(layer: nnx.Module) -> jax.Array:
    if isinstance(layer, QuantizedLinear):
        return layer.dequantized_kernel(jnp.float32)
    return layer.kernel[...].astype(jnp.float32)


def merge_lora(model: Decoder) -> Decoder:
    """A plain `Decoder` with every adapter folded in: W + (alpha / r) * A @ B (W dequantized for QLoRA), each
    routed expert's kernels W_e + (alpha / r) * A_e @ B_e (`LoraExperts.delta_kernels`).

    The result has no adapters or quantized weights, in the config's `param_dtype`, ready for
    `tempax.models.hf_io.save_hf_checkpoint`. Works on models with a quantized base and no adapters too.
    """
    cfg = model.config
    dtype = as_dtype(cfg.param_dtype)
    plain = abstract_model(cfg)
    source = {tuple(path): module for path, module in nnx.iter_modules(model)}
    deltas: dict[int, dict[str, jax.Array]] = {}
    for path, var in nnx.iter_graph(plain):
        if not isinstance(var, nnx.Param):
            continue
        path = tuple(path)
        layer, leaf = source[path[:-1]], path[-1]
        if isinstance(layer, LoraLinear):
            base = layer.base_layer
            value = _base_kernel(base) + layer.delta_kernel() if leaf == "kernel" else base.bias[...]
        elif isinstance(layer, QuantizedLinear):
            value = _base_kernel(layer) if leaf == "kernel" else layer.bias[...]
        elif isinstance(layer, QuantizedRoutedExperts) and leaf in EXPERT_KERNELS:
            value = layer.dequantized(leaf)
        elif isinstance(layer, LoraExperts):
            base = layer.base_layer
            if leaf in EXPERT_KERNELS:
                value = (base.dequantized(leaf) if isinstance(base, QuantizedRoutedExperts)
                         else getattr(base, leaf)[...].astype(jnp.float32))
                delta = deltas.setdefault(id(layer), layer.delta_kernels())
                if leaf in delta:
                    value = value + delta[leaf]
            else:
                value = getattr(base, leaf)[...]
        else:
            value = getattr(layer, leaf)[...]
        var.set_value(jnp.asarray(value, dtype))
    return plain


# --------------------------------------------------------------------------------------------------------------
def _peft_target_modules(model: Decoder, paths: list[tuple[Any, ...]]) -> list[str] | str:
    """Layer names when every layer of those names is adapted (PEFT's usual form), else an exact regex; [] for
    none (adapters on target_parameters only)."""
    if not paths:
        return []
    names = sorted({str(p[-1]) for p in paths})
    same_names = [p for p in _peft_module_paths(model) if str(p[-1]) in names]
    if sorted(same_names) == sorted(paths):
        return names
    return "|".join(re.escape("model." + _dotted(p)) for p in paths)


def _peft_module_paths(model: Decoder) -> list[tuple[Any, ...]]:
    """The per-layer paths of the linear projections PEFT adapts as modules (`target_modules`): all but a mixture of
    experts' router, which transformers 5 holds as a parameter (`target_parameters`)."""
    return [p for p in _linear_paths(model) if not (model.config.moe is not None and _is_router(p))]


def _peft_param_name(model: Decoder, path: tuple[Any, ...]) -> str:
    """The Hugging Face parameter PEFT adapts as `target_parameters` for a router or expert-parameter per-layer
    path: "model.layers.3.mlp.gate.weight" (gpt-oss: mlp.router), "model.layers.3.mlp.experts.gate_up_proj"."""
    names = peft_moe_names(model.config.family)
    if _is_router(path):
        return f"model.layers.{path[1]}.{names.router}.weight"
    return f"model.layers.{path[1]}.{names.experts}.{path[-1]}"


def _peft_target_parameters(model: Decoder, paths: list[tuple[Any, ...]]) -> list[str] | None:
    """PEFT's `target_parameters` for adapted routers and expert parameters: the layer-relative name
    ("mlp.experts.down_proj", which PEFT matches as a suffix) where every layer is adapted, else each layer's full
    name; None for none."""
    if not paths:
        return None
    out = []
    num_layers = model.config.num_layers
    by_suffix: dict[str, list[str]] = {}
    for path in paths:
        full = _peft_param_name(model, path)
        by_suffix.setdefault(full.split(".", 3)[3], []).append(full)
    for suffix, fulls in by_suffix.items():
        out += [suffix] if len(fulls) == num_layers else fulls
    return out


def _peft_module_name(model: Decoder, path: tuple[Any, ...]) -> str:
    """The module PEFT names a `LoraLinear` slice's adapters after: "model." + the per-layer path, a mixture of
    experts' router under its Hugging Face name (gpt-oss: mlp.router)."""
    if model.config.moe is not None and _is_router(path):
        return _peft_param_name(model, path).removesuffix(".weight")
    return "model." + _dotted(path)


def _peft_expert_keys(model: Decoder, stack: str, experts: LoraExperts) -> Iterator[tuple[int, int, str, str]]:
    """(index in the layer stack `stack`, the model's layer index, expert parameter, PEFT tensor name prefix) of
    every adapted expert parameter of every layer of that stack.

    PEFT wraps the experts module once per targeted parameter, in the order the module defines them
    (gate_up_proj, then down_proj), each wrapper around the previous one, so the last is outermost and the first
    sits `base_layer.` deeper per wrapper outside it: with both adapted, gate_up_proj's tensors are
    "model.layers.{i}.mlp.experts.base_layer.lora_A.weight" and down_proj's "model.layers.{i}.mlp.experts.lora_A
    .weight"."""
    module = peft_moe_names(model.config.family).experts
    on = {name: set(experts.adapted_layers(name)) for name in EXPERT_PARAMS}
    for index, i in enumerate(_stack_members(model, stack)):
        here = [name for name in EXPERT_PARAMS if index in on[name]]
        for depth, name in enumerate(reversed(here)):
            yield index, i, name, _PEFT_PREFIX + f"model.layers.{i}.{module}" + ".base_layer" * depth


def _adapter_slices(model: Decoder) -> Iterator[tuple[tuple[Any, ...], LoraLinear, int]]:
    """(per-layer path, stacked LoraLinear, index in its stack) of every adapted projection of every layer,
    layer-major (the order of PEFT's tensors)."""
    slices = []
    for k, (path, layer) in enumerate(lora_layers(model)):
        members = _stack_members(model, path[0])
        slices += [(members[index], k, ("layers", members[index], *path[1:]), layer, index)
                   for index in layer.adapted_layers()]
    for _, _, layer_path, layer, index in sorted(slices, key=lambda e: (e[0], e[1])):
        yield layer_path, layer, index


def peft_unsupported_reason(model: Decoder) -> str | None:
    """Why this model's adapters cannot be written in PEFT's layout, or None. A family whose checkpoints fuse
    projections (Phi-3's qkv_proj and gate_up_proj) has no q_proj / gate_proj modules for PEFT to put tempax's
    separate adapters on: PEFT would load such a file and silently drop them."""
    fused = fused_projections(model.config)
    if not fused:
        return None
    return (f"{model.config.family} checkpoints fuse {', '.join(sorted(fused))}, which tempax's adapters do not "
            "target separately in PEFT's layout; export the merged model instead (tempax export RUN_DIR OUT)")


def save_adapters(model: Decoder, folder: str, *, base_model_name_or_path: str | None = None) -> str:
    """Writes only the adapters in the Hugging Face PEFT layout.

    `adapter_model.safetensors` holds `base_model.model.model.layers.{i}.{self_attn|mlp}.{name}.lora_A.weight`
    [r, in] and `...lora_B.weight` [out, r] (float32); `adapter_config.json` holds r, lora_alpha, lora_dropout,
    target_modules and base_model_name_or_path, so `peft.PeftModel.from_pretrained(base, folder)` loads it
    (checked against peft 0.21.2, both directions, by tests that run when peft is installed).

    A mixture of experts' router and routed experts are parameters, not Linear modules, in transformers 5, so
    their adapters go to PEFT's `target_parameters` (`_peft_target_parameters`): the router's as a Linear's
    (`mlp.gate.lora_A.weight` [r, D], `lora_B.weight` [E, r]), the experts' as PEFT's `ParamWrapper` holds them
    (`tempax.models.moe.expert_lora_to_peft`; nested names: `_peft_expert_keys`).
    In a multi-process run every process must call it (the adapters are gathered from all of them); process 0
    writes the files.
    """
    layers = list(lora_layers(model))
    experts = [module for _, module in lora_experts(model)]
    if not layers and not experts:
        raise ConfigError("save_adapters: the model has no LoRA adapters (apply_lora first)")
    reason = peft_unsupported_reason(model)
    if reason is not None:
        raise ConfigError(f"save_adapters: {reason}")
    modules = [layer for _, layer in layers] + experts
    ranks = {layer.rank for layer in modules}
    alphas = {layer.alpha for layer in modules}
    rates = {layer.dropout.rate if layer.dropout is not None else 0.0 for layer in modules}
    if len(ranks) > 1 or len(alphas) > 1 or len(rates) > 1:
        raise ConfigError(f"save_adapters: adapters differ in rank/alpha/dropout ({ranks}, {alphas}, {rates})")
    tensors = {}
    hosted = {id(layer): (host_array(layer.lora_a[...]), host_array(layer.lora_b[...])) for _, layer in layers}
    adapted, params = [], []
    for path, layer, i in _adapter_slices(model):
        (params if model.config.moe is not None and _is_router(path) else adapted).append(path)
        name = _PEFT_PREFIX + _peft_module_name(model, path)
        a, b = hosted[id(layer)]
        tensors[name + ".lora_A.weight"] = np.ascontiguousarray(a[i].astype(np.float32).T)
        tensors[name + ".lora_B.weight"] = np.ascontiguousarray(b[i].astype(np.float32).T)
    for stack_path, module in lora_experts(model):
        gate_up = peft_moe_names(model.config.family).gate_up
        factors = {name: tuple(host_array(f[...]).astype(np.float32) for f in module.factors(name))
                   for name in module.adapted_params()}
        for index, i, name, key in _peft_expert_keys(model, stack_path[0], module):
            params.append(("layers", i, *_EXPERTS_PATH[1:], name))
            a, b = factors[name]
            tensors[key + ".lora_A.weight"], tensors[key + ".lora_B.weight"] = expert_lora_to_peft(
                a[index], b[index], gate_up if name == "gate_up_proj" else None)
    if not is_writer():
        return folder
    os.makedirs(folder, exist_ok=True)
    save_safetensors(tensors, os.path.join(folder, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": ranks.pop(),
        "lora_alpha": alphas.pop(),
        "lora_dropout": rates.pop(),
        "target_modules": _peft_target_modules(model, adapted),
        "target_parameters": _peft_target_parameters(model, sorted(params, key=lambda p: (p[1], _dotted(p)))),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }
    with open(os.path.join(folder, ADAPTER_CONFIG), "w") as f:
        json.dump(config, f, indent=2)
    return folder


def _peft_selects_module(targets: list[str] | str, name: str) -> bool:
    """PEFT's `target_modules` rule: a list names modules by their name or a dotted suffix of it, a string is a
    regex the whole module name must match."""
    if isinstance(targets, str):
        return bool(re.fullmatch(targets, name))
    return any(name == t or name.endswith("." + t) for t in targets)


def _tempax_targets(model: Decoder, raw: dict[str, Any], path: str) -> tuple[str, ...]:
    """Exact `LoraConfig.target_modules` (escaped per-layer paths) for what a PEFT config adapts in `model`: its
    `target_modules` among the modules PEFT sees as Linear (on a mixture of experts not the router, nor the
    experts, whose per-expert names gate_proj / up_proj / down_proj match no module in transformers 5), and its
    `target_parameters` among the router and expert parameters, each matched as PEFT matches them (the whole name
    or a dotted suffix)."""
    modules = raw.get("target_modules") or []
    chosen = [p for p in _peft_module_paths(model) if _peft_selects_module(modules, _peft_module_name(model, p))]
    parameters = raw.get("target_parameters") or []
    if parameters:
        if model.config.moe is None:
            raise CheckpointError(
                f"{path}: target_parameters {parameters} adapt parameters of a mixture of experts, but this "
                f"{model.config.family} model has none; the adapters belong to another base model")
        candidates = [p for p in _layer_paths(model) if _is_router(p) or _is_expert_param(p)]
        for target in parameters:
            hits = [p for p in candidates if _peft_param_name(model, p) == target
                    or _peft_param_name(model, p).endswith("." + target)]
            if not hits:
                known = sorted({_peft_param_name(model, p).split(".", 3)[3] for p in candidates})
                raise CheckpointError(
                    f"{path}: target_parameters entry {target!r} names no parameter tempax adapts in this "
                    f"{model.config.family} model ({', '.join(known)}); the adapters belong to another base model")
            chosen += hits
    return tuple(re.escape(_dotted(p)) for p in chosen)


def read_adapter_config(folder: str, *, quantize_base: str | None = None, model: Decoder | None = None) -> LoraConfig:
    """The `LoraConfig` of a PEFT adapter folder (failing clearly on PEFT features tempax does not implement).

    With `model`, a mixture of experts' or a `target_parameters` config becomes exact per-layer paths of that
    model (`_tempax_targets`): PEFT's module names and tempax's expert aliases (down_proj) would otherwise mean
    different weights there."""
    path = os.path.join(folder, ADAPTER_CONFIG)
    if not os.path.isfile(path):
        raise CheckpointError(f"{path} not found; a LoRA adapter folder needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}")
    try:
        with open(path) as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e
    if raw.get("peft_type", "LORA") != "LORA":
        raise CheckpointError(f"{path}: peft_type {raw.get('peft_type')!r} is not supported (only LORA)")
    unsupported = [k for k in ("use_rslora", "use_dora", "fan_in_fan_out", "modules_to_save",
                               "layers_to_transform", "rank_pattern", "alpha_pattern") if raw.get(k)]
    if raw.get("bias", "none") != "none":
        unsupported.append("bias")
    if unsupported:
        raise CheckpointError(f"{path}: PEFT options {unsupported} are not supported by tempax adapters")
    targets = raw.get("target_modules")
    targets = (targets,) if isinstance(targets, str) else tuple(targets or ())
    if model is not None and (model.config.moe is not None or raw.get("target_parameters")):
        targets = _tempax_targets(model, raw, path)
    try:
        return LoraConfig(
            rank=int(raw["r"]), alpha=float(raw.get("lora_alpha", raw["r"])),
            dropout=float(raw.get("lora_dropout", 0.0)), target_modules=targets, quantize_base=quantize_base,
        )
    except KeyError as e:
        raise CheckpointError(f"{path}: required key {e.args[0]!r} is missing") from e
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from e


def load_adapters(
    model: Decoder, folder: str, *, rngs: nnx.Rngs | None = None, quantize_base: str | None = None
) -> Decoder:
    """Loads PEFT-layout adapters onto `model` and returns the adapted model.

    A plain `model` first gets adapters shaped by the folder's `adapter_config.json` (and a quantized base with
    `quantize_base`); a model that already has adapters must have exactly the saved ones, and is filled in place.
    A mixture of experts' router and expert adapters are read from PEFT's `target_parameters` layout (written by
    `save_adapters` or by peft itself).
    """
    from safetensors.numpy import load_file

    if not has_adapters(model):
        cfg = read_adapter_config(folder, quantize_base=quantize_base, model=model)
        model = apply_lora(model, cfg, rngs=rngs if rngs is not None else nnx.Rngs(0))
    weights_path = os.path.join(folder, ADAPTER_WEIGHTS)
    if not os.path.isfile(weights_path):
        raise CheckpointError(f"{weights_path} not found; save adapters with tempax.models.lora.save_adapters")
    tensors = load_file(weights_path)
    tensors = {re.sub(r"\.default(?=\.weight$)", "", k): v for k, v in tensors.items()}  # older PEFT naming
    used = set()
    stacks = {id(layer): {"lora_a": np.zeros(layer.lora_a.shape, np.float32),
                          "lora_b": np.zeros(layer.lora_b.shape, np.float32)} for _, layer in lora_layers(model)}
    for path, layer, i in _adapter_slices(model):
        name = _PEFT_PREFIX + _peft_module_name(model, path)
        # PEFT stores both as torch Linear weights [out, in]: A as [r, in], B as [out, r].
        for suffix, attr in ((".lora_A.weight", "lora_a"), (".lora_B.weight", "lora_b")):
            key = name + suffix
            if key not in tensors:
                raise CheckpointError(f"{weights_path}: tensor {key!r} is missing; the adapters do not fit this model")
            array = tensors[key].T
            want = tuple(getattr(layer, attr).shape[1:])
            if tuple(array.shape) != want:
                raise CheckpointError(
                    f"{weights_path}: {key!r} has shape {tuple(tensors[key].shape)} but this model needs "
                    f"{want[::-1]}; rank or base model differ"
                )
            stacks[id(layer)][attr][i] = array
            used.add(key)
    for _, layer in lora_layers(model):
        for attr, value in stacks[id(layer)].items():
            getattr(layer, attr).set_value(jnp.asarray(value))
    for stack_path, module in lora_experts(model):
        _load_expert_adapters(model, stack_path[0], module, tensors, used, weights_path)
    extra = sorted(k for k in tensors if k not in used)
    if extra:
        raise CheckpointError(
            f"{weights_path}: {len(extra)} tensors have no adapter in this model, e.g. {extra[:3]}; "
            "target_modules or the base model differ"
        )
    return model


def _load_expert_adapters(model: Decoder, stack: str, module: LoraExperts, tensors: dict[str, np.ndarray],
                          used: set[str], weights_path: str) -> None:
    """Fills a `LoraExperts`' factors from PEFT's tensors (`_peft_expert_keys` names them), adding the names read
    to `used`."""
    gate_up = peft_moe_names(model.config.family).gate_up
    stacks = {name: [np.zeros(f.shape, np.float32) for f in module.factors(name)] for name in module.adapted_params()}
    num_experts = _expert_dims(module.base_layer)[0]
    for index, _, name, key in _peft_expert_keys(model, stack, module):
        missing = [k for k in (key + ".lora_A.weight", key + ".lora_B.weight") if k not in tensors]
        if missing:
            raise CheckpointError(f"{weights_path}: tensor {missing[0]!r} is missing; the adapters do not fit this "
                                  f"model (PEFT nests the experts' wrappers: gate_up_proj under down_proj)")
        lora_a, lora_b = tensors[key + ".lora_A.weight"], tensors[key + ".lora_B.weight"]
        a_stack, b_stack = stacks[name]
        want = (num_experts * module.rank, a_stack.shape[-2]), (b_stack.shape[-1], module.rank * num_experts)
        if (tuple(lora_a.shape), tuple(lora_b.shape)) != want:
            raise CheckpointError(
                f"{weights_path}: {key!r} has lora_A {tuple(lora_a.shape)} and lora_B {tuple(lora_b.shape)} but "
                f"this model's {num_experts} experts need {want[0]} and {want[1]} for {name}; rank or base model "
                "differ")
        a_stack[index], b_stack[index] = expert_lora_from_peft(lora_a, lora_b, num_experts,
                                                       gate_up if name == "gate_up_proj" else None)
        used.update((key + ".lora_A.weight", key + ".lora_B.weight"))
    for name, values in stacks.items():
        for factor, value in zip(module.factors(name), values):
            factor.set_value(jnp.asarray(value))


__all__ = [
    "ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "DEFAULT_TARGETS", "EXPERT_PARAMS", "LoraConfig", "LoraExperts",
    "LoraLinear", "apply_lora", "disable_adapters", "has_adapters", "load_adapters", "lora_experts", "lora_filter",
    "lora_layers", "merge_lora", "peft_unsupported_reason", "read_adapter_config", "save_adapters", "target_paths",
]
