"""The KV cache for decoding: preallocated key/value buffers of every layer plus the bookkeeping masks need.

A functional pytree (no mutation): the decoder takes one and returns the extended one, so a decode loop can
be jitted and the buffers donated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from tempax.models.config import ModelConfig


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class KVCache:
    """Keys and values of every layer for `max_len` positions.

    Attributes:
      k, v: [L, B, K, S, H], every layer's buffers stacked as the decoder stacks its weights (it scans over
        both); kv heads before positions: the attention matmuls read each head's keys as one contiguous [S, H]
        block, so XLA need not transpose the whole cache every decode step.
      segment_ids: [B, S], 0 for slots not yet written or written by padding; a new token attends only to
        written slots of its own segment.
      length: int32 scalar, the number of slots written so far (the next write index; shared by all rows,
        which is why prompts are left-padded).
      next_position: [B] int32, the rotary position the next token of each row takes.
      conv, state: a hybrid model's linear-attention layers (Qwen3.5; None otherwise), a fixed size per row
        whatever the length: each layer's last conv_kernel - 1 convolution inputs [L_lin, B, K-1, C] and its
        delta-rule state [L_lin, B, Hv, dk, dv] float32. k and v then hold the softmax-attention layers only.
    """

    k: jax.Array
    v: jax.Array
    segment_ids: jax.Array
    length: jax.Array
    next_position: jax.Array
    conv: jax.Array | None = None
    state: jax.Array | None = None

    @classmethod
    def init(cls, cfg: ModelConfig, batch_size: int, max_len: int, dtype: jnp.dtype | None = None) -> "KVCache":
        dtype = dtype or jnp.dtype(cfg.dtype)
        heads, width = cfg.cache_shape  # Gemma 4: the larger of its two attention shapes
        shape = (len(cfg.attention_layers), batch_size, heads, max_len, width)
        conv = state = None
        if cfg.linear_attention_layers:
            la, n = cfg.linear_attention, len(cfg.linear_attention_layers)
            conv = jnp.zeros((n, batch_size, la.conv_kernel - 1, la.conv_channels), dtype)
            state = jnp.zeros((n, batch_size, la.num_value_heads, la.key_head_dim, la.value_head_dim), jnp.float32)
        return cls(
            k=jnp.zeros(shape, dtype),
            v=jnp.zeros(shape, dtype),
            segment_ids=jnp.zeros((batch_size, max_len), jnp.int32),
            length=jnp.zeros((), jnp.int32),
            next_position=jnp.zeros((batch_size,), jnp.int32),
            conv=conv,
            state=state,
        )

    @property
    def max_len(self) -> int:
        return self.segment_ids.shape[1]

    @property
    def batch_size(self) -> int:
        return self.segment_ids.shape[0]

    def repeat(self, n: int) -> "KVCache":
        """Each row repeated n times in place (row i -> rows i*n .. i*n+n-1): n samples share one prefill."""
        rep = lambda x, axis=0: jnp.repeat(x, n, axis=axis)  # noqa: E731
        return KVCache(
            k=rep(self.k, 1), v=rep(self.v, 1),
            segment_ids=rep(self.segment_ids), length=self.length, next_position=rep(self.next_position),
            conv=None if self.conv is None else rep(self.conv, 1),
            state=None if self.state is None else rep(self.state, 1),
        )

    def keeping_linear_state(self, before: "KVCache", rows: jax.Array, axis: int = 1) -> "KVCache":
        """This cache with `before`'s linear-attention state in the rows where `rows` [B] is true (the rows' axis
        of `conv` and `state` is `axis`); itself when the model has none. A decode loop feeds finished rows too
        (padding, or their stop token): their keys and values are masked out by position later, but a state has
        no positions, so it must not take them in."""
        if self.conv is None:
            return self

        def keep(old: jax.Array, new: jax.Array) -> jax.Array:
            shape = [1] * new.ndim
            shape[axis] = rows.shape[0]
            return jnp.where(rows.reshape(shape), old, new)

        return dataclasses.replace(self, conv=keep(before.conv, self.conv), state=keep(before.state, self.state))

    def nbytes(self) -> int:
        return sum(x.size * x.dtype.itemsize for x in (self.k, self.v, self.conv, self.state) if x is not None)


def kv_bytes_per_position(config: ModelConfig) -> int:
    """Bytes one cache position takes for one row: keys and values of every softmax-attention layer."""
    heads, width = config.cache_shape
    return 2 * len(config.attention_layers) * heads * width * jnp.dtype(config.dtype).itemsize


def linear_state_bytes(config: ModelConfig) -> int:
    """Bytes of one row's fixed-size linear-attention state (`KVCache.conv`, `KVCache.state`); 0 without one."""
    la = config.linear_attention
    if not config.linear_attention_layers:
        return 0
    per_layer = ((la.conv_kernel - 1) * la.conv_channels * jnp.dtype(config.dtype).itemsize
                 + la.num_value_heads * la.key_head_dim * la.value_head_dim * 4)
    return len(config.linear_attention_layers) * per_layer
