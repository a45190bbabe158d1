"""The sparse mixture-of-experts feed-forward block, its router's load-balancing loss, and its checkpoint names.

A `SparseMoeBlock` replaces a decoder layer's MLP where `ModelConfig.is_moe_layer(i)` says so (the layer holds it
as `mlp`, as transformers does), or joins it (Gemma 4: the block then holds the dense MLP too); its docstring holds
the formula, the papers and the parameters. The router's auxiliary loss keeps the experts evenly used in training. `hf_moe_tensor_to_path` maps each Hugging Face tensor of
a layer's block to these parameters (a rename, with a transpose and an expert index or an even/odd or half split
where the checkpoint fuses or splits differently); `moe_path_to_hf` and `moe_params_to_hf_tensors` go back,
writing what transformers' `save_pretrained` writes. `peft_moe_names`, `expert_lora_to_peft` and
`expert_lora_from_peft` say where and how PEFT keeps LoRA on the experts and the router
(`tempax.models.lora.LoraExperts`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tempax import ops
from tempax.errors import CheckpointError, ConfigError
from tempax.models.config import MoeConfig
from tempax.models.norm import RMSNorm, rms_normalized
from tempax.models.quant import QuantizedWeight, QuantKind, dequantize_blockwise, quantize_blockwise
from tempax.ops.experts import ExpertAdapter

# --------------------------------------------------------------------------------------------------------------
# Routing


def route(
    router_logits: jax.Array,
    *,
    experts_per_token: int,
    activation: Literal["softmax", "sigmoid"] = "softmax",
    normalize: bool = True,
    scaling: float = 1.0,
    expert_scale: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(weights [..., k] float32, expert ids [..., k] int32) from router logits [..., E].

    s = softmax(z) (or sigmoid(z)); the k largest scores s_{ids}; w = s_{ids} / sum_j s_{ids_j} when `normalize`;
    then w * `scaling`, and w_j * expert_scale[ids_j] with a per-expert scale [E] (Gemma 4's).
    """
    z = router_logits.astype(jnp.float32)
    scores = jax.nn.softmax(z, axis=-1) if activation == "softmax" else jax.nn.sigmoid(z)
    weights, ids = jax.lax.top_k(scores, experts_per_token)
    if normalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    if scaling != 1.0:
        weights = weights * scaling
    if expert_scale is not None:
        weights = weights * jnp.take(expert_scale.astype(jnp.float32), ids, axis=0)
    return weights, ids.astype(jnp.int32)


# --------------------------------------------------------------------------------------------------------------
# The auxiliary load-balancing loss


class RouterStatistics(NamedTuple):
    """Sums from which the load-balancing loss is formed; add them over layers (and micro-batches) first.

    Attributes:
      tokens_per_expert: [E] float32, sum over counted tokens of how many of its k slots chose expert e.
      prob_per_expert: [E] float32, sum over counted tokens of softmax(z)_e.
      tokens: [] float32, the number of tokens counted (mask sum, per layer).
    """

    tokens_per_expert: jax.Array
    prob_per_expert: jax.Array
    tokens: jax.Array


def router_statistics(router_logits: jax.Array, *, experts_per_token: int,
                      mask: jax.Array | None = None) -> RouterStatistics:
    """The `RouterStatistics` of router logits [..., E] (one layer's [B, T, E], or layers stacked [L, B, T, E]);
    `mask` (broadcast against the leading axes from the right, e.g. [B, T]) is 1 for a real token and 0 for
    padding. The chosen experts are the k largest of softmax(z), as the router chose them (softmax, sigmoid and
    gpt-oss's logit ranking order experts alike)."""
    z = router_logits.astype(jnp.float32)
    num_experts = z.shape[-1]
    probs = jax.nn.softmax(z, axis=-1)
    _, ids = jax.lax.top_k(probs, experts_per_token)
    m = jnp.ones(z.shape[:-1], jnp.float32) if mask is None else jnp.broadcast_to(
        mask.astype(jnp.float32), z.shape[:-1])
    chosen = jnp.zeros((num_experts,), jnp.float32).at[ids.reshape(-1)].add(
        jnp.repeat(m.reshape(-1), experts_per_token))
    return RouterStatistics(
        tokens_per_expert=chosen,
        prob_per_expert=jnp.einsum("...e,...->e", probs, m),
        tokens=jnp.sum(m),
    )


def load_balancing_loss_from_statistics(stats: RouterStatistics) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Switch Transformer's auxiliary loss (Fedus et al. 2021, arXiv:2101.03961, eqs. 4-6), as transformers'
    `load_balancing_loss_func` computes it for Qwen2/3-MoE, Mixtral and gpt-oss:

        f_e = (1 / N) sum_t #{j : ids_tj = e}      fraction of routing slots sent to e (sums to k)
        P_e = (1 / N) sum_t softmax(z_t)_e          mean router probability of e
        loss = E * sum_e f_e P_e

    N counts the real tokens of every MoE layer together: transformers pools the layers' counts and
    probabilities before the product, it does not average per-layer losses. With top-1 routing this is the paper's
    loss; with top-k, f sums to k, so a uniform router gives k, not 1. Gradients flow through P only (f is a
    count). The loss is scaled by `MoeConfig.router_aux_loss_coef` where it joins the training loss.

    What we do differently: with no real token at all (N = 0) the loss is 0, not transformers' 0 / 0.

    Returns:
      (loss, metrics) with "moe_aux_loss" and "moe_max_load", the busiest expert's share of the slots over the
      uniform share k / E (1.0 = perfectly balanced).
    """
    num_experts = stats.tokens_per_expert.shape[-1]
    n = jnp.maximum(stats.tokens, 1.0)
    f = stats.tokens_per_expert / n
    p = stats.prob_per_expert / n
    loss = num_experts * jnp.sum(f * p)
    k = jnp.sum(f)  # every counted token fills k slots
    max_load = jnp.max(f) * num_experts / jnp.maximum(k, 1e-9)
    return loss, {"moe_aux_loss": loss, "moe_max_load": max_load}


def load_balancing_loss(router_logits: jax.Array, *, experts_per_token: int,
                        mask: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The load-balancing loss (`load_balancing_loss_from_statistics` gives the formula) of router logits
    [L, ..., E] stacked over the L MoE layers (pass [None] for one layer), with an optional token `mask` [...]
    (1 = real, 0 = padding), as transformers' `load_balancing_loss_func(gate_logits, E, k, attention_mask)`."""
    return load_balancing_loss_from_statistics(
        router_statistics(router_logits, experts_per_token=experts_per_token, mask=mask))


