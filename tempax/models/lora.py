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
from tempax.models.decoder import Decoder, as_dtype
from tempax.models.fused import fused_projections
from tempax.models.moe import (EXPERT_KERNELS, QuantizedRoutedExperts, RoutedExperts,
                               not_recording_router_statistics)
from tempax.models.quant import QUANT_KINDS, QuantizedLinear
from tempax.models.weights import abstract_model
from tempax.ops import matmul
from tempax.parallel.process import host_array, is_writer
from tempax.models.hf_io import save_safetensors

DEFAULT_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

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
        name ("model.layers.3.self_attn.q_proj"). Every pattern must match at least one layer.
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


# --------------------------------------------------------------------------------------------------------------
def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path)


def _projections(model: Decoder) -> list[tuple[tuple[Any, ...], nnx.Module]]:
    """(path, layer) of every linear layer inside the decoder layers, in graph order (the LM head is excluded)."""
    out = []
    for path, module in nnx.iter_modules(model):
        # A LoraLinear's own base_layer is part of it, not a separate projection.
        if path and path[0] == "layers" and "base_layer" not in path and isinstance(
            module, (nnx.Linear, QuantizedLinear, LoraLinear)
        ):
            out.append((tuple(path), module))
    return out


def _matches(pattern: str, path: tuple[Any, ...]) -> bool:
    dotted = _dotted(path)
    return pattern == str(path[-1]) or bool(re.fullmatch(pattern, dotted) or re.fullmatch(pattern, "model." + dotted))


def _layer_paths(model: Decoder) -> list[tuple[Any, ...]]:
    """Every projection once per layer, ("layers", i, "self_attn", "q_proj"), layer-major: the paths users and
    Hugging Face name (the model holds one stacked projection for all i)."""
    modules = [p for p, _ in _projections(model)]
    return [("layers", i, *p[1:]) for i in range(model.config.num_layers) for p in modules]


# What Hugging Face checkpoints call a mixture of experts' expert weights (Qwen, gpt-oss; Mixtral's w1/w2/w3).
_EXPERT_NAMES = (*EXPERT_KERNELS, "gate_up_proj", "w1", "w2", "w3", "experts")


def _is_router(path: tuple[Any, ...]) -> bool:
    """A mixture of experts' router (`SparseMoeBlock.gate`), by its stacked or per-layer path."""
    return tuple(path[-2:]) == ("mlp", "gate")


def target_paths(model: Decoder, cfg: LoraConfig) -> list[tuple[Any, ...]]:
    """Per-layer paths ("layers", 3, "self_attn", "q_proj") of the projections `cfg.target_modules` selects,
    layer-major.

    A mixture-of-experts model adapts its attention projections only: LoRA on the stacked experts (PEFT's
    `target_parameters`) is not implemented, and transformers' routers are not Linear modules, so PEFT would name
    an adapter on them as a target parameter too; both are refused with the fix (QLoRA still stores the experts
    in 4 bits: `quantize_base`)."""
    paths = _layer_paths(model)
    moe = model.config.moe is not None
    for pattern in cfg.target_modules:
        if moe and not any(_matches(pattern, p) for p in paths if not _is_router(p)) and any(
                pattern == n or re.fullmatch(pattern, n) or re.search(r"experts", pattern) for n in _EXPERT_NAMES):
            raise ConfigError(
                f"lora.target_modules: {pattern!r} names the routed experts of this mixture-of-experts model "
                f"({model.config.family}); tempax has no LoRA on stacked expert weights (PEFT's target_parameters). "
                "Adapt the attention projections: lora.target_modules=[q_proj, k_proj, v_proj, o_proj]; "
                "lora.quantize_base=nf4 (QLoRA) still stores the experts in 4 bits.")
        if not any(_matches(pattern, p) for p in paths):
            names = sorted({str(p[-1]) for p in paths})
            raise ConfigError(
                f"lora.target_modules: {pattern!r} matches no linear layer of this model. Layer names: "
                f"{', '.join(names)}; or a regex over paths such as {_dotted(paths[0])!r}."
            )
    selected = [p for p in paths if any(_matches(pat, p) for pat in cfg.target_modules)]
    if moe and any(_is_router(p) for p in selected):
        raise ConfigError(
            "lora.target_modules selects the router (mlp.gate) of this mixture-of-experts model; transformers' "
            "routers are not Linear modules, so PEFT adapts them as target_parameters, which tempax does not "
            "write. Leave the router out: lora.target_modules=[q_proj, k_proj, v_proj, o_proj].")
    return selected


def _module_path(layer_path: tuple[Any, ...]) -> tuple[Any, ...]:
    """The stacked projection's path in the model for a per-layer path (the layer index dropped)."""
    return ("layers", *layer_path[2:])


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


def has_adapters(model: nnx.Module) -> bool:
    return next(lora_layers(model), None) is not None


