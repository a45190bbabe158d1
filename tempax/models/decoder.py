"""One decoder-only transformer for every supported family (Flax NNX).

Module and parameter names follow Hugging Face's (`layers[i].self_attn.q_proj`, `mlp.gate_proj`,
`input_layernorm`, ...) so checkpoint mapping is a rename plus a transpose, and LoRA targets are matched by the
names users already know. Linear kernels are stored [in, out]; every parameter carries logical sharding axis
names (`vocab`, `embed`, `q_heads`, `kv_heads`, `mlp`, `norm`) that `tempax.parallel` maps to a mesh.

Attention masking is expressed with segment ids instead of a boolean mask: `segment_ids[b, t]` is 0 for
padding and 1..n for the packed examples of a row, so a token attends to earlier tokens (by array index) of the
same segment. Left-padded batches, packed sequences and the KV cache all reduce to this one rule.

The numerical ops (the projections' products, attention, the gated activation, the tied LM head) come from
`tempax.ops`, which computes each in the form the platform runs fastest (XLA:CPU's layouts and custom gradients on
a CPU, plain JAX elsewhere); this file is the model, its tuning lives there.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
import numpy as np
from flax import nnx

from tempax import ops
from tempax.ops import linear_attention as delta
from tempax.errors import ConfigError
from tempax.models.cache import KVCache
from tempax.models.config import ModelConfig, RopeConfig
from tempax.models.moe import (SparseMoeBlock, is_recording_router_statistics, record_router_statistics,
                               router_statistics)
from tempax.models.norm import RMSNorm
from tempax.parallel.rules import shard

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def as_dtype(name: str | Any) -> Any:
    if isinstance(name, str):
        return _DTYPES[name]
    return name


def _init(names: tuple[str, ...], scale: float = 0.02) -> Any:
    return nnx.with_partitioning(nnx.initializers.normal(scale), names)


def rope_inverse_frequencies(rope: RopeConfig, head_dim: int, *, long: bool = False) -> jax.Array:
    """inv_freq[i] = theta^(-2i/d), then the family's scaling (linear: / factor; llama3: per-band rescale; yarn:
    `yarn_inverse_frequencies`; longrope: 1 / (short_factor[i] * theta^(2i/d)), or long_factor's with `long`)."""
    if rope.scaling == "longrope":
        factors = jnp.asarray(rope.long_factor if long else rope.short_factor, jnp.float32)
        return 1.0 / (factors * rope.theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    inv = 1.0 / (rope.theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    if rope.scaling == "proportional":  # Gemma 4: the first pairs rotate, the others (frequency 0) pass through
        rotated = int(rope.rotated_fraction * head_dim // 2)
        return jnp.where(jnp.arange(head_dim // 2) < rotated, inv, 0.0) / rope.factor
    if rope.scaling == "yarn":
        return yarn_inverse_frequencies(rope, head_dim)
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


def yarn_inverse_frequencies(rope: RopeConfig, head_dim: int) -> jax.Array:
    """YaRN's inverse frequencies (Peng et al. 2023, arXiv:2309.00071, "NTK-by-parts"), as transformers computes
    them: each frequency blends the extrapolated theta^(-2i/d) and the interpolated theta^(-2i/d) / factor,

        inv[i] = inter[i] * ramp[i] + extra[i] * (1 - ramp[i]),  ramp[i] = clip((i - low) / (high - low), 0, 1)

    where low and high are the dimensions that turn `beta_fast` and `beta_slow` times over the original context,
    d * ln(L / (2 pi beta)) / (2 ln theta), rounded outwards when `truncate` and kept within [0, d - 1]."""
    d, base = head_dim, rope.theta
    extrapolated = 1.0 / (base ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    interpolated = extrapolated / rope.factor

    def correction_dim(rotations: float) -> float:
        return d * math.log(rope.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = jnp.clip((jnp.arange(d // 2, dtype=jnp.float32) - low) / (high - low), 0, 1)
    return interpolated * ramp + extrapolated * (1 - ramp)


def rope_attention_factor(rope: RopeConfig) -> float:
    """The factor YaRN multiplies cos and sin by (so q . k by its square): `attention_factor`, or by default
    0.1 * ln(factor) + 1 (YaRN's eq. 21; 1 for a factor <= 1). LongRoPE's default is
    sqrt(1 + ln(factor) / ln(original context)) (1 for a factor <= 1). 1 for every other rope."""
    if rope.scaling not in ("yarn", "longrope"):
        return 1.0
    if rope.attention_factor is not None:
        return float(rope.attention_factor)
    if rope.factor <= 1:
        return 1.0
    if rope.scaling == "longrope":
        return math.sqrt(1 + math.log(rope.factor) / math.log(rope.original_max_position_embeddings))
    return 0.1 * math.log(rope.factor) + 1.0


def apply_rope(x_btnh: jax.Array, positions_bt: jax.Array, inv_freq: jax.Array,
               scale: jax.Array | None = None) -> jax.Array:
    """Rotate-half RoPE: x*cos + rotate_half(x)*sin with angles positions * inv_freq (Su et al. 2021); cos and
    sin times `scale` when given (YaRN's `rope_attention_factor`).

    Only the first 2 * len(inv_freq) features of each head rotate when that is fewer than head_dim (partial rotary,
    Phi-3); the others pass through. Inverse frequencies of 0 (a NoPE layer, SmolLM3) give cos 1 and sin 0: x
    itself, bit for bit."""
    rotary_dim = 2 * inv_freq.shape[-1]
    if rotary_dim < x_btnh.shape[-1]:
        rotated_part = apply_rope(x_btnh[..., :rotary_dim], positions_bt, inv_freq, scale)
        return jnp.concatenate([rotated_part, x_btnh[..., rotary_dim:]], axis=-1)
    angles = positions_bt[..., None].astype(jnp.float32) * inv_freq  # [B, T, H/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    if scale is not None:
        cos, sin = cos * scale, sin * scale
    x32 = x_btnh.astype(jnp.float32)
    half = x32.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rotated * sin).astype(x_btnh.dtype)


def with_slots(buffer: jax.Array, slots: jax.Array, at: jax.Array) -> jax.Array:
    """`buffer` [B, K, S, H] as it reads with `slots` [B, K, T, H] written at positions at .. at + T - 1: the values
    of `jax.lax.dynamic_update_slice` (which moves a start past the end back to S - T). One slot (a decode step)
    is selected in position by position, an elementwise op XLA fuses into the attention's read of the buffer, so
    the step writes no [B, K, S, H] array; more slots are written into a copy."""
    if slots.shape[2] == 1:
        at = jnp.clip(at, 0, buffer.shape[2] - 1)
        return jnp.where((jnp.arange(buffer.shape[2]) == at)[:, None], slots, buffer)
    return jax.lax.dynamic_update_slice(buffer, slots, (0, 0, at, 0))


class Attention(nnx.Module):
    """Grouped-query self-attention with rotary positions, optional q/k norms, soft-capping and sliding windows.

    One module serves every layer of the scanned stack, so what differs between layers comes in as data: the
    rotary inverse frequencies (`inv_freq`, Gemma 3's local and global bases), YaRN's factor on cos and sin
    (`rope_scale`, or None), and, when a model mixes full and sliding layers, whether this layer slides
    (`sliding`, a traced bool). With `ModelConfig.attention_sinks` (gpt-oss) each query head has a learned sink
    logit [N] in the softmax's denominator (`tempax.ops.plain.attention_probs`). Gemma 4's per-layer switches come
    the same way (`LayerSwitches`): whether the values are the key projection's output (`k_eq_v`) and whether the
    layer attends to the keys and values of an earlier layer (`shared`) instead of its own."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pd, dt = as_dtype(cfg.param_dtype), as_dtype(cfg.dtype)
        d, h, n, k = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads

        def linear(i: int, o: int, names: tuple[str, str], bias: bool) -> nnx.Linear:
            return nnx.Linear(
                i, o, use_bias=bias, dtype=dt, param_dtype=pd, rngs=rngs, dot_general=ops.projection_dot,
                kernel_init=_init(names), bias_init=nnx.with_partitioning(nnx.initializers.zeros, names[1:]),
            )

        # Qwen3.5: q_proj also makes a per-head output gate, [query | gate] for each head
        self.output_gate = cfg.attn_output_gate
        self.q_proj = linear(d, n * h * (2 if cfg.attn_output_gate else 1), ("embed", "q_heads"), cfg.qkv_bias)
        self.k_proj = linear(d, k * h, ("embed", "kv_heads"), cfg.qkv_bias)
        self.v_proj = linear(d, k * h, ("embed", "kv_heads"), cfg.qkv_bias)
        self.o_proj = linear(n * h, d, ("q_heads", "embed"), cfg.o_bias)
        if cfg.qk_norm:
            kw = dict(eps=cfg.rms_norm_eps, offset=cfg.norm_offset, param_dtype=pd, rngs=rngs)
            across = cfg.qk_norm_across_heads  # OLMo 2/3: one norm over the whole projection, not per head
            self.q_norm = RMSNorm(n * h if across else h, **kw)
            self.k_norm = RMSNorm(k * h if across else h, **kw)
        else:
            self.q_norm = None
            self.k_norm = None
        self.qk_norm_across_heads = cfg.qk_norm_across_heads
        self.v_norm_eps = cfg.rms_norm_eps if cfg.v_norm else None  # Gemma 4: values RMS-normed, no weight
        # transformers initialises gpt-oss's sinks like its weights (normal, std 0.02)
        self.sinks = nnx.Param(_init(("q_heads",))(rngs.params(), (n,), pd)) if cfg.attention_sinks else None
        self.num_heads, self.num_kv_heads, self.head_dim = n, k, h
        self.scale = cfg.attn_scale
        self.softcap = cfg.attn_logit_softcap
        kinds = layer_kinds(cfg)
        self.window = cfg.sliding_window if "sliding" in kinds else None  # static: the size when any layer slides
        self.window_per_layer = len(set(kinds)) > 1  # mixed full and sliding layers: `sliding` says which
        self.attention_impl = cfg.attention_impl

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        q_index: jax.Array,
        q_segments: jax.Array,
        kv: tuple[jax.Array, jax.Array, jax.Array, jax.Array] | None,
        fresh_cache: bool,
        inv_freq: jax.Array,
        sliding: jax.Array | None,
        rope_scale: jax.Array | None = None,
        k_eq_v: jax.Array | None = None,
        shared: tuple[jax.Array, jax.Array, jax.Array] | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None, tuple[jax.Array, jax.Array]]:
        """Attends x [B,T,D] to itself, or to this layer's cache `kv` = (k, v, k_segments, write_at) when decoding.

        Returns the output and, with a cache, this call's keys and values as the cache stores them [B, K, T, H]:
        the caller writes them into the stacked cache at `write_at` (`Decoder._run_layers`); the buffers given
        here are only read. `fresh_cache` (static): the cache held nothing before this call (a prefill), so the
        queries attend to the keys written now only, not to the whole buffer with its empty slots masked: a
        prefill into a cache that reserves room for later turns would otherwise form [T, max_len] scores instead
        of [T, T].

        `k_eq_v` (a traced bool, or None): the values are the key projection's output. `shared` = (keys, values
        [B, T, K, H], reuse): where `reuse` (traced) holds, these keys and values (an earlier layer's, after its
        norms and rotary embedding) replace this layer's own, in the attention and in what it writes to the cache.
        Also returns the keys and values attended to, [B, T, K, H], for a later layer to share."""
        b, t, _ = x.shape
        n, k, h = self.num_heads, self.num_kv_heads, self.head_dim
        q, key, val = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if k_eq_v is not None:
            val = jnp.where(k_eq_v, key, val)
        gate = None
        if self.output_gate:
            q, gate = jnp.split(q.reshape(b, t, n, 2 * h), 2, axis=-1)
            q, gate = q.reshape(b, t, n * h), gate.reshape(b, t, n * h)
        if self.q_norm is not None and self.qk_norm_across_heads:  # before the split into heads (OLMo 2/3)
            q, key = self.q_norm(q), self.k_norm(key)
        q, key, val = q.reshape(b, t, n, h), key.reshape(b, t, k, h), val.reshape(b, t, k, h)
        if self.q_norm is not None and not self.qk_norm_across_heads:
            q, key = self.q_norm(q), self.k_norm(key)
        q, key = apply_rope(q, positions, inv_freq, rope_scale), apply_rope(key, positions, inv_freq, rope_scale)
        if self.v_norm_eps is not None:
            v32 = val.astype(jnp.float32)
            val = (v32 * jax.lax.rsqrt(jnp.mean(v32 * v32, axis=-1, keepdims=True) + self.v_norm_eps)).astype(val.dtype)
        if shared is not None:
            shared_key, shared_val, reuse = shared
            key = jnp.where(reuse, shared_key.astype(key.dtype), key)
            val = jnp.where(reuse, shared_val.astype(val.dtype), val)
        attended = (key, val)
        new_kv = None
        if kv is None:
            keys, vals, k_segments, k_index = key, val, q_segments, q_index
        else:
            cache_k, cache_v, k_segments, write_at = kv  # [B, K, S, H] buffers (see KVCache)
            written_k, written_v = key.swapaxes(1, 2).astype(cache_k.dtype), val.swapaxes(1, 2).astype(cache_v.dtype)
            new_kv = (written_k, written_v)
            if fresh_cache:  # the slots written now, as the buffer holds them (same casts as a cache read)
                keys, vals = written_k, written_v
                k_index, k_segments = q_index, q_segments
            else:
                keys, vals = with_slots(cache_k, written_k, write_at), with_slots(cache_v, written_v, write_at)
                k_index = jnp.arange(keys.shape[2])
            keys, vals = keys.astype(q.dtype), vals.astype(q.dtype)
        out = ops.attention(
            q, keys, vals, q_index=q_index, k_index=k_index, q_segments=q_segments, k_segments=k_segments,
            scale=self.scale, logit_cap=self.softcap, window=self.window,
            window_on=sliding if self.window_per_layer else None, kv_heads_first=kv is not None,
            implementation=self.attention_impl, sinks=None if self.sinks is None else self.sinks[...],
        )
        out = out.reshape(b, t, n * h)
        if gate is not None:
            out = out * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(out.dtype)
        return self.o_proj(out), new_kv, attended


class DepthwiseConv(nnx.Module):
    """The weight [C, K] of a channel-wise causal convolution (`tempax.ops.linear_attention.causal_depthwise_conv`;
    transformers' `Conv1d(groups=C)` weight [C, 1, K] without its middle axis)."""

    def __init__(self, channels: int, kernel: int, *, param_dtype: Any, rngs: nnx.Rngs):
        bound = kernel ** -0.5  # Conv1d's default init (fan_in = K for a depthwise kernel)
        init = lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)  # noqa: E731
        self.weight = nnx.Param(nnx.with_partitioning(init, ("q_heads", None))(
            rngs.params(), (channels, kernel), param_dtype))


class GatedDeltaNet(nnx.Module):
    """Qwen3.5's linear-attention token mixer: q/k/v from one projection through a causal depthwise convolution
    and silu, then the gated delta rule (`tempax.ops.linear_attention`) with a per-head decay
    g = -exp(A_log) softplus(a + dt_bias) and write strength b = sigmoid(b_proj), its output RMS-normed per
    value head and gated by silu(z), and projected back.

    Its cache is a fixed-size state per row, (the last conv_kernel - 1 convolution inputs [B, K-1, C], the delta
    rule's state [B, Hv, dk, dv] float32), not keys and values per position."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        la = cfg.linear_attention
        pd, dt = as_dtype(cfg.param_dtype), as_dtype(cfg.dtype)
        d, value_dim = cfg.hidden_size, la.num_value_heads * la.value_head_dim

        def linear(i: int, o: int, names: tuple[Any, Any]) -> nnx.Linear:
            return nnx.Linear(i, o, use_bias=False, dtype=dt, param_dtype=pd, rngs=rngs,
                              dot_general=ops.projection_dot, kernel_init=_init(names))

        self.in_proj_qkv = linear(d, la.conv_channels, ("embed", "q_heads"))
        self.in_proj_z = linear(d, value_dim, ("embed", "q_heads"))
        self.in_proj_b = linear(d, la.num_value_heads, ("embed", None))
        self.in_proj_a = linear(d, la.num_value_heads, ("embed", None))
        self.out_proj = linear(value_dim, d, ("q_heads", "embed"))
        # [C, K]: transformers' Conv1d weight [C, 1, K] without its middle axis
        self.conv1d = DepthwiseConv(la.conv_channels, la.conv_kernel, param_dtype=pd, rngs=rngs)
        self.dt_bias = nnx.Param(nnx.with_partitioning(nnx.initializers.ones, (None,))(
            rngs.params(), (la.num_value_heads,), pd))
        # A in [0.01, 16), stored as log A, as transformers initialises it
        log_a = lambda key, shape, dtype: jnp.log(  # noqa: E731
            jax.random.uniform(key, shape, jnp.float32, 0.01, 16.0)).astype(dtype)
        self.A_log = nnx.Param(nnx.with_partitioning(log_a, (None,))(rngs.params(), (la.num_value_heads,), pd))
        # the per-value-head RMSNorm's weight (no offset); its gating by silu(z) is in __call__
        self.norm = RMSNorm(la.value_head_dim, eps=cfg.rms_norm_eps, offset=False, param_dtype=pd, rngs=rngs)
        self.config = la

    def __call__(self, x: jax.Array, masks: tuple[jax.Array, jax.Array, jax.Array, jax.Array],
                 state: tuple[jax.Array, jax.Array] | None) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """x [B, T, D] -> (output [B, T, D], (conv history, delta-rule state) after the row's last real token).

        masks: `Decoder._linear_masks` (taps, reset, real, kept); state: the cache's (history, state) or None
        (zeros). Padding changes neither."""
        la = self.config
        b, t, _ = x.shape
        taps, reset, real, kept = masks
        kd, vd = la.num_key_heads * la.key_head_dim, la.num_value_heads * la.value_head_dim
        history, recurrent = (None, None) if state is None else state
        mixed = self.in_proj_qkv(x)
        conv = delta.causal_depthwise_conv(mixed, self.conv1d.weight[...], taps, history)
        before = (jnp.zeros((b, la.conv_kernel - 1, mixed.shape[-1]), mixed.dtype) if history is None
                  else history.astype(mixed.dtype))
        inputs = jnp.concatenate([before, mixed], axis=1)  # what the taps and `kept` index
        new_history = jnp.where((kept >= 0)[..., None],
                                jnp.take_along_axis(inputs, jnp.maximum(kept, 0)[..., None], axis=1), 0)
        conv = jax.nn.silu(conv.astype(jnp.float32)).astype(mixed.dtype)
        q, k, v = jnp.split(conv, [kd, 2 * kd], axis=-1)
        # rows on the batch axes and heads on the tensor axis, as attention's: the delta rule's scans then run on
        # each device's rows and heads alone, with no collective inside them
        heads = lambda a: shard(a, ("batch", "seq", "act_heads", None))  # noqa: E731
        q = heads(q.reshape(b, t, la.num_key_heads, la.key_head_dim))
        k = heads(k.reshape(b, t, la.num_key_heads, la.key_head_dim))
        v = heads(v.reshape(b, t, la.num_value_heads, la.value_head_dim))
        beta = jax.nn.sigmoid(self.in_proj_b(x).astype(jnp.float32))
        a = self.in_proj_a(x).astype(jnp.float32)
        log_decay = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(
            a + self.dt_bias[...].astype(jnp.float32))
        # padding neither decays nor writes the state
        beta, log_decay = jnp.where(real[..., None], beta, 0.0), jnp.where(real[..., None], log_decay, 0.0)
        rule = delta.gated_delta_rule_recurrent if t == 1 else delta.gated_delta_rule_chunked
        out, recurrent = rule(q, k, v, log_decay, beta, reset, recurrent)
        out = heads(out)
        # RMSNorm over each value head (weight without offset), cast, then gated by silu(z) in float32
        z = self.in_proj_z(x).reshape(b, t, la.num_value_heads, la.value_head_dim)
        normed = out * jax.lax.rsqrt(jnp.mean(out * out, axis=-1, keepdims=True) + self.norm.eps)
        normed = self.norm.weight[...] * normed.astype(x.dtype)
        out = (normed.astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))).astype(x.dtype)
        return self.out_proj(out.reshape(b, t, vd)), (new_history, recurrent)


class MLP(nnx.Module):
    """Gated MLP: down(act(gate(x)) * up(x)); SwiGLU with silu, GeGLU with tanh-gelu."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pd, dt = as_dtype(cfg.param_dtype), as_dtype(cfg.dtype)
        d, m = cfg.hidden_size, cfg.intermediate_size

        def linear(i: int, o: int, names: tuple[str, str]) -> nnx.Linear:
            return nnx.Linear(
                i, o, use_bias=cfg.mlp_bias, dtype=dt, param_dtype=pd, rngs=rngs, kernel_init=_init(names),
                dot_general=ops.projection_dot,
                bias_init=nnx.with_partitioning(nnx.initializers.zeros, names[1:]),
            )

        self.gate_proj = linear(d, m, ("embed", "mlp"))
        self.up_proj = linear(d, m, ("embed", "mlp"))
        self.down_proj = linear(m, d, ("mlp", "embed"))
        self.activation = cfg.activation

    def __call__(self, x: jax.Array) -> jax.Array:
        gate, up = self.gate_proj(x), self.up_proj(x)
        hidden = ops.gated(gate, up, self.activation)
        return self.down_proj(hidden)


class DecoderLayer(nnx.Module):
    """One transformer block. The decoder holds a single `DecoderLayer` whose weights are stacked over the layers
    (a leading axis of size `num_layers`, logical name "layers") and scans over it (`Decoder.hidden_states`).

    Its feed-forward block (`mlp`) is the gated `MLP`, or with `ModelConfig.moe` the sparse mixture of experts
    (`tempax.models.moe.SparseMoeBlock`, holding the dense MLP too where it runs beside it: Gemma 4) in every
    layer: one scanned layer means one kind of block, so a config whose MoE settings make some layers dense is
    refused (`ModelConfig.mixed_feed_forward_error`)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, linear: bool = False):
        kw = dict(eps=cfg.rms_norm_eps, offset=cfg.norm_offset, param_dtype=as_dtype(cfg.param_dtype), rngs=rngs)
        # OLMo 2/3 (pre_norms=False) norm only the attention and MLP outputs: no input or pre-MLP norm.
        self.input_layernorm = RMSNorm(cfg.hidden_size, **kw) if cfg.pre_norms else None
        # `linear`: a Qwen3.5 linear-attention layer, Gated DeltaNet in place of softmax attention
        self.self_attn = None if linear else Attention(cfg, rngs=rngs)
        self.linear_attn = GatedDeltaNet(cfg, rngs=rngs) if linear else None
        # Llama names its pre-MLP norm post_attention_layernorm; Gemma 2/3 use that name for the norm applied
        # to the attention output and add pre/post feed-forward norms.
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, **kw)
        if cfg.post_norms:
            self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, **kw) if cfg.pre_norms else None
            self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, **kw)
        else:
            self.pre_feedforward_layernorm = None
            self.post_feedforward_layernorm = None
        if cfg.moe is not None:
            reason = cfg.mixed_feed_forward_error()
            if reason is not None:
                raise ConfigError(reason)
            # beside the dense MLP (Gemma 4) the block holds that MLP, of this stack's width, and norms of its own
            self.mlp = SparseMoeBlock(cfg.moe, cfg.hidden_size, dtype=as_dtype(cfg.dtype),
                                      param_dtype=as_dtype(cfg.param_dtype), rngs=rngs,
                                      dense_intermediate_size=cfg.intermediate_size, dense_activation=cfg.activation,
                                      norm_eps=cfg.rms_norm_eps, norm_offset=cfg.norm_offset)
        else:
            self.mlp = MLP(cfg, rngs=rngs)
        pd, dt = as_dtype(cfg.param_dtype), as_dtype(cfg.dtype)
        if cfg.per_layer_input_size:  # Gemma 4: this layer's per-layer input gates a residual branch of its own
            p = cfg.per_layer_input_size
            linear_kw = dict(use_bias=False, dtype=dt, param_dtype=pd, rngs=rngs, dot_general=ops.projection_dot)
            self.per_layer_input_gate = nnx.Linear(cfg.hidden_size, p, kernel_init=_init(("embed", None)),
                                                   **linear_kw)
            self.per_layer_projection = nnx.Linear(p, cfg.hidden_size, kernel_init=_init((None, "embed")),
                                                   **linear_kw)
            self.post_per_layer_input_norm = RMSNorm(cfg.hidden_size, **kw)
        else:
            self.per_layer_input_gate = self.per_layer_projection = self.post_per_layer_input_norm = None
        self.activation = cfg.activation
        self.layer_scalar = (nnx.Param(nnx.with_partitioning(nnx.initializers.ones, (None,))(rngs.params(), (1,), pd))
                             if cfg.layer_scalar else None)

    def _feed_forward(self, x: jax.Array, residual: jax.Array) -> tuple[jax.Array, jax.Array | None]:
        """(the feed-forward block's output for its input x, router logits or None); `residual`, the stream x was
        normed from, is what a sparse block beside the dense MLP routes (Gemma 4)."""
        if isinstance(self.mlp, SparseMoeBlock):
            return self.mlp(x, residual=residual)
        return self.mlp(x), None

    def __call__(self, x, positions, q_index, q_segments, kv, fresh_cache: bool, inv_freq, sliding, rope_scale=None,
                 linear_masks=None, k_eq_v=None, shared=None, per_layer_input=None):
        """(x, the token mixer's cache output (see `Attention.__call__`, `GatedDeltaNet.__call__`), router logits
        [B, T, E] float32 of a sparse block or None, the keys and values attended to (None in a linear-attention
        layer)). A linear-attention layer reads `linear_masks` (same_segment, reset) and its state from `kv`, and
        ignores the attention arguments. `k_eq_v`, `shared`: see `Attention.__call__`; `per_layer_input` [B, T, P]:
        this layer's slice of Gemma 4's per-layer inputs."""
        normed = x if self.input_layernorm is None else self.input_layernorm(x)
        attended = None
        if self.linear_attn is not None:
            attn, new_kv = self.linear_attn(normed, linear_masks, kv)
        else:
            attn, new_kv, attended = self.self_attn(normed, positions, q_index, q_segments, kv, fresh_cache, inv_freq,
                                                    sliding, rope_scale, k_eq_v, shared)
        if self.post_feedforward_layernorm is not None:  # norms on the outputs (Gemma 2/3 around, OLMo 2/3 only)
            x = x + self.post_attention_layernorm(attn)
            normed = x if self.pre_feedforward_layernorm is None else self.pre_feedforward_layernorm(x)
            y, router_logits = self._feed_forward(normed, x)
            x = x + self.post_feedforward_layernorm(y)
        else:
            x = x + attn
            y, router_logits = self._feed_forward(self.post_attention_layernorm(x), x)
            x = x + y
        if self.per_layer_input_gate is not None:
            hidden = ops.gated(self.per_layer_input_gate(x), per_layer_input.astype(x.dtype), self.activation)
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(hidden))
        if self.layer_scalar is not None:  # a constant in transformers (a buffer): no gradient reaches it
            x = x * jax.lax.stop_gradient(self.layer_scalar[...]).astype(x.dtype)
        return shard(x, ("batch", "seq", "act_embed")), new_kv, router_logits, attended


# --------------------------------------------------------------------------------------------------------------
# The stack of layers: one module, weights with a leading "layers" axis

LAYERS_AXIS = "layers"


def layer_kinds(cfg: ModelConfig) -> tuple[str, ...]:
    """Each layer's attention kind, "full" or "sliding" (a model with a window everywhere, as Mistral's, has
    `layer_types` all "sliding")."""
    return tuple(cfg.layer_type(i) for i in range(cfg.num_layers))


def is_stacked(variable: nnx.Variable) -> bool:
    """Whether a Variable of the layer stack carries one value per layer (its first logical axis is "layers"):
    weights, adapters, quantized codes. Others (an adapter dropout's random stream) are one for the stack."""
    names = variable.get_metadata().get("out_sharding")
    return bool(names) and names[0] == LAYERS_AXIS


def _stacked_filter(path: Any, variable: Any) -> bool:
    return isinstance(variable, nnx.Variable) and is_stacked(variable)


def stacked_variable(variable: nnx.Variable, value: Any) -> nnx.Variable:
    """`variable` holding `value` (one entry per layer on axis 0), its logical names led by "layers"."""
    out = variable.replace(value)
    names = variable.get_metadata().get("out_sharding")
    out.set_metadata(out_sharding=(LAYERS_AXIS, *(names or (None,) * (jnp.ndim(value) - 1))))
    return out


def stack_layers(layers: list[nnx.Module]) -> nnx.Module:
    """One module whose Variables hold the layers' values stacked on a new leading axis (same structure as each
    layer: they differ in values only). Variables that are not arrays of the layer's weights are taken from the
    first layer."""
    graphdef, first = nnx.split(layers[0])
    flats = [nnx.to_flat_state(nnx.state(layer)) for layer in layers]
    stacked = []
    for i, (path, var) in enumerate(flats[0]):
        values = [flat[i][1].get_value() for flat in flats]
        stacked.append((path, stacked_variable(var, jnp.stack(values))))
    return nnx.merge(graphdef, nnx.from_flat_state(stacked))


def abstract_stack(layer: nnx.Module, num_layers: int) -> nnx.Module:
    """The abstract (shape-only) stack of `num_layers` copies of the abstract `layer`."""
    graphdef, state = nnx.split(layer)
    flat = [(path, stacked_variable(var, jax.ShapeDtypeStruct((num_layers, *var.shape), var.dtype)))
            for path, var in nnx.to_flat_state(state)]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def layer_constants(cfg: ModelConfig, positions: jax.Array | None = None) -> tuple[jax.Array, jax.Array | None]:
    """What differs between layers besides their weights, as arrays scanned with them: the rotary inverse
    frequencies [L, rotary_dim / 2] (0 in a NoPE layer: `apply_rope` is then the identity) and, when full and
    sliding layers mix, whether each slides [L] (else None).

    A LongRoPE layer takes its long factors when the call's `positions` [B, T] pass its original context (the
    largest position + 1 > original_max_position_embeddings, as transformers decides for each forward pass), its
    short factors otherwise or without `positions`."""
    kinds = layer_kinds(cfg)
    ropes = list(dict.fromkeys(cfg.rope_for(i) for i in range(cfg.num_layers)))
    which = np.asarray([ropes.index(cfg.rope_for(i)) for i in range(cfg.num_layers)])
    tables = jnp.stack([rope_inverse_frequencies(rope, cfg.rotary_dim) for rope in ropes])
    if positions is not None and any(rope.scaling == "longrope" for rope in ropes):
        last = jnp.max(positions) + 1
        beyond = jnp.stack([(last > rope.original_max_position_embeddings) & (rope.scaling == "longrope")
                            for rope in ropes])
        long_tables = jnp.stack([rope_inverse_frequencies(rope, cfg.rotary_dim, long=True) for rope in ropes])
        tables = jnp.where(beyond[:, None], long_tables, tables)
    inv_freq = tables[which]
    if cfg.nope_layers:
        nope = np.asarray([i in cfg.nope_layers for i in range(cfg.num_layers)])
        inv_freq = jnp.where(jnp.asarray(nope)[:, None], 0.0, inv_freq)
    sliding = jnp.asarray(np.asarray([k == "sliding" for k in kinds])) if len(set(kinds)) > 1 else None
    return inv_freq, sliding


def rope_scales(cfg: ModelConfig) -> jax.Array | None:
    """Each layer's factor on cos and sin [L] (`rope_attention_factor`: YaRN's, LongRoPE's), or None where every
    layer's is 1 (no multiplication in the program)."""
    factors = [rope_attention_factor(cfg.rope_for(i)) for i in range(cfg.num_layers)]
    if all(f == 1.0 for f in factors):
        return None
    return jnp.asarray(factors, jnp.float32)


def layer_switches(cfg: ModelConfig) -> tuple[jax.Array | None, jax.Array | None]:
    """Gemma 4's per-layer switches, as arrays scanned with the layers: whether each layer's values are its key
    projection's output [L] (`ModelConfig.values_from_keys`) and whether it attends to an earlier layer's keys and
    values [L] (`ModelConfig.kv_reused`); None where the model has no such layer."""
    n = cfg.num_layers
    k_eq_v = jnp.asarray([cfg.values_from_keys(i) for i in range(n)]) if cfg.attention_k_eq_v else None
    reuse = jnp.asarray([cfg.kv_reused(i) for i in range(n)]) if cfg.kv_shared_layers else None
    return k_eq_v, reuse


class PerLayerInputs(nnx.Module):
    """Gemma 4's per-layer inputs ("PLE"): for each token, one vector [P] per layer, the sum of a second token
    embedding (a table [V', L * P], scaled by sqrt(P)) and a projection of the scaled token embedding (times
    D^-0.5, RMS-normed per layer), times 2^-0.5. Each layer adds a residual term gated by its slice
    (`DecoderLayer.__call__`). Names are transformers' (`embed_tokens_per_layer`, `per_layer_model_projection`,
    `per_layer_projection_norm`)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pd, dt = as_dtype(cfg.param_dtype), as_dtype(cfg.dtype)
        width = cfg.num_layers * cfg.per_layer_input_size
        self.embed_tokens_per_layer = nnx.Embed(cfg.per_layer_input_vocab_size or cfg.vocab_size, width, dtype=dt,
                                                param_dtype=pd, rngs=rngs, embedding_init=_init(("vocab", None)))
        self.per_layer_model_projection = nnx.Linear(cfg.hidden_size, width, use_bias=False, dtype=dt,
                                                     param_dtype=pd, rngs=rngs, dot_general=ops.projection_dot,
                                                     kernel_init=_init(("embed", None)))
        self.per_layer_projection_norm = RMSNorm(cfg.per_layer_input_size, eps=cfg.rms_norm_eps, offset=False,
                                                 param_dtype=pd, rngs=rngs)
        self.num_layers, self.size, self.hidden_size = cfg.num_layers, cfg.per_layer_input_size, cfg.hidden_size

    def __call__(self, tokens: jax.Array, embedded: jax.Array) -> jax.Array:
        """tokens [B, T], embedded [B, T, D] (the scaled token embedding) -> per-layer inputs [L, B, T, P], layer
        first, as the layer scan takes them."""
        b, t = tokens.shape
        table = self.embed_tokens_per_layer(tokens)
        table = table * jnp.asarray(math.sqrt(self.size), table.dtype)
        projected = self.per_layer_model_projection(embedded) * (self.hidden_size ** -0.5)
        projected = self.per_layer_projection_norm(projected.reshape(b, t, self.num_layers, self.size))
        combined = (projected + table.reshape(b, t, self.num_layers, self.size)) * (2.0 ** -0.5)
        return jnp.moveaxis(combined, 2, 0)


def _period(kinds: list[str]) -> tuple[str, ...]:
    """The shortest block of `kinds` whose repetition gives them all (all of them when none repeats)."""
    for period in range(1, len(kinds) + 1):
        if len(kinds) % period == 0 and all(kinds[i] == kinds[i % period] for i in range(len(kinds))):
            return tuple(kinds[:period])
    return tuple(kinds)


def _picked(values: jax.Array | None, layers: tuple[int, ...]) -> jax.Array | None:
    """`values` [L, ...] at `layers`, or None."""
    return None if values is None else values[np.asarray(layers)]


def _grouped_weights(weights: Any, groups: int, per_group: int) -> Any:
    """A stack's weights [L_stack, ...] as [groups, per_group, ...], each kept split as it is: unconstrained, the
    partitioner may gather every layer's weights before the scan instead of one layer's in it."""
    def one(var: nnx.Variable) -> nnx.Variable:
        names = var.get_metadata().get("out_sharding")
        value = var.get_value()
        value = value.reshape(groups, per_group, *value.shape[1:])
        return var.replace(shard(value, (None, *names)) if names else value)

    return jax.tree.map(one, weights, is_leaf=lambda v: isinstance(v, nnx.Variable))


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


def _draws_randomness(module: nnx.Module) -> bool:
    """Whether calling `module` now draws random numbers (an adapter dropout in train mode)."""
    return any(isinstance(m, nnx.Dropout) and m.rate > 0 and not m.deterministic for _, m in nnx.iter_modules(module))


def _saves_activation_casts(prim: Any, *avals: Any, **params: Any) -> bool:
    """Remat "dots": the products without batch dimensions (the projections), and the bfloat16 cast of a
    float32 activation [B, T, D]. Under train.precision=bf16 a projection accumulates in float32 and casts its
    output to bfloat16 at once (`tempax.ops.projection_dot`); the cast is what the layer goes on with, so it is
    what the scan stacks for the backward pass, at half the bytes of the float32 product (which the backward pass
    then never reads). The same rule keeps a norm's bfloat16 output, which the next projection reads."""
    if prim is jax.lax.convert_element_type_p:
        (operand,) = avals
        return operand.ndim == 3 and operand.dtype == jnp.float32 and params["new_dtype"] == jnp.bfloat16
    return jax.checkpoint_policies.dots_with_no_batch_dims_saveable(prim, *avals, **params)


# The name of a layer's weights sliced from a group of its stack inside the remat boundary (`_run_kind_blocks`).
_LAYER_WEIGHTS = "layer_weights"


def _remat_policy(name: str) -> Any:
    if name == "dots":
        return _saves_activation_casts
    return None  # "full": save nothing, recompute everything


class Decoder(nnx.Module):
    """The decoder-only language model.

    Call: `logits, cache = model(tokens, positions=..., segment_ids=..., cache=...)`.
      tokens: [B, T] int32.
      positions: [B, T] rotary positions; default: index within each segment (or arange(T) + cache offset).
      segment_ids: [B, T], 0 = padding, equal ids attend to each other causally; default all ones.
      cache: a `KVCache` to read and extend (decoding); None for a plain forward pass.
      last_only: return logits for the last position only ([B, 1, V]), as generation needs.
      decode_layout: a tied LM head multiplies with the embedding table on the left (`tempax.ops.tied_lm_head`),
        the form XLA:CPU runs fastest in few-row decode products; same logits, no copy of any weight.
      fresh_cache: `cache` is known to hold nothing yet (a prefill): attention reads only the keys written now.
    Returns logits [B, T, V] in float32 and the updated cache (None without one).

    The layers are one `DecoderLayer` with stacked weights (`layers`, leading axis `num_layers`) run under
    `jax.lax.scan`: a program holds one layer's code whatever the depth, so compile time does not grow with it.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        # Construction order (embedding, layers, head) fixes which random draws each weight gets;
        # `tempax.models.init.init_decoder` builds the same three parts as separate programs in this order.
        self.config = cfg
        with nnx.use_eager_sharding(False):
            self.embed_tokens = make_embedding(cfg, rngs)
            # A hybrid stack (Qwen3.5) keeps its softmax-attention and its linear-attention layers as two stacks
            # (`layers`, `linear_layers`), each in layer order; `_run_hybrid_layers` interleaves them.
            stacks = cfg.layer_stacks()
            self.layers = stack_layers([DecoderLayer(cfg, rngs=rngs) for _ in stacks["layers"]])
            self.linear_layers = nnx.data(stack_layers([DecoderLayer(cfg, rngs=rngs, linear=True)
                                                         for _ in cfg.linear_attention_layers])
                                          if cfg.linear_attention_layers else None)
            # Gemma 4's layers of another shape than `layers`' (full layers of their own attention shape, KV-shared
            # layers of a wider MLP): stacks of their own, interleaved with `layers` by `_run_kind_blocks`
            for name in ("full_layers", "shared_layers", "shared_full_layers"):
                setattr(self, name, nnx.data(stack_layers([DecoderLayer(cfg.stack_config(name), rngs=rngs)
                                                           for _ in stacks[name]]) if name in stacks else None))
            self.norm, self.lm_head = make_head(cfg, rngs)
            # Gemma 4's per-layer input embedding and projection, drawn after the head
            self.per_layer_inputs = nnx.data(PerLayerInputs(cfg, rngs=rngs) if cfg.per_layer_input_size else None)

    # ----------------------------------------------------------------------------------------------------------
    def hidden_states(
        self,
        tokens: jax.Array,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        cache: KVCache | None = None,
        fresh_cache: bool = False,
    ) -> tuple[jax.Array, KVCache | None]:
        """Final-norm hidden states [B, T, D] (what the LM head and a reward head read). `fresh_cache`: `cache`
        is known to be empty (a prefill; see `Attention.__call__`)."""
        b, t = tokens.shape
        if segment_ids is None:
            segment_ids = jnp.ones((b, t), jnp.int32)
        offset = jnp.int32(0) if cache is None else cache.length
        q_index = offset + jnp.arange(t, dtype=jnp.int32)
        if positions is None:
            positions = default_positions(segment_ids) + (0 if cache is None else cache.next_position[:, None])
        x = self.embed_tokens(tokens)
        if self.config.embed_scale:
            x = x * jnp.asarray(math.sqrt(self.config.hidden_size), x.dtype)
        x = shard(x, ("batch", "seq", "act_embed"))
        per_layer = None if self.per_layer_inputs is None else self.per_layer_inputs(tokens, x)
        k_segments = None
        if cache is not None:
            k_segments = jax.lax.dynamic_update_slice(cache.segment_ids, segment_ids.astype(jnp.int32), (0, offset))
        if self.linear_layers is not None:
            x, new_k, new_v, linear_states = self._run_hybrid_layers(x, positions, q_index, segment_ids, cache,
                                                                     k_segments, offset, fresh_cache)
        elif len(self.config.layer_stacks()) > 1:
            x, new_k, new_v = self._run_kind_blocks(x, positions, q_index, segment_ids, cache, k_segments, offset,
                                                    fresh_cache, per_layer)
            linear_states = None
        else:
            x, new_k, new_v, linear_states = self._run_layers(x, positions, q_index, segment_ids, cache, k_segments,
                                                              offset, fresh_cache, per_layer)
        x = self.norm(x)
        new_cache = None
        if cache is not None:
            last_pos = jnp.max(jnp.where(segment_ids != 0, positions, -1), axis=1)
            conv, state = linear_states if linear_states is not None else (None, None)
            new_cache = KVCache(
                k=new_k, v=new_v, segment_ids=k_segments, length=offset + t,
                next_position=jnp.maximum(cache.next_position, last_pos + 1), conv=conv, state=state,
            )
        return x, new_cache

    def _run_layers(self, x, positions, q_index, segment_ids, cache, k_segments, offset, fresh_cache,
                    per_layer_inputs=None):
        """x through every layer, a scan over the stacked weights; returns (x, cache keys, cache values).

        Gemma 4's switches ride along: the per-layer inputs [L, B, T, P] and `layer_switches` are scanned with the
        weights, and with `ModelConfig.kv_shared_layers` the scan carries the last keys and values [B, T, K, H] each
        kind of layer (sliding, full) attended to, which a KV-shared layer attends to in place of its own (and
        writes into its cache slots, so decoding reads them from there as from any layer's).

        A cache is scanned with the layers ([L, B, K, S, H]: each step reads its layer's buffers) and only read
        there; the scan returns each layer's new slots [L, B, K, T, H], written into the stack once after it, in
        place when the cache is donated. Returning whole per-layer buffers would write the entire cache every
        step, and carrying the stack through the scan to write each layer's slot in it makes XLA copy the whole
        stack in every layer (the old stack is still read after the write; tests/models/test_decoder.py checks
        the compiled decode loop). A decode step (one new position, nothing to differentiate) indexes its layer's
        buffers in the closed-over stack instead of scanning them: the slot engine vmaps the step over a
        slot-major stack [slots, L, ...], which scanning would transpose, copying the whole cache, every step
        (a differentiated pass scans them, or the closure's gradient would be a whole stack carried and added to in
        every layer). Remat (`ModelConfig.remat`) applies to one layer's computation,
        inside the scan, also with a cache: GRPO's and PPO's training pass runs the prompts into a cache and the
        completions against it. Without differentiation jax.checkpoint adds nothing, so decoding under a remat
        config compiles to the same program (tests/models/test_remat.py).

        A mixture-of-experts model inside `tempax.models.moe.recording_router_statistics` (a training loss) also
        forms each layer's `RouterStatistics` of the real tokens in the scan, as a scanned output, and records
        their sum over the layers: what transformers' load-balancing loss pools."""
        cfg = self.config
        graphdef, weights, shared = nnx.split(self.layers, _stacked_filter, ...)
        # Only an active dropout changes `shared` (its random stream); otherwise it is not written back, so a
        # model whose state belongs to an outer trace (a closure of jit or grad) runs without mutating it.
        write_back = _draws_randomness(self.layers)
        inv_freq, sliding = layer_constants(cfg, positions)
        k_eq_v, reuse = layer_switches(cfg)
        per_layer = (weights, inv_freq, sliding, rope_scales(cfg), jnp.arange(cfg.num_layers, dtype=jnp.int32),
                     (k_eq_v, reuse, per_layer_inputs))
        moe = cfg.moe if is_recording_router_statistics() else None
        kinds = layer_kinds(cfg)
        b, t, _ = x.shape
        # the keys and values each kind of layer last attended to ([sliding, full]), for the KV-shared layers
        empty = jnp.zeros((b, t, cfg.num_kv_heads, cfg.head_dim), x.dtype)
        last_kv = ((empty, empty), (empty, empty)) if reuse is not None else None

        def layer(shared, weights, x, kv, inv_freq, sliding, rope_scale, switches, last_kv):
            # copy: the layer's Variables belong to this trace (remat's, or the scan's), so an adapter's dropout
            # may advance its random stream in them; the advanced stream leaves as `shared`.
            module = nnx.merge(graphdef, weights, shared, copy=True)
            k_eq_v, reuse, per_layer_input = switches
            slides = None
            shared_kv = None
            if last_kv is not None:
                slides = sliding if sliding is not None else jnp.asarray(kinds[0] == "sliding")
                mine = jax.tree.map(lambda s, f: jnp.where(slides, s, f), *last_kv)
                shared_kv = (*mine, reuse)
            x, new_kv, router_logits, attended = module(
                x, positions, q_index, segment_ids, kv, fresh_cache, inv_freq, sliding, rope_scale,
                k_eq_v=k_eq_v, shared=shared_kv, per_layer_input=per_layer_input)
            if last_kv is not None:  # a layer with keys of its own makes them its kind's latest
                keep = lambda on, old: jax.tree.map(lambda a, o: jnp.where(on & ~reuse, a, o), attended, old)  # noqa
                last_kv = (keep(slides, last_kv[0]), keep(~slides, last_kv[1]))
            stats = None
            if moe is not None:
                stats = router_statistics(router_logits, experts_per_token=moe.experts_per_token,
                                          mask=segment_ids != 0)
            return x, new_kv, nnx.state(module, nnx.Not(_stacked_filter)), stats, last_kv

        if cfg.remat != "none":
            layer = jax.checkpoint(layer, policy=_remat_policy(cfg.remat), prevent_cse=False)

        def finish(shared, stats):
            if write_back:
                nnx.update(self.layers, shared)
            if moe is not None:
                record_router_statistics(moe, jax.tree.map(lambda a: jnp.sum(a, axis=0), stats))

        if cache is None:
            def body(carry, xs):
                x, shared, last_kv = carry
                weights, inv_freq, sliding, rope_scale, _, switches = xs
                x, _, shared, stats, last_kv = layer(shared, weights, x, None, inv_freq, sliding, rope_scale, switches,
                                                     last_kv)
                return (x, shared, last_kv), stats

            (x, shared, _), stats = jax.lax.scan(body, (x, shared, last_kv), per_layer)
            finish(shared, stats)
            return x, None, None, None

        decode_step = x.shape[1] == 1 and not fresh_cache

        def scanned(carry, xs):
            x, shared, last_kv = carry
            (weights, inv_freq, sliding, rope_scale, i, switches), layer_kv = xs
            if decode_step:
                layer_kv = tuple(jax.lax.dynamic_index_in_dim(c, i, keepdims=False) for c in (cache.k, cache.v))
            x, slots, shared, stats, last_kv = layer(shared, weights, x, (*layer_kv, k_segments, offset), inv_freq,
                                                     sliding, rope_scale, switches, last_kv)
            return (x, shared, last_kv), (slots, stats)

        kv_xs = None if decode_step else (cache.k, cache.v)
        (x, shared, _), ((slots_k, slots_v), stats) = jax.lax.scan(scanned, (x, shared, last_kv), (per_layer, kv_xs))
        finish(shared, stats)
        at = (0, 0, 0, offset, 0)
        return (x, jax.lax.dynamic_update_slice(cache.k, slots_k, at),
                jax.lax.dynamic_update_slice(cache.v, slots_v, at), None)

    def _linear_masks(self, segment_ids: jax.Array, cache: KVCache | None, offset: jax.Array
                      ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """What the linear-attention layers need of the segments: (taps [B, T, K], where convolution tap j of token
        t reads (`tempax.ops.linear_attention.conv_taps`); reset [B, T], a sequence starts at t (its state is
        emptied); real [B, T], t is not padding; kept [B, K-1], the convolution inputs the cache keeps).

        Padding (segment 0) passes the state through untouched, so a sequence continues across it: a finished
        row fed padding while others decode, or a turn's right-padded tokens, leave the state of the row's last
        real token. The cache's history holds the inputs of its last real sequence (`GatedDeltaNet`), whose
        segment is the last non-zero one before the call."""
        k = self.config.linear_attention.conv_kernel
        b, t = segment_ids.shape
        segment_ids = segment_ids.astype(jnp.int32)
        before = -jnp.ones((b,), jnp.int32)
        if cache is not None:
            slots = jnp.arange(cache.max_len)
            written = (slots < offset) & (cache.segment_ids != 0)
            last = jnp.max(jnp.where(written, slots, -1), axis=1)
            before = jnp.where(last >= 0, jnp.take_along_axis(cache.segment_ids, jnp.maximum(last, 0)[:, None],
                                                              axis=1)[:, 0], -1)
        real = segment_ids != 0
        # each token's previous real segment: the cache's, then the latest non-padding one in the call
        index = jnp.where(real, jnp.arange(t), -1)
        latest = jax.lax.cummax(index, axis=1)
        previous = jnp.concatenate([jnp.full((b, 1), -1, jnp.int32), latest[:, :-1]], axis=1)
        previous_segment = jnp.where(previous >= 0, jnp.take_along_axis(segment_ids, jnp.maximum(previous, 0), axis=1),
                                     before[:, None])
        reset = real & (previous_segment != segment_ids)
        taps, kept = delta.conv_taps(
            jnp.concatenate([jnp.broadcast_to(before[:, None], (b, k - 1)), segment_ids], axis=1), k - 1)
        return taps, reset, real, kept

    def _run_hybrid_layers(self, x, positions, q_index, segment_ids, cache, k_segments, offset, fresh_cache):
        """`_run_layers` for a stack that interleaves softmax-attention and linear-attention layers (Qwen3.5): a
        scan over repetitions of one block of layers (`ModelConfig.layer_block`, e.g. three linear and one
        attention layer), the block's layers written out in its body, each taking its weights from its kind's
        stack. A program holds one block's code whatever the depth. Returns (x, cache keys, cache values,
        (convolution histories, delta-rule states) of the linear layers, or None without a cache)."""
        cfg = self.config
        block = cfg.layer_block()
        groups = cfg.num_layers // len(block)
        n_linear = sum(block)
        n_attention = len(block) - n_linear
        graph_a, weights_a, shared_a = nnx.split(self.layers, _stacked_filter, ...)
        graph_l, weights_l, shared_l = nnx.split(self.linear_layers, _stacked_filter, ...)
        write_back = _draws_randomness(self.layers) or _draws_randomness(self.linear_layers)
        inv_freq, sliding = layer_constants(cfg, positions)
        attention = np.asarray(cfg.attention_layers)
        pick = lambda a: None if a is None else a[attention]  # noqa: E731

        def grouped(n: int) -> Any:
            return lambda a: a.reshape(groups, n, *a.shape[1:])

        def grouped_weights(weights: Any, n: int) -> Any:
            # [L, ...] -> [G, n, ...], each weight kept split as it is: unconstrained, the partitioner may gather
            # every layer's weights before the scan instead of one layer's in it (and XLA:CPU's collectives then
            # deadlock on 8 devices)
            def one(var: nnx.Variable) -> nnx.Variable:
                names = var.get_metadata().get("out_sharding")
                value = grouped(n)(var.get_value())
                return var.replace(shard(value, (None, *names)) if names else value)

            return jax.tree.map(one, weights, is_leaf=lambda v: isinstance(v, nnx.Variable))

        attention_xs = (grouped_weights(weights_a, n_attention),
                        *jax.tree.map(grouped(n_attention), (pick(inv_freq), pick(sliding), pick(rope_scales(cfg)))))
        linear_xs = grouped_weights(weights_l, n_linear)
        masks = self._linear_masks(segment_ids, cache, offset)
        moe = cfg.moe if is_recording_router_statistics() else None
        real = segment_ids != 0

        def run(graphdef):
            def layer(shared, weights, x, kv, *constants):
                module = nnx.merge(graphdef, weights, shared, copy=True)
                if module.linear_attn is not None:
                    x, new_kv, router_logits, _ = module(x, None, None, None, kv, fresh_cache, None, None,
                                                         linear_masks=masks)
                else:
                    x, new_kv, router_logits, _ = module(x, positions, q_index, segment_ids, kv, fresh_cache,
                                                         *constants)
                stats = None
                if moe is not None:
                    stats = router_statistics(router_logits, experts_per_token=moe.experts_per_token, mask=real)
                return x, new_kv, nnx.state(module, nnx.Not(_stacked_filter)), stats

            if cfg.remat != "none":
                layer = jax.checkpoint(layer, policy=_remat_policy(cfg.remat), prevent_cse=False)
            return layer

        attention_layer, linear_layer = run(graph_a), run(graph_l)
        kv_xs = None if cache is None else jax.tree.map(grouped(n_attention), (cache.k, cache.v))
        state_xs = None if cache is None else jax.tree.map(grouped(n_linear), (cache.conv, cache.state))

        def body(carry, xs):
            x, shared_a, shared_l = carry
            (w_a, inv_g, sliding_g, scale_g), w_l, kv_g, state_g = xs
            slots, states, stats = [], [], []
            a = i = 0
            for is_linear in block:
                if is_linear:
                    kv = None if state_g is None else (state_g[0][i], state_g[1][i])
                    x, new_state, shared_l, st = linear_layer(shared_l, jax.tree.map(lambda v: v[i], w_l), x, kv)
                    states.append(new_state)
                    i += 1
                else:
                    kv = None if kv_g is None else (kv_g[0][a], kv_g[1][a], k_segments, offset)
                    x, new_kv, shared_a, st = attention_layer(
                        shared_a, jax.tree.map(lambda v: v[a], w_a), x, kv, inv_g[a],
                        None if sliding_g is None else sliding_g[a], None if scale_g is None else scale_g[a])
                    slots.append(new_kv)
                    a += 1
                stats.append(st)
            stacked = lambda items: (None if items[0] is None  # noqa: E731
                                     else jax.tree.map(lambda *z: jnp.stack(z), *items))
            block_stats = None if moe is None else jax.tree.map(lambda *z: sum(z), *stats)
            return (x, shared_a, shared_l), (stacked(slots) if cache is not None else None,
                                             stacked(states) if cache is not None else None, block_stats)

        (x, shared_a, shared_l), (slots, states, stats) = jax.lax.scan(
            body, (x, shared_a, shared_l), (attention_xs, linear_xs, kv_xs, state_xs))
        if write_back:
            nnx.update(self.layers, shared_a)
            nnx.update(self.linear_layers, shared_l)
        if moe is not None:
            record_router_statistics(moe, jax.tree.map(lambda a: jnp.sum(a, axis=0), stats))
        if cache is None:
            return x, None, None, None
        flat = lambda a: a.reshape(-1, *a.shape[2:])  # noqa: E731 ([G, n, ...] -> [G * n, ...], layer order)
        slots_k, slots_v = flat(slots[0]), flat(slots[1])
        at = (0, 0, 0, offset, 0)
        return (x, jax.lax.dynamic_update_slice(cache.k, slots_k, at),
                jax.lax.dynamic_update_slice(cache.v, slots_v, at), (flat(states[0]), flat(states[1])))

    def _run_kind_blocks(self, x, positions, q_index, segment_ids, cache, k_segments, offset, fresh_cache,
                         per_layer_inputs):
        """`_run_layers` for a Gemma 4 stack whose layers are of more than one shape (`ModelConfig.layer_stacks`:
        full layers of their own attention shape, `global_head_dim`; KV-shared layers of a wider MLP): a scan over
        repetitions of one block of the layer pattern (`ModelConfig.kind_block`, e.g. five sliding layers and a
        full one), the block's layers written out in its body, each taking its weights from its stack. With wider
        KV-shared layers the layers before them and they are two such scans (segments), each over its own stacks.
        Every layer's cache entry is of `ModelConfig.cache_shape`; a layer reads and writes the corner [K, H] of its
        own shape. The keys and values a KV-shared layer reuses are carried per kind of layer, each in its kind's
        shape. Returns (x, cache keys, cache values)."""
        cfg = self.config
        n = cfg.num_layers
        stacks = cfg.layer_stacks()
        names = [cfg.stack_name(i) for i in range(n)]
        configs = {name: cfg.stack_config(name) for name in stacks}
        modules = {name: getattr(self, name) for name in stacks}
        split = {name: nnx.split(module, _stacked_filter, ...) for name, module in modules.items()}
        write_back = any(_draws_randomness(module) for module in modules.values())
        moe = cfg.moe if is_recording_router_statistics() else None
        full_cfg = cfg.full_attention_config()
        shapes = {"sliding": (cfg.num_kv_heads, cfg.head_dim), "full": (full_cfg.num_kv_heads, full_cfg.head_dim)}
        kinds = [cfg.layer_type(i) for i in range(n)]
        k_eq_v, reuse = layer_switches(cfg)
        b, t, _ = x.shape
        last_kv = None
        if reuse is not None:  # the keys and values each kind of layer last attended to, in its own shape
            last_kv = {kind: (jnp.zeros((b, t, *shapes[kind]), x.dtype),) * 2 for kind in ("sliding", "full")}
        real = segment_ids != 0
        cache_heads, cache_width = cfg.cache_shape
        constants = {}
        for name, stack_cfg in configs.items():  # rotary tables of each stack's head width, at its layers
            inv_freq, _ = layer_constants(stack_cfg, positions)
            constants[name] = (inv_freq[np.asarray(stacks[name])], _picked(rope_scales(stack_cfg), stacks[name]))

        def run(graphdef: Any, index: int) -> Any:
            """The layer at `index` of its stack's group, its weights sliced from the group's inside the remat
            boundary: sliced outside it, each slice is a value of the scan's body that the backward pass needs,
            which JAX keeps as a residual of its own, i.e. a second copy of the stack's weights; inside, the
            residual is the group's weights, the scan's own input, which JAX passes on without copying. Without
            remat the slices alone are recomputed (`_LAYER_WEIGHTS`) and every other value is kept, as the plain
            scan keeps them."""
            def layer(shared, group_weights, x, kv, inv_freq, slides, rope_scale, switches, shared_kv):
                weights = jax.tree.map(lambda v: checkpoint_name(v[index], _LAYER_WEIGHTS), group_weights)
                module = nnx.merge(graphdef, weights, shared, copy=True)
                k_eq_v, reuse, per_layer_input = switches
                x, new_kv, router_logits, attended = module(
                    x, positions, q_index, segment_ids, kv, fresh_cache, inv_freq, slides, rope_scale,
                    k_eq_v=k_eq_v, shared=shared_kv, per_layer_input=per_layer_input)
                stats = None
                if moe is not None:
                    stats = router_statistics(router_logits, experts_per_token=moe.experts_per_token, mask=real)
                return x, new_kv, nnx.state(module, nnx.Not(_stacked_filter)), stats, attended

            policy = (_remat_policy(cfg.remat) if cfg.remat != "none"
                      else jax.checkpoint_policies.save_anything_except_these_names(_LAYER_WEIGHTS))
            return jax.checkpoint(layer, policy=policy, prevent_cse=False)

        def corner(buffer: jax.Array, kind: str) -> jax.Array:  # [B, Kc, S, Hc] -> [B, K, S, H] of the kind
            heads, width = shapes[kind]
            return buffer[:, :heads, :, :width]

        def padded(slot: jax.Array) -> jax.Array:  # [B, K, T, H] -> [B, Kc, T, Hc]
            return jnp.pad(slot, ((0, 0), (0, cache_heads - slot.shape[1]), (0, 0), (0, cache_width - slot.shape[3])))

        # segments: the layers before the KV-shared ones and those, when those are stacks of their own
        first_shared = n - cfg.kv_shared_layers
        cuts = [0, first_shared, n] if cfg.wide_shared_mlp else [0, n]
        shared_states = {name: split[name][2] for name in stacks}
        all_slots, all_stats = [], []
        for start, end in zip(cuts[:-1], cuts[1:]):
            block = _period(kinds[start:end])
            groups = (end - start) // len(block)
            block_stacks = [names[start + j] for j in range(len(block))]
            used = list(dict.fromkeys(block_stacks))
            count = {name: block_stacks.count(name) for name in used}
            grouped = lambda m: (lambda a: None if a is None else a.reshape(groups, m, *a.shape[1:]))  # noqa: E731
            stack_xs = {name: (_grouped_weights(split[name][1], groups, count[name]),
                               *jax.tree.map(grouped(count[name]), constants[name])) for name in used}
            window = lambda a: None if a is None else a[start:end]  # noqa: E731 ([L, ...]: this segment's layers)
            switch_xs = jax.tree.map(grouped(len(block)), (window(k_eq_v), window(reuse), window(per_layer_inputs)))
            kv_xs = None if cache is None else jax.tree.map(grouped(len(block)), (window(cache.k), window(cache.v)))
            layer_fns = {(name, a): run(split[name][0], a) for name in used for a in range(count[name])}

            def body(carry, xs, block=block, block_stacks=block_stacks, layer_fns=layer_fns):
                x, shared, last_kv = carry
                shared = dict(shared)
                last_kv = None if last_kv is None else dict(last_kv)
                per_stack, (k_eq_v_g, reuse_g, inputs_g), kv_g = xs
                slots, stats = [], []
                seen = dict.fromkeys(per_stack, 0)
                for j, (kind, name) in enumerate(zip(block, block_stacks)):
                    w, inv_g, scale_g = per_stack[name]
                    a = seen[name]
                    seen[name] += 1
                    kv = (None if kv_g is None
                          else (corner(kv_g[0][j], kind), corner(kv_g[1][j], kind), k_segments, offset))
                    switches = tuple(None if z is None else z[j] for z in (k_eq_v_g, reuse_g, inputs_g))
                    shared_kv = None if last_kv is None else (*last_kv[kind], reuse_g[j])
                    x, new_kv, shared[name], st, attended = layer_fns[name, a](
                        shared[name], w, x, kv, inv_g[a], jnp.asarray(kind == "sliding"),
                        None if scale_g is None else scale_g[a], switches, shared_kv)
                    if last_kv is not None:  # a layer with keys of its own makes them its kind's latest
                        last_kv[kind] = jax.tree.map(lambda new, old: jnp.where(reuse_g[j], old, new), attended,
                                                     last_kv[kind])
                    if new_kv is not None:
                        slots.append(tuple(padded(z) for z in new_kv))
                    stats.append(st)
                stacked = None if not slots else jax.tree.map(lambda *z: jnp.stack(z), *slots)
                block_stats = None if moe is None else jax.tree.map(lambda *z: sum(z), *stats)
                return (x, shared, last_kv), (stacked, block_stats)

            (x, segment_shared, last_kv), (slots, stats) = jax.lax.scan(
                body, (x, {name: shared_states[name] for name in used}, last_kv), (stack_xs, switch_xs, kv_xs))
            shared_states.update(segment_shared)
            all_slots.append(slots)
            all_stats.append(stats)
        if write_back:
            for name, module in modules.items():
                nnx.update(module, shared_states[name])
        if moe is not None:
            record_router_statistics(moe, jax.tree.map(lambda *a: sum(jnp.sum(z, axis=0) for z in a), *all_stats))
        if cache is None:
            return x, None, None
        flat = lambda a: a.reshape(-1, *a.shape[2:])  # noqa: E731 ([G, n, ...] -> [L, ...], layer order)
        slots_k = jnp.concatenate([flat(z[0]) for z in all_slots])
        slots_v = jnp.concatenate([flat(z[1]) for z in all_slots])
        at = (0, 0, 0, offset, 0)
        return (x, jax.lax.dynamic_update_slice(cache.k, slots_k, at),
                jax.lax.dynamic_update_slice(cache.v, slots_v, at))

    def logits(self, hidden: jax.Array, decode_layout: bool = False) -> jax.Array:
        """LM head (tied or untied) and final soft-capping; float32 logits. `decode_layout`: see `Decoder`."""
        if self.lm_head is None:
            embed = self.embed_tokens  # the same dtype promotion as `embed.attend`
            query, table = embed.promote_dtype((hidden, embed.embedding[...]), dtype=embed.dtype)
            logits = ops.tied_lm_head(query, table, table_on_left=decode_layout)
        else:
            logits = self.lm_head(hidden)
        logits = ops.softcap(logits.astype(jnp.float32), self.config.final_logit_softcap)
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
        fresh_cache: bool = False,
    ) -> tuple[jax.Array, KVCache | None]:
        hidden, cache = self.hidden_states(tokens, positions=positions, segment_ids=segment_ids, cache=cache,
                                           fresh_cache=fresh_cache)
        if last_only:
            # Generation needs only the next-token logits; skipping the LM head elsewhere saves a
            # [B, T, V] matmul in prefill (most of a small model's prefill FLOPs).
            hidden = hidden[:, -1:]
        return self.logits(hidden, decode_layout), cache


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


def lm_head_of(model: Decoder, *, master: bool = False) -> tuple[jax.Array, bool]:
    """(head weight, vocab_major) of a `Decoder`: the tied embedding table [V, D] or the untied `lm_head` kernel
    [D, V], in the model's compute dtype, or with `master` in its stored dtype (for
    `tempax.ops.fused_causal_lm_loss`, which casts it itself and returns its gradient in that dtype)."""
    dtype = jnp.dtype(model.config.dtype)
    weight, vocab_major = ((model.embed_tokens.embedding[...], True) if model.lm_head is None
                           else (model.lm_head.kernel[...], False))
    return (weight if master else weight.astype(dtype)), vocab_major