# --------------------------------------------------------------------------------------------------------------
# The router statistics of a training pass, and the auxiliary loss they give


class RecordedRouting(NamedTuple):
    """The routing of one call of a mixture-of-experts `Decoder`: its `MoeConfig` and the `RouterStatistics` of
    its real tokens (segment id != 0), summed over its layers."""

    moe: MoeConfig
    statistics: RouterStatistics


_RECORDING: contextvars.ContextVar[list[RecordedRouting] | None] = contextvars.ContextVar(
    "tempax_router_statistics", default=None)


@contextlib.contextmanager
def recording_router_statistics() -> Iterator[list[RecordedRouting]]:
    """Within the block, every call of a mixture-of-experts `Decoder` appends its `RecordedRouting` to the list
    this yields (the decoder computes the statistics inside its layer scan only while a block is open).

    Enter it inside the traced function that calls the model (a loss function): the statistics are arrays of that
    trace. A program traced outside the block records nothing, and a model call inside a nested transform of its
    own (a `jax.checkpoint` around the whole model) would leak that transform's tracers."""
    token = _RECORDING.set([])
    try:
        yield _RECORDING.get()  # type: ignore[misc]
    finally:
        _RECORDING.reset(token)


@contextlib.contextmanager
def not_recording_router_statistics() -> Iterator[None]:
    """Calls inside the block are not recorded: a reference pass inside a loss (LoRA's frozen base under
    `tempax.models.lora.disable_adapters`) is not the model being trained, and transformers counts only the
    trained forward's router logits in its auxiliary loss."""
    token = _RECORDING.set(None)
    try:
        yield
    finally:
        _RECORDING.reset(token)


def is_recording_router_statistics() -> bool:
    return _RECORDING.get() is not None


def record_router_statistics(moe: MoeConfig, statistics: RouterStatistics) -> None:
    """Appends one decoder call's routing to the open `recording_router_statistics` block (nothing without one)."""
    recorded = _RECORDING.get()
    if recorded is not None:
        recorded.append(RecordedRouting(moe, statistics))


