"""One decoder-only transformer for every supported family (Flax NNX).

Module and parameter names follow Hugging Face's (`layers[i].self_attn.q_proj`, `mlp.gate_proj`,
`input_layernorm`, ...) so checkpoint mapping is a rename plus a transpose, and LoRA targets are matched by the
names users already know. Linear kernels are stored [in, out]; every parameter carries logical sharding axis
names (`vocab`, `embed`, `q_heads`, `kv_heads`, `mlp`, `norm`) that `tempax.parallel` maps to a mesh.

Attention masking is expressed with segment ids instead of a boolean mask: `segment_ids[b, t]` is 0 for
padding and 1..n for the packed examples of a row, so a token attends to earlier tokens (by array index) of the
same segment. Left-padded batches, packed sequences and the KV cache all reduce to this one rule.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from tempax.models.attention_bf16 import bf16_attention
from tempax.models.cache import KVCache
from tempax.models.config import ModelConfig, RopeConfig
from tempax.models.fast_decode import project
from tempax.parallel.rules import shard

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def as_dtype(name: str | Any) -> Any:
    if isinstance(name, str):
        return _DTYPES[name]
    return name


def _init(names: tuple[str, ...], scale: float = 0.02) -> Any:
    return nnx.with_partitioning(nnx.initializers.normal(scale), names)


BF16 = jnp.dtype(jnp.bfloat16)


def _f32_dot(lhs: jax.Array, rhs: jax.Array, lhs_dim: int, rhs_dim: int) -> jax.Array:
    return jax.lax.dot_general(lhs, rhs, (((lhs_dim,), (rhs_dim,)), ((), ())), preferred_element_type=jnp.float32)


def _rows(a: jax.Array) -> jax.Array:
    return a.reshape(-1, a.shape[-1])


def row_major_transpose(x_mk: jax.Array) -> jax.Array:
    """x^T [K, M] materialised row-major, e.g. for a bf16 weight gradient's left operand.

    A plain `x.T` is folded into the dot (contracting axis major again: the float32-upcast path). Reversing an
    axis twice is the identity, but XLA:CPU's bf16 dot check runs before the simplifier, so it sees a row-major
    [K, M] operand; one transposing copy remains. tests/models/test_projection_bf16.py checks the compiled dots' types.
    The copy is made in float32 behind an optimization barrier, then cast back: XLA:CPU transposed bf16 elements
    about 7x slower than float32 ones ([2048, 1536]: 4.9 ms against 0.7 ms for the float32 round trip, AMD EPYC
    Zen 5), and without the barrier the simplifier drops the round trip and leaves a bf16 dot XLA cannot run.
    """
    x_km = jax.lax.optimization_barrier(jnp.flip(jnp.flip(x_mk.astype(jnp.float32).T, 1), 1))
    return x_km.astype(x_mk.dtype)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _project(x: jax.Array, kernel: jax.Array, bf16: bool) -> jax.Array:
    return _project_fwd(x, kernel, bf16)[0]


def _project_fwd(x, kernel, bf16):
    if not bf16:
        return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ()))), (x, kernel)
    xc, wc = x.astype(BF16), kernel.astype(BF16)  # the kernel's bf16 copy, made once and kept for the backward
    # Zero-size arrays carry the primal dtypes into the backward pass (residuals must be arrays).
    return _f32_dot(xc, wc, x.ndim - 1, 0).astype(x.dtype), (xc, wc, jnp.zeros((0,), x.dtype),
                                                              jnp.zeros((0,), kernel.dtype))


def _project_bwd(bf16, residuals, g):
    if not bf16:
        x, kernel = residuals
        d_x = jax.lax.dot_general(g, kernel, (((g.ndim - 1,), (1,)), ((), ())))
        d_kernel = jax.lax.dot_general(_rows(x), _rows(g), (((0,), (0,)), ((), ())))
        return d_x, d_kernel
    xc, wc, x_like, kernel_like = residuals
    gc = g.astype(BF16)
    d_x = _f32_dot(gc, wc, gc.ndim - 1, 1).astype(x_like.dtype)
    d_kernel = _f32_dot(row_major_transpose(_rows(xc)), _rows(gc), 1, 0).astype(kernel_like.dtype)
    return d_x, d_kernel


_project.defvjp(_project_fwd, _project_bwd)


def projection_dot(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, out_sharding=None):
    """`lax.dot_general` for the projections' x [..., in] @ kernel [in, out], with the kernel's gradient made as
    x^T g over all tokens at once, [in, tokens] x [tokens, out].

    Plain autodiff of the same product builds that gradient transposed, as (g^T x)^T, and XLA:CPU then copies
    every [tokens, out] g into [out, tokens] first, at about 1 GB/s: a large share of a training step
    (`bench/profile_step.py`). Written this way XLA multiplies both operands in the layout they have. Other
    products (other dimension numbers, a requested output type or sharding) go to `lax.dot_general` unchanged.

    A bfloat16 x (`train.precision=bf16`) makes all three products bf16 x bf16 with float32 accumulation: the
    kernel (float32 master, left uncast by `keep_kernel_dtype`) is cast to bf16 once and that copy reused by the
    backward; y and d x come out in x's dtype, d kernel in the kernel's (float32 for a float32 master). XLA:CPU
    (jaxlib 0.10) runs a bf16 dot at bf16 speed only when it asks for a float32 result and its left operand's
    contracting axis is the minor one; otherwise it upcasts both operands to float32 first, so the weight
    gradient contracts a row-major x^T (`row_major_transpose`) rather than autodiff's token axis. GFLOP/s of
    each form: `python bench/bf16_matmul.py`, recorded in `docs/measurements/performance-history.md`.
    """
    plain = (((lhs.ndim - 1,), (0,)), ((), ()))
    bf16 = lhs.dtype == BF16 and jnp.issubdtype(rhs.dtype, jnp.floating)
    if (dimension_numbers != plain or rhs.ndim != 2 or (lhs.dtype != rhs.dtype and not bf16)
            or precision is not None or preferred_element_type not in (None, lhs.dtype) or out_sharding is not None):
        return jax.lax.dot_general(lhs, rhs.astype(lhs.dtype) if bf16 else rhs, dimension_numbers,
                                   precision=precision, preferred_element_type=preferred_element_type,
                                   out_sharding=out_sharding)
    return _project(lhs, rhs, bf16)


def keep_kernel_dtype(arrays: tuple[Any, ...], *, dtype: Any = None, inexact: bool = True) -> tuple[Any, ...]:
    """`nnx.Linear(promote_dtype=...)` for bf16 compute: casts the input (and bias) to `dtype` and leaves the
    kernel in its float32 master dtype, so `projection_dot` returns the kernel's gradient in float32."""
    del inexact
    inputs, kernel, *rest = arrays
    cast = lambda a: a if a is None or dtype is None else jnp.asarray(a, dtype)  # noqa: E731
    return (cast(inputs), kernel, *(cast(a) for a in rest))


def matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """x [..., in] @ kernel [in, out] through `projection_dot` (the kernel's gradient without transposing copies)."""
    return projection_dot(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


class RMSNorm(nnx.Module):
    """y = x / sqrt(mean(x^2) + eps) * w, or * (1 + w) for Gemma (`offset`); computed in float32."""

    def __init__(self, dim: int, *, eps: float, offset: bool, param_dtype: Any, rngs: nnx.Rngs):
        init = nnx.initializers.zeros if offset else nnx.initializers.ones
        self.weight = nnx.Param(nnx.with_partitioning(init, ("norm",))(rngs.params(), (dim,), param_dtype))
        self.eps = eps
        self.offset = offset

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        w = self.weight[...].astype(jnp.float32)
        if self.offset:
            w = 1.0 + w
        return (y * w).astype(x.dtype)


def rope_inverse_frequencies(rope: RopeConfig, head_dim: int) -> jax.Array:
    """inv_freq[i] = theta^(-2i/d), then the family's scaling (linear: / factor; llama3: per-band rescale)."""
    inv = 1.0 / (rope.theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    if rope.scaling == "linear":
        inv = inv / rope.factor
    elif rope.scaling == "llama3":
        old = rope.original_max_position_embeddings
        low_wavelen = old / rope.low_freq_factor
        high_wavelen = old / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = jnp.where(wavelen > low_wavelen, inv / rope.factor, inv)
        smooth = (old / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = jnp.where(medium, smoothed, scaled)
    return inv


def apply_rope(x_btnh: jax.Array, positions_bt: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotate-half RoPE: x*cos + rotate_half(x)*sin with angles positions * inv_freq (Su et al. 2021)."""
    angles = positions_bt[..., None].astype(jnp.float32) * inv_freq  # [B, T, H/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x32 = x_btnh.astype(jnp.float32)
    half = x32.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rotated * sin).astype(x_btnh.dtype)


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
    return x if cap is None else cap * jnp.tanh(x / cap)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, layer_index: int, *, rngs: nnx.Rngs):
        pd, dt = as_dtype(cfg.param_dtype), as_dtype(cfg.dtype)
        d, h, n, k = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads

        def linear(i: int, o: int, names: tuple[str, str], bias: bool) -> nnx.Linear:
            return nnx.Linear(
                i, o, use_bias=bias, dtype=dt, param_dtype=pd, rngs=rngs, dot_general=projection_dot,
                kernel_init=_init(names), bias_init=nnx.with_partitioning(nnx.initializers.zeros, names[1:]),
            )

        self.q_proj = linear(d, n * h, ("embed", "q_heads"), cfg.qkv_bias)
        self.k_proj = linear(d, k * h, ("embed", "kv_heads"), cfg.qkv_bias)
        self.v_proj = linear(d, k * h, ("embed", "kv_heads"), cfg.qkv_bias)
        self.o_proj = linear(n * h, d, ("q_heads", "embed"), cfg.o_bias)
        if cfg.qk_norm:
            kw = dict(eps=cfg.rms_norm_eps, offset=cfg.norm_offset, param_dtype=pd, rngs=rngs)
            self.q_norm = RMSNorm(h, **kw)
            self.k_norm = RMSNorm(h, **kw)
        else:
            self.q_norm = None
            self.k_norm = None
        self.num_heads, self.num_kv_heads, self.head_dim = n, k, h
        self.scale = cfg.attn_scale
        self.softcap = cfg.attn_logit_softcap
        self.window = cfg.sliding_window if cfg.layer_type(layer_index) == "sliding" else None
        self.attention_impl = cfg.attention_impl
        self.rope = cfg.rope_for(layer_index)  # static; inverse frequencies are constant-folded under jit

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        q_index: jax.Array,
        q_segments: jax.Array,
        kv: tuple[jax.Array, jax.Array, jax.Array, jax.Array] | None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """Attends x [B,T,D] to itself, or to the cache `kv` = (k, v, k_segments, write_at) when decoding."""
        b, t, _ = x.shape
        n, k, h = self.num_heads, self.num_kv_heads, self.head_dim
        q, key, val = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, key, val = q.reshape(b, t, n, h), key.reshape(b, t, k, h), val.reshape(b, t, k, h)
        if self.q_norm is not None:
            q, key = self.q_norm(q), self.k_norm(key)
        inv_freq = rope_inverse_frequencies(self.rope, h)
        q, key = apply_rope(q, positions, inv_freq), apply_rope(key, positions, inv_freq)
        new_kv = None
        if kv is None:
            keys, vals, k_segments, k_index = key, val, q_segments, q_index
        else:
            cache_k, cache_v, k_segments, write_at = kv  # [B, K, S, H] buffers (see KVCache)
            heads_first = lambda x, buf: x.swapaxes(1, 2).astype(buf.dtype)  # noqa: E731
            keys = jax.lax.dynamic_update_slice(cache_k, heads_first(key, cache_k), (0, 0, write_at, 0))
            vals = jax.lax.dynamic_update_slice(cache_v, heads_first(val, cache_v), (0, 0, write_at, 0))
            new_kv = (keys, vals)
            k_index = jnp.arange(keys.shape[2])
            keys, vals = keys.astype(q.dtype), vals.astype(q.dtype)
        if kv is None and self.attention_impl != "tempax":  # a forward pass (training, scoring): no cache
            mask = attention_mask(q_index, k_index, q_segments, k_segments, self.window)
            out = library_attention(q, keys, vals, mask, scale=self.scale, implementation=self.attention_impl)
        else:
            out = attention(
                q, keys, vals, q_index=q_index, k_index=k_index, q_segments=q_segments, k_segments=k_segments,
                scale=self.scale, logit_cap=self.softcap, window=self.window, kv_heads_first=kv is not None,
            )
        out = out.reshape(b, t, n * h)
        return self.o_proj(out), new_kv


def attention(
    q_btnh: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    q_index: jax.Array,
    k_index: jax.Array,
    q_segments: jax.Array,
    k_segments: jax.Array,
    scale: float,
    logit_cap: float | None = None,
    window: int | None = None,
    kv_heads_first: bool = False,
) -> jax.Array:
    """Grouped-query attention with causal + segment (+ sliding-window) masking.

    q is [B, T, N, H]; k and v are [B, S, K, H], or [B, K, S, H] with `kv_heads_first` (the KV cache's layout).
    A query at index i in segment s sees key j when j <= i, segment(j) == s != 0 and (window) i - j < window.
    Scores and softmax are in float32. Fully masked query rows (padding) get a uniform, finite distribution.
    bfloat16 q, k, v [B, S, K, H] (`train.precision=bf16`) go to `bf16_attention`, whose products, forward and
    backward, all run on XLA:CPU's bf16 kernels.
    """
    b, t, n, h = q_btnh.shape
    kh = k.shape[1] if kv_heads_first else k.shape[2]
    kv = "bksh" if kv_heads_first else "bskh"
    g = n // kh
    mask = attention_mask(q_index, k_index, q_segments, k_segments, window)
    if not kv_heads_first and q_btnh.dtype == k.dtype == v.dtype == BF16:
        return bf16_attention(q_btnh, k, v, mask, scale=scale, logit_cap=logit_cap)  # training at bf16
    q = q_btnh.reshape(b, t, kh, g, h)
    scores = jnp.einsum(f"btkgh,{kv}->bkgts", q, k, preferred_element_type=jnp.float32) * scale
    scores = softcap(scores, logit_cap)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    if t == 1 and kv_heads_first:
        # One decode step: XLA:CPU ran the [G, S] x [S, H] product per (batch, kv head) as a plain dot thunk at
        # ~8 GB/s of cache; a multiply-and-sum over S reads the cache once as one fused loop.
        out = jnp.sum(probs[:, :, :, 0, :, None] * v[:, :, None], axis=3)[:, None]  # [B, 1, K, G, H]
        return out.reshape(b, t, n, h)
    out = jnp.einsum(f"bkgts,{kv}->btkgh", probs, v)
    return out.reshape(b, t, n, h)


def attention_mask(q_index: jax.Array, k_index: jax.Array, q_segments: jax.Array, k_segments: jax.Array,
                   window: int | None) -> jax.Array:
    """[B, T, S] bool: query i in segment s sees key j when j <= i, segment(j) == s != 0 and (window) i - j <
    window."""
    visible = k_index[None, :] <= q_index[:, None]  # [T, S]
    if window is not None:
        visible &= (q_index[:, None] - k_index[None, :]) < window
    same = (q_segments[:, :, None] == k_segments[:, None, :]) & (k_segments[:, None, :] != 0)  # [B, T, S]
    return visible[None] & same


def library_attention(q_btnh: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, scale: float,
                      implementation: str) -> jax.Array:
    """`attention`'s result (no soft-capping) from `jax.nn.dot_product_attention`: XLA's version ("xla") or
    cuDNN's fused flash attention ("cudnn", NVIDIA GPUs), chosen by `ModelConfig.attention_impl`.

    q [B, T, N, H], k and v [B, S, K, H] (grouped heads: K divides N), `mask` [B, T, S] from `attention_mask`;
    rows it masks entirely (padding) come out finite, as in `attention`.
    """
    return jax.nn.dot_product_attention(q_btnh, k, v, mask=mask[:, None], scale=scale,
                                        implementation=implementation)


def _activation(name: str):
    return jax.nn.silu if name == "silu" else (lambda x: jax.nn.gelu(x, approximate=True))


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def gated(gate: jax.Array, up: jax.Array, activation: str) -> jax.Array:
    """act(gate) * up, the gated MLP's hidden state (act = silu or tanh-gelu), with its gradient made in the
    activations' own [..., M] layout.

    Plain autodiff gives the same numbers, but XLA:CPU fuses the elementwise gradient d/d gate = g * up *
    act'(gate) into the transposing copy the gate projection's weight gradient reads it through, and that fused,
    transposed loop ran at a small fraction of memory speed: on bench-tiny `sft_full` 31 ms a layer against 2 ms
    for the same copy of d/d up (`bench/profile_step.py sft_full tiny`, AMD EPYC Zen 5). Here the backward makes
    both gradients first and puts them behind an optimization barrier, so the transpose is a plain copy.
    """
    return _activation(activation)(gate) * up


def _gated_fwd(gate, up, activation):
    return gated(gate, up, activation), (gate, up)


def _gated_bwd(activation, residuals, g):
    gate, up = residuals
    act, act_vjp = jax.vjp(_activation(activation), gate)
    (d_gate,) = act_vjp(g * up)
    return jax.lax.optimization_barrier((d_gate, g * act))


gated.defvjp(_gated_fwd, _gated_bwd)


class MLP(nnx.Module):
    """Gated MLP: down(act(gate(x)) * up(x)); SwiGLU with silu, GeGLU with tanh-gelu."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pd, dt = as_dtype(cfg.param_dtype), as_dtype(cfg.dtype)
        d, m = cfg.hidden_size, cfg.intermediate_size

        def linear(i: int, o: int, names: tuple[str, str]) -> nnx.Linear:
            return nnx.Linear(
                i, o, use_bias=cfg.mlp_bias, dtype=dt, param_dtype=pd, rngs=rngs, kernel_init=_init(names),
                dot_general=projection_dot,
                bias_init=nnx.with_partitioning(nnx.initializers.zeros, names[1:]),
            )

        self.gate_proj = linear(d, m, ("embed", "mlp"))
        self.up_proj = linear(d, m, ("embed", "mlp"))
        self.down_proj = linear(m, d, ("mlp", "embed"))
        self.activation = cfg.activation

    def __call__(self, x: jax.Array) -> jax.Array:
        gate, up = self.gate_proj(x), self.up_proj(x)
        hidden = gated(gate, up, self.activation)
        return self.down_proj(hidden)


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: ModelConfig, layer_index: int, *, rngs: nnx.Rngs):
        kw = dict(eps=cfg.rms_norm_eps, offset=cfg.norm_offset, param_dtype=as_dtype(cfg.param_dtype), rngs=rngs)
        self.input_layernorm = RMSNorm(cfg.hidden_size, **kw)
        self.self_attn = Attention(cfg, layer_index, rngs=rngs)
        # Llama names its pre-MLP norm post_attention_layernorm; Gemma 2/3 use that name for the norm applied
        # to the attention output and add pre/post feed-forward norms.
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, **kw)
        if cfg.post_norms:
            self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, **kw)
            self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, **kw)
        else:
            self.pre_feedforward_layernorm = None
            self.post_feedforward_layernorm = None
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x, positions, q_index, q_segments, kv):
        attn, new_kv = self.self_attn(self.input_layernorm(x), positions, q_index, q_segments, kv)
        if self.pre_feedforward_layernorm is not None:
            x = x + self.post_attention_layernorm(attn)
            x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        else:
            x = x + attn
            x = x + self.mlp(self.post_attention_layernorm(x))
        return shard(x, ("batch", "seq", "act_embed")), new_kv


