"""The KV cache for decoding: preallocated key/value buffers of every layer plus the bookkeeping masks need.

A functional pytree (no mutation): the decoder takes one and returns the extended one, so a decode loop can
be jitted and the buffers donated.
"""

from __future__ import annotations

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
    """

    k: jax.Array
    v: jax.Array
    segment_ids: jax.Array
    length: jax.Array
    next_position: jax.Array

    @classmethod
    def init(cls, cfg: ModelConfig, batch_size: int, max_len: int, dtype: jnp.dtype | None = None) -> "KVCache":
        dtype = dtype or jnp.dtype(cfg.dtype)
        shape = (cfg.num_layers, batch_size, cfg.num_kv_heads, max_len, cfg.head_dim)
        return cls(
            k=jnp.zeros(shape, dtype),
            v=jnp.zeros(shape, dtype),
            segment_ids=jnp.zeros((batch_size, max_len), jnp.int32),
            length=jnp.zeros((), jnp.int32),
            next_position=jnp.zeros((batch_size,), jnp.int32),
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
        )

    def nbytes(self) -> int:
        return sum(x.size * x.dtype.itemsize for x in (self.k, self.v))


def kv_bytes_per_position(config: ModelConfig) -> int:
    """Bytes one cache position takes for one row: keys and values of every layer."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * jnp.dtype(config.dtype).itemsize