def apply_lora(model: Decoder, cfg: LoraConfig, *, rngs: nnx.Rngs) -> Decoder:
    """A copy of `model` with adapters on the `cfg.target_modules` layers (and, for QLoRA, a quantized base).

    The copy shares the base arrays with `model` (nothing is duplicated); `model` itself is unchanged. With
    `quantize_base`, drop your reference to `model` to free its float kernels. Called like the base model;
    train only the adapters with `wrt=lora_filter`.

    Each targeted `nnx.Linear` becomes a `LoraLinear` at the same module path (`layers.3.self_attn.q_proj`),
    holding the original layer as `base_layer` and the adapters as `lora_a` / `lora_b` (`nnx.LoRAParam`, so
    `lora_filter` selects exactly them for gradients and optimizer state). The model keeps its class and call
    signature, KV cache included.
    """
    if has_adapters(model) or any(isinstance(m, (QuantizedLinear, QuantizedRoutedExperts))
                                  for _, m in nnx.iter_modules(model)):
        raise ConfigError("the model already has adapters or a quantized base; apply_lora takes a plain model")
    targets = target_paths(model, cfg)
    num_layers = model.config.num_layers
    masks: dict[tuple[Any, ...], np.ndarray] = {}
    for path in targets:
        masks.setdefault(_module_path(path), np.zeros(num_layers, bool))[path[1]] = True
    model = nnx.clone(model) if cfg.quantize_base is None else quantize_base(model, cfg.quantize_base, cfg.block_size)
    layers = dict(_projections(model))
    # A is drawn layer by layer, in the order of the per-layer paths, as adapters on separate layers would be;
    # layers without an adapter keep zeros (their mask is 0).
    # PEFT's default: kaiming_uniform(a=sqrt(5)) on A, i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    init_a = nnx.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")
    draws = {path: [None] * num_layers for path in masks}
    for path in targets:
        n_in = _in_features(layers[_module_path(path)])
        draws[_module_path(path)][path[1]] = init_a(rngs.params(), (n_in, cfg.rank), jnp.float32)
    for path, mask in masks.items():
        n_in = _in_features(layers[path])
        a = jnp.stack([d if d is not None else jnp.zeros((n_in, cfg.rank), jnp.float32) for d in draws[path]])
        setattr(_parent(model, path), path[-1],
                LoraLinear(layers[path], rank=cfg.rank, alpha=cfg.alpha, dropout=cfg.dropout, lora_a=a,
                           layer_mask=None if mask.all() else mask, rngs=rngs))
    return model


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
    layers = [layer for _, layer in lora_layers(model)]
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
    """A plain `Decoder` with every adapter folded in: W + (alpha / r) * A @ B (W dequantized for QLoRA).

    The result has no adapters or quantized weights, in the config's `param_dtype`, ready for
    `tempax.models.hf_io.save_hf_checkpoint`. Works on models with a quantized base and no adapters too.
    """
    cfg = model.config
    dtype = as_dtype(cfg.param_dtype)
    plain = abstract_model(cfg)
    source = {tuple(path): module for path, module in nnx.iter_modules(model)}
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
        else:
            value = getattr(layer, leaf)[...]
        var.set_value(jnp.asarray(value, dtype))
    return plain


# --------------------------------------------------------------------------------------------------------------
def _peft_target_modules(model: Decoder, paths: list[tuple[Any, ...]]) -> list[str] | str:
    """Layer names when every layer of those names is adapted (PEFT's usual form), else an exact regex."""
    names = sorted({str(p[-1]) for p in paths})
    same_names = [p for p in _layer_paths(model) if str(p[-1]) in names]
    if sorted(same_names) == sorted(paths):
        return names
    return "|".join(re.escape("model." + _dotted(p)) for p in paths)


def _adapter_slices(model: Decoder) -> Iterator[tuple[tuple[Any, ...], LoraLinear, int]]:
    """(per-layer path, stacked LoraLinear, layer index) of every adapted projection of every layer, layer-major
    (the order of PEFT's tensors)."""
    adapted = [(path, layer, set(layer.adapted_layers())) for path, layer in lora_layers(model)]
    for i in range(model.config.num_layers):
        for path, layer, on in adapted:
            if i in on:
                yield ("layers", i, *path[1:]), layer, i


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
    In a multi-process run every process must call it (the adapters are gathered from all of them); process 0
    writes the files.
    """
    layers = list(lora_layers(model))
    if not layers:
        raise ConfigError("save_adapters: the model has no LoRA adapters (apply_lora first)")
    reason = peft_unsupported_reason(model)
    if reason is not None:
        raise ConfigError(f"save_adapters: {reason}")
    ranks = {layer.rank for _, layer in layers}
    alphas = {layer.alpha for _, layer in layers}
    rates = {layer.dropout.rate if layer.dropout is not None else 0.0 for _, layer in layers}
    if len(ranks) > 1 or len(alphas) > 1 or len(rates) > 1:
        raise ConfigError(f"save_adapters: adapters differ in rank/alpha/dropout ({ranks}, {alphas}, {rates})")
    tensors = {}
    hosted = {id(layer): (host_array(layer.lora_a[...]), host_array(layer.lora_b[...])) for _, layer in layers}
    adapted = []
    for path, layer, i in _adapter_slices(model):
        adapted.append(path)
        name = _PEFT_PREFIX + "model." + _dotted(path)
        a, b = hosted[id(layer)]
        tensors[name + ".lora_A.weight"] = np.ascontiguousarray(a[i].astype(np.float32).T)
        tensors[name + ".lora_B.weight"] = np.ascontiguousarray(b[i].astype(np.float32).T)
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


def read_adapter_config(folder: str, *, quantize_base: str | None = None) -> LoraConfig:
    """The `LoraConfig` of a PEFT adapter folder (failing clearly on PEFT features tempax does not implement)."""
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
    """
    from safetensors.numpy import load_file

    if not has_adapters(model):
        cfg = read_adapter_config(folder, quantize_base=quantize_base)
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
        name = _PEFT_PREFIX + "model." + _dotted(path)
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
    extra = sorted(k for k in tensors if k not in used)
    if extra:
        raise CheckpointError(
            f"{weights_path}: {len(extra)} tensors have no adapter in this model, e.g. {extra[:3]}; "
            "target_modules or the base model differ"
        )
    return model


__all__ = [
    "ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "DEFAULT_TARGETS", "LoraConfig", "LoraLinear", "apply_lora",
    "disable_adapters", "has_adapters", "load_adapters", "lora_filter", "lora_layers", "merge_lora",
    "peft_unsupported_reason", "read_adapter_config", "save_adapters", "target_paths",
]