def make_embedding(cfg: ModelConfig, rngs: nnx.Rngs) -> nnx.Embed:
    """The token embedding [vocab, embed] (the first weights a `Decoder` draws)."""
    return nnx.Embed(
        cfg.vocab_size, cfg.hidden_size, dtype=as_dtype(cfg.dtype), param_dtype=as_dtype(cfg.param_dtype),
        rngs=rngs, embedding_init=_init(("vocab", "embed")),
    )


def make_head(cfg: ModelConfig, rngs: nnx.Rngs) -> tuple[RMSNorm, nnx.Linear | None]:
    """The final norm and the untied LM head (None when tied to the embedding): the last weights drawn."""
    pd = as_dtype(cfg.param_dtype)
    norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, offset=cfg.norm_offset, param_dtype=pd, rngs=rngs)
    if cfg.tie_word_embeddings:
        return norm, None
    head = nnx.Linear(
        cfg.hidden_size, cfg.vocab_size, use_bias=False, dtype=as_dtype(cfg.dtype), param_dtype=pd, rngs=rngs,
        kernel_init=_init(("embed", "vocab")),
    )
    return norm, head


def _remat_policy(name: str) -> Any:
    if name == "dots":
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    return None  # "full": save nothing, recompute everything


class Decoder(nnx.Module):
    """The decoder-only language model.

    Call: `logits, cache = model(tokens, positions=..., segment_ids=..., cache=...)`.
      tokens: [B, T] int32.
      positions: [B, T] rotary positions; default: index within each segment (or arange(T) + cache offset).
      segment_ids: [B, T], 0 = padding, equal ids attend to each other causally; default all ones.
      cache: a `KVCache` to read and extend (decoding); None for a plain forward pass.
      last_only: return logits for the last position only ([B, 1, V]), as generation needs.
      decode_layout: few-row products for CPU decoding: a tied LM head multiplies with the embedding table on the
        left (`tempax.models.fast_decode`); same logits, no copy of any weight.
    Returns logits [B, T, V] in float32 and the updated cache (None without one).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        # Construction order (embedding, layers, head) fixes which random draws each weight gets;
        # `tempax.models.init.init_decoder` builds the same three parts as separate programs in this order.
        self.config = cfg
        with nnx.use_eager_sharding(False):
            self.embed_tokens = make_embedding(cfg, rngs)
            self.layers = nnx.List([DecoderLayer(cfg, i, rngs=rngs) for i in range(cfg.num_layers)])
            self.norm, self.lm_head = make_head(cfg, rngs)

    # ----------------------------------------------------------------------------------------------------------
    def hidden_states(
        self,
        tokens: jax.Array,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        cache: KVCache | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Final-norm hidden states [B, T, D] (what the LM head and a reward head read)."""
        cfg = self.config
        b, t = tokens.shape
        if segment_ids is None:
            segment_ids = jnp.ones((b, t), jnp.int32)
        offset = jnp.int32(0) if cache is None else cache.length
        q_index = offset + jnp.arange(t, dtype=jnp.int32)
        if positions is None:
            positions = default_positions(segment_ids) + (0 if cache is None else cache.next_position[:, None])
        x = self.embed_tokens(tokens)
        if cfg.embed_scale:
            x = x * jnp.asarray(math.sqrt(cfg.hidden_size), x.dtype)
        x = shard(x, ("batch", "seq", "act_embed"))
        k_segments = None
        if cache is not None:
            k_segments = jax.lax.dynamic_update_slice(cache.segment_ids, segment_ids.astype(jnp.int32), (0, offset))
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            kv = None if cache is None else (cache.k[i], cache.v[i], k_segments, offset)
            if cfg.remat != "none":
                # Also with a cache: GRPO's and PPO's training pass runs the prompts into a cache and the
                # completions against it. Without differentiation jax.checkpoint adds nothing: decoding under
                # a remat config compiles to the same program (tests/models/test_remat.py).
                x, layer_kv = _remat_layer(layer, x, positions, q_index, segment_ids, kv, cfg.remat)
            else:
                x, layer_kv = layer(x, positions, q_index, segment_ids, kv)
            if layer_kv is not None:
                new_k.append(layer_kv[0])
                new_v.append(layer_kv[1])
        x = self.norm(x)
        new_cache = None
        if cache is not None:
            last_pos = jnp.max(jnp.where(segment_ids != 0, positions, -1), axis=1)
            new_cache = KVCache(
                k=tuple(new_k), v=tuple(new_v), segment_ids=k_segments, length=offset + t,
                next_position=jnp.maximum(cache.next_position, last_pos + 1),
            )
        return x, new_cache

    def logits(self, hidden: jax.Array, decode_layout: bool = False) -> jax.Array:
        """LM head (tied or untied) and final soft-capping; float32 logits. `decode_layout`: see `Decoder`."""
        if self.lm_head is None and decode_layout:
            embed = self.embed_tokens  # the same dtype promotion as `embed.attend`
            query, table = embed.promote_dtype((hidden, embed.embedding[...]), dtype=embed.dtype)
            logits = project(query, table)
        elif self.lm_head is None:
            logits = self.embed_tokens.attend(hidden)
        else:
            logits = self.lm_head(hidden)
        logits = softcap(logits.astype(jnp.float32), self.config.final_logit_softcap)
        return shard(logits, ("batch", "seq", "act_vocab"))

    def __call__(
        self,
        tokens: jax.Array,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        cache: KVCache | None = None,
        last_only: bool = False,
        decode_layout: bool = False,
    ) -> tuple[jax.Array, KVCache | None]:
        hidden, cache = self.hidden_states(tokens, positions=positions, segment_ids=segment_ids, cache=cache)
        if last_only:
            # Generation needs only the next-token logits; skipping the LM head elsewhere saves a
            # [B, T, V] matmul in prefill (most of a small model's prefill FLOPs).
            hidden = hidden[:, -1:]
        return self.logits(hidden, decode_layout), cache


def _remat_layer(layer: DecoderLayer, x, positions, q_index, segment_ids, kv, policy_name: str):
    graphdef, state = nnx.split(layer)

    def run(state, x, positions, q_index, segment_ids, kv):
        return nnx.merge(graphdef, state)(x, positions, q_index, segment_ids, kv)

    return jax.checkpoint(run, policy=_remat_policy(policy_name))(state, x, positions, q_index, segment_ids, kv)


def default_positions(segment_ids: jax.Array) -> jax.Array:
    """Position of each token within its segment: 0, 1, 2, ... restarting when the segment id changes.

    Padding (segment 0) before a segment (left padding) does not advance the count, so a left-padded prompt gets
    the same positions as the unpadded one.
    """
    b, t = segment_ids.shape
    idx = jnp.arange(t, dtype=jnp.int32)[None, :].repeat(b, 0)
    starts = jnp.concatenate(
        [jnp.ones((b, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )
    start_idx = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
    return jnp.where(segment_ids != 0, idx - start_idx, 0)