def router_aux_loss(recorded: Sequence[RecordedRouting]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(term the training loss gains, metrics) from the routing of the decoder calls of one loss evaluation.

    The calls of one model (one `MoeConfig`) are pooled as transformers pools the layers of one forward (a prompt
    run into a cache and its completion run against it count as one sequence), then
    `load_balancing_loss_from_statistics` gives the loss and "moe_aux_loss" / "moe_max_load". The term is
    `router_aux_loss_coef * loss` when `MoeConfig.train_aux_loss` is set, else 0 (reported only). Several models
    (an MoE policy and an MoE critic) add their terms; their metrics are the sum of the losses and the largest
    max load."""
    pooled: dict[MoeConfig, RouterStatistics] = {}
    for moe, stats in recorded:
        before = pooled.get(moe)
        pooled[moe] = stats if before is None else RouterStatistics(*(a + b for a, b in zip(before, stats)))
    term = jnp.zeros((), jnp.float32)
    total = jnp.zeros((), jnp.float32)
    max_load = jnp.zeros((), jnp.float32)
    for moe, stats in pooled.items():
        loss, metrics = load_balancing_loss_from_statistics(stats)
        total = total + loss
        max_load = jnp.maximum(max_load, metrics["moe_max_load"])
        if moe.train_aux_loss:
            term = term + moe.router_aux_loss_coef * loss
    return term, {"moe_aux_loss": total, "moe_max_load": max_load}


LossFn = Callable[[Any, Any], tuple[jax.Array, dict[str, jax.Array]]]


def with_router_aux_loss(loss_fn: LossFn) -> LossFn:
    """`loss_fn(model, batch)` that also reports the router's load-balancing loss of every mixture-of-experts
    decoder call it makes ("moe_aux_loss", "moe_max_load") and, where `MoeConfig.train_aux_loss` is set, adds
    `router_aux_loss_coef * moe_aux_loss` to the loss it returns (`router_aux_loss`), as transformers' *ForCausalLM
    does when `output_router_logits` is set. A loss whose model has no experts is returned unchanged, metrics
    included. `tempax.train.step` wraps every algorithm's loss with it."""

    def wrapped(model: Any, batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
        with recording_router_statistics() as recorded:
            loss, metrics = loss_fn(model, batch)
        if not recorded:
            return loss, metrics
        term, aux_metrics = router_aux_loss(recorded)
        return loss + term.astype(loss.dtype), {**metrics, **aux_metrics}

    return wrapped


# --------------------------------------------------------------------------------------------------------------
# The block


def _normal(names: tuple[str | None, ...], scale: float = 0.02) -> Any:
    return nnx.with_partitioning(nnx.initializers.normal(scale), names)


def _zeros(names: tuple[str | None, ...]) -> Any:
    return nnx.with_partitioning(nnx.initializers.zeros, names)


class RoutedExperts(nnx.Module):
    """E gated-MLP experts with stacked kernels [E, in, out], computed by the op table's `ops.expert_products`
    (`tempax.ops.experts.expert_products` gives the formula; megablox's kernel on a TPU)."""

    def __init__(self, moe: MoeConfig, hidden_size: int, *, param_dtype: Any, rngs: nnx.Rngs):
        e, d, m = moe.num_experts, hidden_size, moe.expert_intermediate_size
        self.gate_proj = nnx.Param(_normal(("expert", "embed", "mlp"))(rngs.params(), (e, d, m), param_dtype))
        self.up_proj = nnx.Param(_normal(("expert", "embed", "mlp"))(rngs.params(), (e, d, m), param_dtype))
        self.down_proj = nnx.Param(_normal(("expert", "mlp", "embed"))(rngs.params(), (e, m, d), param_dtype))
        if moe.expert_bias:
            self.gate_proj_bias = nnx.Param(_zeros(("expert", "mlp"))(rngs.params(), (e, m), param_dtype))
            self.up_proj_bias = nnx.Param(_zeros(("expert", "mlp"))(rngs.params(), (e, m), param_dtype))
            self.down_proj_bias = nnx.Param(_zeros(("expert", "embed"))(rngs.params(), (e, d), param_dtype))
        else:
            self.gate_proj_bias = self.up_proj_bias = self.down_proj_bias = None
        self.activation = moe.expert_activation
        self.swiglu_alpha, self.swiglu_limit = moe.swiglu_alpha, moe.swiglu_limit

    def __call__(self, x_nd: jax.Array, expert_ids_nk: jax.Array, weights_nk: jax.Array, *,
                 gate_up_adapter: ExpertAdapter | None = None, down_adapter: ExpertAdapter | None = None) -> jax.Array:
        """The experts' weighted outputs [N, D]; the adapters (LoRA, `tempax.models.lora.LoraExperts`) join the
        same grouped products."""
        value = lambda p: None if p is None else p[...]  # noqa: E731
        return ops.expert_products(
            x_nd, expert_ids_nk, weights_nk, self.gate_proj[...], self.up_proj[...], self.down_proj[...],
            activation=self.activation, gate_bias_ei=value(self.gate_proj_bias), up_bias_ei=value(self.up_proj_bias),
            down_bias_ed=value(self.down_proj_bias), swiglu_alpha=self.swiglu_alpha, swiglu_limit=self.swiglu_limit,
            gate_up_adapter=gate_up_adapter, down_adapter=down_adapter)


EXPERT_KERNELS = ("gate_proj", "up_proj", "down_proj")


class _QuantizedExpertsSpec(NamedTuple):
    """The static side of `QuantizedRoutedExperts`' product (hashable: a custom_vjp's non-differentiated argument)."""

    kind: str
    in_features: tuple[int, int, int]
    activation: str
    swiglu_alpha: float
    swiglu_limit: float


def _dequantized_experts(quantized, spec: _QuantizedExpertsSpec, dtype: Any) -> list[jax.Array]:
    """The [E, in, out] kernels in `dtype` from their codes and scales."""
    out = []
    for (codes, scale), n_in in zip(quantized, spec.in_features):
        one = functools.partial(dequantize_blockwise, kind=spec.kind, in_features=n_in, dtype=dtype)
        out.append(jax.vmap(one)(codes, scale))
    return out


def _quantized_experts_forward(x, ids, weights, quantized, biases, adapters, spec: _QuantizedExpertsSpec):
    # Tied to x, as `tempax.models.quant.quantized_matmul` ties its kernel: a scheduler may not dequantize every
    # layer's experts up front.
    x, quantized = jax.lax.optimization_barrier((x, quantized))
    gate, up, down = _dequantized_experts(quantized, spec, x.dtype)
    return ops.expert_products(x, ids, weights, gate, up, down, activation=spec.activation, gate_bias_ei=biases[0],
                               up_bias_ei=biases[1], down_bias_ed=biases[2], swiglu_alpha=spec.swiglu_alpha,
                               swiglu_limit=spec.swiglu_limit, gate_up_adapter=adapters[0], down_adapter=adapters[1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def quantized_expert_products(x, ids, weights, quantized, biases, adapters, spec: _QuantizedExpertsSpec) -> jax.Array:
    """`ops.expert_products` over kernels dequantized from `quantized` ((codes, scale) of gate, up, down), with
    gradients for the tokens x, the routing weights and the float LoRA `adapters` (gate_up, down: `ExpertAdapter`s
    or None) only: the codes, the scales and the experts' biases are frozen (QLoRA's base). The backward pass
    dequantizes again and recomputes the products instead of keeping a float copy of the experts from the forward
    to the backward pass (the memory QLoRA exists to save)."""
    return _quantized_experts_forward(x, ids, weights, quantized, biases, adapters, spec)


def _quantized_experts_fwd(x, ids, weights, quantized, biases, adapters, spec):
    return (_quantized_experts_forward(x, ids, weights, quantized, biases, adapters, spec),
            (x, ids, weights, quantized, biases, adapters))


def _quantized_experts_bwd(spec, residuals, g):
    x, ids, weights, quantized, biases, adapters = residuals
    g, quantized = jax.lax.optimization_barrier((g, quantized))
    _, vjp = jax.vjp(lambda x, w, a: _quantized_experts_forward(x, ids, w, quantized, biases, a, spec),
                     x, weights, adapters)
    d_x, d_weights, d_adapters = vjp(g)
    return d_x, None, d_weights, None, None, d_adapters


quantized_expert_products.defvjp(_quantized_experts_fwd, _quantized_experts_bwd)


class QuantizedRoutedExperts(nnx.Module):
    """`RoutedExperts` whose kernels are stored blockwise-quantized and frozen (`tempax.models.quant`: NF4 or int8,
    each expert's [in, out] kernel quantized on its own, as QLoRA quantizes a linear layer): a mixture of experts'
    QLoRA base, where the experts hold nearly all the weights. The same call; the kernels are dequantized inside
    the product (`quantized_expert_products`).

    Attributes:
      {gate,up,down}_proj_codes, {gate,up,down}_proj_scale: `QuantizedWeight`s [..., E, rows, out] with the logical
        axes of the kernel they stand for (a decoder's stack leads with "layers").
      {gate,up,down}_proj_bias: the experts' float biases (gpt-oss), frozen, or None.
    """

    def __init__(self, experts: RoutedExperts, *, kind: QuantKind = "nf4", block_size: int = 64):
        in_features = []
        for name in EXPERT_KERNELS:
            kernel = getattr(experts, name)
            w = kernel[...]
            flat = w.reshape(-1, *w.shape[-2:])
            codes, scale = jax.lax.map(lambda k: quantize_blockwise(k, kind=kind, block_size=block_size), flat)
            names = kernel.get_metadata().get("out_sharding")
            with nnx.use_eager_sharding(False):
                setattr(self, f"{name}_codes", QuantizedWeight(codes.reshape(*w.shape[:-2], *codes.shape[1:]),
                                                               out_sharding=names))
                setattr(self, f"{name}_scale", QuantizedWeight(scale.reshape(*w.shape[:-2], *scale.shape[1:]),
                                                               out_sharding=names))
            in_features.append(int(w.shape[-2]))
        self.gate_proj_bias, self.up_proj_bias, self.down_proj_bias = (
            experts.gate_proj_bias, experts.up_proj_bias, experts.down_proj_bias)
        self.kind, self.block_size = kind, block_size
        self.spec = _QuantizedExpertsSpec(kind, tuple(in_features), experts.activation,  # type: ignore[arg-type]
                                          experts.swiglu_alpha, experts.swiglu_limit)

    def dequantized(self, name: str, dtype: Any = jnp.float32) -> jax.Array:
        """The kernel `name` ("gate_proj", "up_proj", "down_proj") the codes stand for, [..., E, in, out]."""
        n_in = self.spec.in_features[EXPERT_KERNELS.index(name)]
        one = functools.partial(dequantize_blockwise, kind=self.kind, in_features=n_in, dtype=dtype)
        codes, scale = getattr(self, f"{name}_codes")[...], getattr(self, f"{name}_scale")[...]
        lead = codes.shape[:-2]
        flat = jax.vmap(one)(codes.reshape(-1, *codes.shape[-2:]), scale.reshape(-1, *scale.shape[-2:]))
        return flat.reshape(*lead, *flat.shape[-2:])

    def __call__(self, x_nd: jax.Array, expert_ids_nk: jax.Array, weights_nk: jax.Array, *,
                 gate_up_adapter: ExpertAdapter | None = None, down_adapter: ExpertAdapter | None = None) -> jax.Array:
        quantized = tuple((getattr(self, f"{n}_codes")[...], getattr(self, f"{n}_scale")[...]) for n in EXPERT_KERNELS)
        biases = tuple(None if b is None else b[...] for b in (self.gate_proj_bias, self.up_proj_bias,
                                                                self.down_proj_bias))
        return quantized_expert_products(x_nd, expert_ids_nk, weights_nk, quantized, biases,
                                         (gate_up_adapter, down_adapter), self.spec)


def _linear(i: int, o: int, names: tuple[str | None, str | None], *, dtype: Any, param_dtype: Any, rngs: nnx.Rngs,
            use_bias: bool = False) -> nnx.Linear:
    return nnx.Linear(i, o, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
                      dot_general=ops.projection_dot, kernel_init=_normal(names), bias_init=_zeros(names[1:]))


class SharedExpert(nnx.Module):
    """The dense gated MLP every token passes through beside the routed experts: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int, *, dtype: Any, param_dtype: Any, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gate_proj = _linear(hidden_size, intermediate_size, ("embed", "mlp"), **kw)
        self.up_proj = _linear(hidden_size, intermediate_size, ("embed", "mlp"), **kw)
        self.down_proj = _linear(intermediate_size, hidden_size, ("mlp", "embed"), **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(ops.gated(self.gate_proj(x), self.up_proj(x), "silu"))


class SparseMoeBlock(nnx.Module):
    """A sparse mixture-of-experts feed-forward block.

    For tokens x [N, D]:

        z = x W_r (+ b_r)                                  router logits [N, E], float32
        s = softmax(z) or sigmoid(z)                       scores (`MoeConfig.router_activation`)
        ids, w = top_k(s, k);  w /= sum(w) if normalize_top_k;  w *= routed_scaling
        y = sum_j w_j * expert_{ids_j}(x)                  `tempax.ops.experts.expert_products` (sorted, grouped)
            + [sigmoid(x w_g)] * shared_expert(x)          optional shared expert and its gate

    Gemma 4 (`MoeConfig.beside_dense_mlp`, `router_input_norm`, `per_expert_scale`) runs the block beside the dense
    MLP, which the block then holds; it is called with the pre-MLP norm's output x and the residual stream h it
    was computed from:

        z = (rms(h) * s_r * D^-0.5) W_r                    rms: RMS-normalised without a weight; s_r [D] learned
        ids, w = top_k(softmax(z), k);  w /= sum(w);  w_j *= c[ids_j]     c [E], the per-expert scales
        y = n_1(mlp(x)) + n_2(sum_j w_j * expert_{ids_j}(n_pre(h)))       n_1, n_2, n_pre: RMSNorms of the block

    Shazeer et al. 2017 (arXiv:1701.06538) for top-k gating, Fedus et al. 2021 (Switch Transformer, arXiv:2101.03961)
    for the load-balancing loss. gpt-oss routes with a softmax over its top-k logits, which is the renormalised top-k
    of the softmax (the same weights), so it is `normalize_top_k` here.

    What we do deliberately differently from transformers: router logits are computed in float32 whatever the
    compute dtype (transformers uses the model's dtype; in float32 the two agree), so bfloat16 training routes on
    full-precision scores. The experts run as three grouped products over the tokens sorted by expert, never as a
    loop over experts.

    Parameters ([in, out] kernels, logical axes for `tempax.parallel.rules`):

        gate.kernel [D, E] ("embed", None), gate.bias [E]           the router (transformers: `gate`; gpt-oss: `router`)
        experts.gate_proj, experts.up_proj [E, D, I]                ("expert", "embed", "mlp")
        experts.down_proj [E, I, D]                                 ("expert", "mlp", "embed")
        experts.{gate,up}_proj_bias [E, I], experts.down_proj_bias [E, D]    gpt-oss
        shared_expert.{gate,up,down}_proj.kernel, shared_expert_gate.kernel [D, 1]    Qwen2-MoE / Qwen3.5-MoE
        router_scale [D] ("norm"), per_expert_scale [E]                           Gemma 4 (router.scale, ...)
        {gate,up,down}_proj.kernel, the dense MLP [D, M] / [M, D]                Gemma 4 (the layer's mlp.*)
        dense_output_norm, experts_input_norm, experts_output_norm .weight [D]    Gemma 4 (post_feedforward_layernorm_1,
                                                                                  pre_ and post_feedforward_layernorm_2)

    Call: `y, router_logits = block(x)` for x [..., D] in the compute dtype (Gemma 4: `block(x, residual=h)`); y
    [..., D] in x's dtype, router logits [..., E] float32 (what `load_balancing_loss` / `router_statistics` read).
    """

    def __init__(self, moe: MoeConfig, hidden_size: int, *, dtype: Any, param_dtype: Any, rngs: nnx.Rngs,
                 dense_intermediate_size: int = 0, dense_activation: str = "silu", norm_eps: float = 1e-6,
                 norm_offset: bool = False):
        """`dense_intermediate_size`, `dense_activation`: the dense MLP a `beside_dense_mlp` block holds;
        `norm_eps`, `norm_offset`: its norms' and its router input norm's (`tempax.models.norm.RMSNorm`)."""
        if moe.beside_dense_mlp and dense_intermediate_size < 1:
            raise ConfigError("a sparse block beside the dense MLP needs the MLP's width (dense_intermediate_size)")
        with nnx.use_eager_sharding(False):  # as `Decoder.__init__` builds its layers: names now, placement later
            self._build(moe, hidden_size, dtype, param_dtype, rngs)
            self._build_gemma4(moe, hidden_size, dtype, param_dtype, rngs, dense_intermediate_size, norm_eps,
                               norm_offset)
        self.moe = moe
        self.dense_activation = dense_activation
        self.norm_eps = norm_eps

    def _build(self, moe: MoeConfig, hidden_size: int, dtype: Any, param_dtype: Any, rngs: nnx.Rngs) -> None:
        # The router runs in float32 (the class docstring); its kernel stays in the parameter dtype.
        self.gate = _linear(hidden_size, moe.num_experts, ("embed", None), dtype=jnp.float32,
                            param_dtype=param_dtype, rngs=rngs, use_bias=moe.router_bias)
        self.experts = RoutedExperts(moe, hidden_size, param_dtype=param_dtype, rngs=rngs)
        if moe.shared_expert_intermediate_size:
            self.shared_expert = SharedExpert(hidden_size, moe.shared_expert_intermediate_size, dtype=dtype,
                                              param_dtype=param_dtype, rngs=rngs)
        else:
            self.shared_expert = None
        if moe.shared_expert_gate:
            self.shared_expert_gate = _linear(hidden_size, 1, ("embed", None), dtype=dtype, param_dtype=param_dtype,
                                              rngs=rngs)
        else:
            self.shared_expert_gate = None

    def _build_gemma4(self, moe: MoeConfig, hidden_size: int, dtype: Any, param_dtype: Any, rngs: nnx.Rngs,
                      dense: int, eps: float, offset: bool) -> None:
        """The router's input scale and per-expert scales, and beside the dense MLP that MLP and the three norms
        (None where the config has none): Gemma 4's."""
        ones = lambda names, n: nnx.Param(  # noqa: E731
            nnx.with_partitioning(nnx.initializers.ones, names)(rngs.params(), (n,), param_dtype))
        self.router_scale = ones(("norm",), hidden_size) if moe.router_input_norm else None
        self.per_expert_scale = ones((None,), moe.num_experts) if moe.per_expert_scale else None
        if not moe.beside_dense_mlp:
            self.gate_proj = self.up_proj = self.down_proj = None
            self.dense_output_norm = self.experts_input_norm = self.experts_output_norm = None
            return
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gate_proj = _linear(hidden_size, dense, ("embed", "mlp"), **kw)
        self.up_proj = _linear(hidden_size, dense, ("embed", "mlp"), **kw)
        self.down_proj = _linear(dense, hidden_size, ("mlp", "embed"), **kw)
        norm = dict(eps=eps, offset=offset, param_dtype=param_dtype, rngs=rngs)
        self.dense_output_norm = RMSNorm(hidden_size, **norm)
        self.experts_input_norm = RMSNorm(hidden_size, **norm)
        self.experts_output_norm = RMSNorm(hidden_size, **norm)

    def _router_input(self, h_nd: jax.Array) -> jax.Array:
        """What the router reads: the tokens, or Gemma 4's rms(h) * s_r * D^-0.5 (float32)."""
        if self.router_scale is None:
            return h_nd
        scale = self.router_scale[...].astype(jnp.float32) * h_nd.shape[-1] ** -0.5
        return rms_normalized(h_nd, self.norm_eps) * scale

    def __call__(self, x: jax.Array, residual: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """`residual`: the residual stream h the (normed) input x was computed from, which a block beside the dense
        MLP routes and sends to its experts (Gemma 4); ignored otherwise."""
        moe = self.moe
        lead, d = x.shape[:-1], x.shape[-1]
        x_nd = x.reshape(-1, d)
        if moe.beside_dense_mlp:
            if residual is None:
                raise ValueError("a sparse block beside the dense MLP reads the residual stream: pass residual=h")
            h_nd = residual.reshape(-1, d)
        else:
            h_nd = x_nd
        router_logits = self.gate(self._router_input(h_nd))  # [N, E] float32
        weights, ids = route(router_logits, experts_per_token=moe.experts_per_token,
                             activation=moe.router_activation, normalize=moe.normalize_top_k,
                             scaling=moe.routed_scaling,
                             expert_scale=None if self.per_expert_scale is None else self.per_expert_scale[...])
        if moe.beside_dense_mlp:
            routed = self.experts(self.experts_input_norm(h_nd), ids, weights)
            dense = self.down_proj(ops.gated(self.gate_proj(x_nd), self.up_proj(x_nd), self.dense_activation))
            y = self.dense_output_norm(dense) + self.experts_output_norm(routed).astype(dense.dtype)
            return y.reshape(*lead, d), router_logits.reshape(*lead, moe.num_experts)
        y = self.experts(x_nd, ids, weights)
        if self.shared_expert is not None:
            shared = self.shared_expert(x_nd)
            if self.shared_expert_gate is not None:
                shared = jax.nn.sigmoid(self.shared_expert_gate(x_nd)) * shared
            y = y + shared.astype(y.dtype)
        return y.reshape(*lead, d), router_logits.reshape(*lead, moe.num_experts)


# --------------------------------------------------------------------------------------------------------------
# Hugging Face tensor names

HfMoeFamily = Literal["qwen3_moe", "qwen2_moe", "mixtral", "gpt_oss", "qwen3_5_moe", "gemma4"]
HF_MOE_FAMILIES: tuple[str, ...] = ("qwen3_moe", "qwen2_moe", "mixtral", "gpt_oss", "qwen3_5_moe", "gemma4")
Part = Literal["all", "first_half", "second_half", "even", "odd"]


@dataclass(frozen=True)
class MoeTensorSlot:
    """Where one Hugging Face tensor of a layer's MoE block, or a part of it, lives among the block's parameters.

    Attributes:
      path: the parameter inside `SparseMoeBlock`, e.g. ("experts", "gate_proj") or ("gate", "kernel").
      expert: the tensor is this expert's row of a stacked [E, ...] parameter; None: the whole parameter.
      part: which part of the tensor's output axis: "all"; "first_half" / "second_half" (transformers' fused
        gate_up_proj of Qwen and Mixtral, gate then up); "even" / "odd" (gpt-oss's interleaved gate_up_proj).
      transpose: the tensor is [..., out, in] (a torch Linear weight); the parameter [..., in, out].
    """

    path: tuple[str, ...]
    expert: int | None = None
    part: Part = "all"
    transpose: bool = False


@dataclass(frozen=True)
class _Rule:
    name: str  # layer-relative Hugging Face name; "{expert}" stands for the expert index
    slots: tuple[tuple[tuple[str, ...], Part], ...]
    transpose: bool
    written: bool  # what transformers' save_pretrained writes (export writes these names)


def _per_expert(prefix: str, names: Mapping[str, str]) -> tuple[_Rule, ...]:
    return tuple(_Rule(f"{prefix}.experts.{{expert}}.{hf}.weight", ((("experts", ours), "all"),), True, True)
                 for hf, ours in names.items())


def _fused_qwen_layout(prefix: str, written: bool) -> tuple[_Rule, ...]:
    """transformers 5's in-memory experts of Qwen and Mixtral: gate_up_proj [E, 2I, D] (gate rows, then up rows)
    and down_proj [E, D, I]."""
    return (
        _Rule(f"{prefix}.experts.gate_up_proj",
              ((("experts", "gate_proj"), "first_half"), (("experts", "up_proj"), "second_half")), True, written),
        _Rule(f"{prefix}.experts.down_proj", ((("experts", "down_proj"), "all"),), True, written),
    )


_QWEN = (
    _Rule("mlp.gate.weight", ((("gate", "kernel"), "all"),), True, True),
    *_per_expert("mlp", {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}),
    *_fused_qwen_layout("mlp", written=False),
)
_RULES: dict[str, tuple[_Rule, ...]] = {
    "qwen3_moe": _QWEN,
    "qwen2_moe": _QWEN + tuple(
        _Rule(f"mlp.shared_expert.{p}.weight", ((("shared_expert", p, "kernel"), "all"),), True, True)
        for p in ("gate_proj", "up_proj", "down_proj")
    ) + (_Rule("mlp.shared_expert_gate.weight", ((("shared_expert_gate", "kernel"), "all"),), True, True),),
    "mixtral": (
        _Rule("block_sparse_moe.gate.weight", ((("gate", "kernel"), "all"),), True, True),
        *_per_expert("block_sparse_moe", {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}),
        # transformers 5 renames block_sparse_moe to mlp and fuses the experts in memory
        _Rule("mlp.gate.weight", ((("gate", "kernel"), "all"),), True, False),
        *_fused_qwen_layout("mlp", written=False),
    ),
    "gpt_oss": (
        _Rule("mlp.router.weight", ((("gate", "kernel"), "all"),), True, True),
        _Rule("mlp.router.bias", ((("gate", "bias"), "all"),), False, True),
        _Rule("mlp.experts.gate_up_proj", ((("experts", "gate_proj"), "even"), (("experts", "up_proj"), "odd")),
              False, True),
        _Rule("mlp.experts.gate_up_proj_bias",
              ((("experts", "gate_proj_bias"), "even"), (("experts", "up_proj_bias"), "odd")), False, True),
        _Rule("mlp.experts.down_proj", ((("experts", "down_proj"), "all"),), False, True),
        _Rule("mlp.experts.down_proj_bias", ((("experts", "down_proj_bias"), "all"),), False, True),
    ),
}


_RULES["qwen3_5_moe"] = _RULES["qwen2_moe"]  # Qwen3.5-MoE's files name its experts as Qwen2-MoE's do
# Gemma 4: the router and the experts sit in the decoder layer itself, beside the dense MLP (`mlp.*`, which the
# block holds) and the norms of the two sides; the experts fused as transformers 5 keeps Qwen's in memory
_RULES["gemma4"] = (
    _Rule("router.proj.weight", ((("gate", "kernel"), "all"),), True, True),
    _Rule("router.scale", ((("router_scale",), "all"),), False, True),
    _Rule("router.per_expert_scale", ((("per_expert_scale",), "all"),), False, True),
    _Rule("experts.gate_up_proj", ((("experts", "gate_proj"), "first_half"), (("experts", "up_proj"), "second_half")),
          True, True),
    _Rule("experts.down_proj", ((("experts", "down_proj"), "all"),), True, True),
    *(_Rule(f"mlp.{p}.weight", (((p, "kernel"), "all"),), True, True) for p in ("gate_proj", "up_proj", "down_proj")),
    *(_Rule(f"{hf}.weight", (((ours, "weight"), "all"),), False, True) for hf, ours in (
        ("post_feedforward_layernorm_1", "dense_output_norm"), ("pre_feedforward_layernorm_2", "experts_input_norm"),
        ("post_feedforward_layernorm_2", "experts_output_norm"))),
)


def _pattern(rule: _Rule) -> re.Pattern[str]:
    return re.compile("^" + re.escape(rule.name).replace(re.escape("{expert}"), r"(\d+)") + "$")


_PATTERNS = {family: tuple((_pattern(r), r) for r in rules) for family, rules in _RULES.items()}


def _check_family(family: str) -> None:
    if family not in _RULES:
        raise CheckpointError(f"no mixture-of-experts tensor names for family {family!r} "
                              f"(known: {', '.join(HF_MOE_FAMILIES)})")


def hf_moe_tensor_to_path(name: str, family: HfMoeFamily) -> tuple[MoeTensorSlot, ...] | None:
    """Where a Hugging Face tensor of a decoder layer's MoE block goes: its slots among the `SparseMoeBlock`'s
    parameters, or None when `name` is not an MoE tensor of `family`.

    `name` is relative to the layer (the part after "model.layers.{i}."), e.g. "mlp.experts.5.up_proj.weight".
    Both the names transformers writes (per-expert tensors for Qwen and Mixtral; fused, interleaved gate_up_proj
    for gpt-oss) and transformers 5's in-memory names (fused gate_up_proj [E, 2I, D] for Qwen and Mixtral) are
    read. MXFP4-quantized gpt-oss experts (`*_blocks` / `*_scales`) raise a `CheckpointError`.
    """
    _check_family(family)
    if family == "gpt_oss" and re.search(r"\.experts\.\w+_(blocks|scales)$", name):
        raise CheckpointError(
            f"tensor {name!r} holds MXFP4-quantized gpt-oss experts, which tempax does not read; load the checkpoint "
            "in transformers with Mxfp4Config(dequantize=True), save_pretrained it, and load that folder")
    for pattern, rule in _PATTERNS[family]:
        m = pattern.match(name)
        if m:
            expert = int(m.group(1)) if m.groups() else None
            return tuple(MoeTensorSlot(path, expert, part, rule.transpose) for path, part in rule.slots)
    return None


def moe_path_to_hf(path: tuple[str, ...], family: HfMoeFamily, num_experts: int) -> tuple[
        tuple[str, MoeTensorSlot], ...]:
    """Inverse of `hf_moe_tensor_to_path` for the names transformers writes: every (layer-relative Hugging Face
    name, slot) a `SparseMoeBlock` parameter fills (one per expert for per-expert checkpoints)."""
    _check_family(family)
    found = []
    for rule in _RULES[family]:
        if not rule.written:
            continue
        for slot_path, part in rule.slots:
            if slot_path != path:
                continue
            if "{expert}" in rule.name:
                found += [(rule.name.format(expert=e), MoeTensorSlot(path, e, part, rule.transpose))
                          for e in range(num_experts)]
            else:
                found.append((rule.name, MoeTensorSlot(path, None, part, rule.transpose)))
    if not found:
        raise KeyError(f"no Hugging Face name for MoE parameter {path} in family {family!r}")
    return tuple(found)


def _out_axis(slot: MoeTensorSlot) -> int:
    return -2 if slot.transpose else -1


def _region(tensor: np.ndarray, slot: MoeTensorSlot) -> np.ndarray:
    """The view of a Hugging Face tensor that `slot` covers, still in the tensor's layout."""
    axis = _out_axis(slot) % tensor.ndim
    n = tensor.shape[axis]
    picks = {"all": slice(None), "first_half": slice(0, n // 2), "second_half": slice(n // 2, None),
             "even": slice(0, None, 2), "odd": slice(1, None, 2)}
    index = [slice(None)] * tensor.ndim
    index[axis] = picks[slot.part]
    return tensor[tuple(index)]


def _as_param_layout(a: np.ndarray, slot: MoeTensorSlot) -> np.ndarray:
    return np.swapaxes(a, -1, -2) if slot.transpose else a


def fill_slot(param: np.ndarray, slot: MoeTensorSlot, tensor: np.ndarray, *, name: str = "tensor") -> None:
    """Writes a Hugging Face tensor (its `slot` part) into the parameter buffer `param` in place, checking shapes:
    one tensor at a time, as a streaming loader reads a checkpoint."""
    value = _as_param_layout(_region(np.asarray(tensor), slot), slot)
    target = param if slot.expert is None else param[slot.expert]
    if value.shape != target.shape:
        raise CheckpointError(f"{name} {'' if slot.part == 'all' else f'({slot.part}) '}has shape "
                              f"{tuple(value.shape)} in tempax's layout but {'.'.join(slot.path)}"
                              f"{'' if slot.expert is None else f'[{slot.expert}]'} is {tuple(target.shape)}; "
                              "the config and the weights disagree")
    target[...] = value


def hf_moe_tensors_to_params(tensors: Mapping[str, np.ndarray], family: HfMoeFamily,
                             shapes: Mapping[tuple[str, ...], tuple[int, ...]]) -> dict[tuple[str, ...], np.ndarray]:
    """One layer's MoE parameters from its Hugging Face tensors (layer-relative names; others are ignored).

    `shapes` gives each parameter's shape (from the block); every parameter must be filled entirely, or a
    `CheckpointError` names what is missing.
    """
    params = {path: np.zeros(shape, np.result_type(*(np.asarray(t).dtype for t in tensors.values())))
              for path, shape in shapes.items()}
    filled: dict[tuple[str, ...], set[int | None]] = {path: set() for path in shapes}
    for name, tensor in tensors.items():
        for slot in hf_moe_tensor_to_path(name, family) or ():
            if slot.path not in params:
                raise CheckpointError(f"tensor {name!r} has no place in this MoE block ({'.'.join(slot.path)} "
                                      "is not one of its parameters); the checkpoint and its config disagree")
            fill_slot(params[slot.path], slot, tensor, name=repr(name))
            filled[slot.path].add(slot.expert)
    for path, shape in shapes.items():
        whole = None in filled[path] or filled[path] >= set(range(shape[0]))
        if not whole:
            missing = sorted(set(range(shape[0])) - filled[path])
            raise CheckpointError(f"MoE parameter {'.'.join(path)} is missing from the tensors "
                                  f"(experts {missing[:8]}{'...' if len(missing) > 8 else ''} not found)")
    return params


def moe_params_to_hf_tensors(params: Mapping[tuple[str, ...], np.ndarray],
                             family: HfMoeFamily) -> dict[str, np.ndarray]:
    """One layer's Hugging Face tensors (layer-relative names, as transformers' `save_pretrained` writes them)
    from its MoE parameters (inverse of `hf_moe_tensors_to_params`)."""
    out: dict[str, np.ndarray] = {}
    for path, value in params.items():
        value = np.asarray(value)
        num_experts = value.shape[0] if path[0] == "experts" else 0
        for name, slot in moe_path_to_hf(path, family, num_experts):
            piece = _as_param_layout(value if slot.expert is None else value[slot.expert], slot)
            if name not in out:
                shape = list(piece.shape)
                if slot.part != "all":
                    shape[_out_axis(slot) % len(shape)] *= 2
                out[name] = np.zeros(shape, value.dtype)
            _region(out[name], slot)[...] = piece
    return out


def moe_param_shapes(block: SparseMoeBlock) -> dict[tuple[str, ...], tuple[int, ...]]:
    """{parameter path inside the block: shape} of a `SparseMoeBlock` (for `hf_moe_tensors_to_params`)."""
    return {tuple(str(p) for p in path): tuple(var.shape) for path, var in nnx.iter_graph(block)
            if isinstance(var, nnx.Param)}


def block_params(block: SparseMoeBlock) -> dict[tuple[str, ...], np.ndarray]:
    """{parameter path inside the block: value} of a `SparseMoeBlock` as numpy arrays."""
    return {tuple(str(p) for p in path): np.asarray(var[...]) for path, var in nnx.iter_graph(block)
            if isinstance(var, nnx.Param)}


def load_block_params(block: SparseMoeBlock, params: Mapping[tuple[str, ...], np.ndarray]) -> None:
    """Assigns {path: value} (from `hf_moe_tensors_to_params`) to a block's parameters, in their dtypes."""
    table = {tuple(str(p) for p in path): var for path, var in nnx.iter_graph(block) if isinstance(var, nnx.Param)}
    for path, value in params.items():
        var = table[path]
        var[...] = jnp.asarray(value, var.dtype)


# --------------------------------------------------------------------------------------------------------------
# PEFT's names and layout for LoRA on the experts and the router


@dataclass(frozen=True)
class PeftMoeNames:
    """Where PEFT (with transformers 5's modules) puts LoRA on a layer's MoE block, layer-relative.

    Attributes:
      router: the router module ("mlp.gate"; gpt-oss "mlp.router"; Gemma 4 "router.proj"), adapted through its
        `weight` [E, D].
      experts: the experts module ("mlp.experts"; Gemma 4 "experts") holding gate_up_proj and down_proj, adapted
        as `target_parameters`.
      gate_up: how gate_up_proj's output axis holds the gate and up kernels: "halves" (gate rows, then up rows:
        Qwen, Mixtral) or "interleaved" (even gate, odd up: gpt-oss).
    """

    router: str
    experts: str
    gate_up: Literal["halves", "interleaved"]


_PEFT_NAMES = {"qwen3_moe": PeftMoeNames("mlp.gate", "mlp.experts", "halves"),
               "qwen2_moe": PeftMoeNames("mlp.gate", "mlp.experts", "halves"),
               "mixtral": PeftMoeNames("mlp.gate", "mlp.experts", "halves"),  # transformers 5 renames block_sparse_moe
               "gpt_oss": PeftMoeNames("mlp.router", "mlp.experts", "interleaved"),
               "qwen3_5_moe": PeftMoeNames("mlp.gate", "mlp.experts", "halves"),
               "gemma4": PeftMoeNames("router.proj", "experts", "halves")}


def peft_moe_names(family: str) -> PeftMoeNames:
    """The `PeftMoeNames` of a family; a `CheckpointError` for one without them."""
    _check_family(family)
    return _PEFT_NAMES[family]


def expert_lora_to_peft(a_eir: np.ndarray, b_ero: np.ndarray, gate_up: str | None = None) -> tuple[
        np.ndarray, np.ndarray]:
    """PEFT's (lora_A.weight [E * r, in], lora_B.weight [out, r * E]) of one layer's expert adapters a [E, in, r],
    b [E, r, out] (tempax's layout; for gate_up_proj the gate's columns first).

    PEFT's `ParamWrapper` keeps the E experts' adapters as one Linear pair: A's rows expert-major (row e * r + j is
    A_e's row j), B's columns rank-major (column j * E + e is B_e's column j), so expert e's update is
    B_e A_e in the torch [out, in] orientation, (A_e B_e)^T of tempax's. `gate_up` ("halves" / "interleaved")
    orders gate_up_proj's output axis as the family's fused parameter does."""
    num_experts, n_in, rank = a_eir.shape
    if gate_up == "interleaved":
        inner = b_ero.shape[-1] // 2
        fused = np.empty_like(b_ero)
        fused[..., 0::2], fused[..., 1::2] = b_ero[..., :inner], b_ero[..., inner:]
        b_ero = fused
    lora_a = np.transpose(a_eir, (0, 2, 1)).reshape(num_experts * rank, n_in)
    lora_b = np.transpose(b_ero, (2, 1, 0)).reshape(b_ero.shape[-1], rank * num_experts)
    return np.ascontiguousarray(lora_a), np.ascontiguousarray(lora_b)


def expert_lora_from_peft(lora_a: np.ndarray, lora_b: np.ndarray, num_experts: int,
                          gate_up: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of `expert_lora_to_peft`: (a [E, in, r], b [E, r, out]) from PEFT's lora_A / lora_B weights."""
    rank = lora_a.shape[0] // num_experts
    a_eir = np.transpose(lora_a.reshape(num_experts, rank, lora_a.shape[-1]), (0, 2, 1))
    b_ero = np.transpose(lora_b.reshape(lora_b.shape[0], rank, num_experts), (2, 1, 0))
    if gate_up == "interleaved":
        b_ero = np.concatenate([b_ero[..., 0::2], b_ero[..., 1::2]], axis=-1)
    return np.ascontiguousarray(a_eir), np.ascontiguousarray(b_ero)


def hf_layer_tensors(tensors: Iterable[tuple[str, np.ndarray]], layer: int) -> dict[str, np.ndarray]:
    """The tensors of decoder layer `layer` with layer-relative names ("model.layers.{layer}." removed)."""
    prefix = f"model.layers.{layer}."
    return {name[len(prefix):]: t for name, t in tensors if name.startswith(prefix)}


__all__ = ["EXPERT_KERNELS", "HF_MOE_FAMILIES", "HfMoeFamily", "MoeTensorSlot", "PeftMoeNames",
           "QuantizedRoutedExperts", "RecordedRouting", "RoutedExperts", "RouterStatistics", "SharedExpert",
           "SparseMoeBlock", "block_params", "expert_lora_from_peft", "expert_lora_to_peft", "fill_slot",
           "hf_layer_tensors", "hf_moe_tensor_to_path", "hf_moe_tensors_to_params", "is_recording_router_statistics",
           "load_balancing_loss", "load_balancing_loss_from_statistics", "load_block_params", "moe_param_shapes",
           "moe_params_to_hf_tensors", "moe_path_to_hf", "not_recording_router_statistics", "peft_moe_names",
           "quantized_expert_products", "record_router_statistics", "recording_router_statistics", "route",
           "router_aux_loss", "router_statistics", "with_router_aux_loss"]
