"""The LM head and the causal-LM cross-entropy fused, computed over sequence chunks, with the gradient formed in
the forward pass: the [B, T, V] float32 logits and their gradient (4 B T V bytes each) never exist at once.

The loss is linear in the per-token NLLs with coefficients known up front (the loss mask over its normaliser),
so the gradient with respect to the logits is known as soon as they are:

    z = h W                                    logits of one chunk   [C, V]   (W: [D, V], or the tied [V, D]^T)
    nll_i = logsumexp(z_i) - z_i[y_i]
    L = sum_i c_i nll_i,      c_i = mask_i / sum(mask)          (tokens)   or  mask_i / (n_row(i) * rows)  (sequences)
    dL/dz_i = c_i (softmax(z_i) - onehot(y_i))
    dL/dh_i = dL/dz_i W^T,    dL/dW = sum_i h_i^T dL/dz_i

A custom VJP computes the three products chunk by chunk in the forward pass and keeps only dL/dh [B, T, D] and
dL/dW for the backward: one chunk's logits at a time, as many products as plain autodiff. Gemma-2-style final
soft-capping z = cap tanh(z' / cap) is applied inside, with dz'/dz = 1 - tanh^2. The value is
`tempax.algorithms.sft.losses.causal_lm_loss`'s (tested equal, value and gradients); Liger-Kernel's "fused linear
cross-entropy" is the same idea on GPUs. This docstring keeps the formulas it implements; what each part adds
(`compacted_chunks`, `HeadForms`, `fused_causal_lm_loss`, `fused_token_logprobs`) is said where it is defined.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from tempax.ops.plain import BF16


def head_logits(h: jax.Array, w: jax.Array, vocab_major: bool) -> jax.Array:
    """h [..., D] times the head: W [V, D] (vocab_major, a tied embedding) or [D, V]; float32 result."""
    dims = ((h.ndim - 1,), (1,) if vocab_major else (0,))
    return jax.lax.dot_general(h, w, (dims, ((), ())), preferred_element_type=jnp.float32)


def logsumexp_from_max(z: jax.Array, m: jax.Array) -> jax.Array:
    """logsumexp(z) over the last axis, given its max m: m + log(sum(exp(z - m)))."""
    return m + jnp.log(jnp.sum(jnp.exp(z - m[..., None]), axis=-1))


class HeadForms:
    """How the fused head forms a chunk's softmax and sums dL/dW: the plain forms (any backend), which compute exp
    once more and sum dL/dW in the head's own layout. `tempax.ops.cpu.lm_head.CPU_FORMS` are the forms XLA:CPU
    runs fast; `tempax.ops.fused_causal_lm_loss` passes the forms of the platform's variant.

    The sum of dL/dW over chunks is kept in `gradient_shape` and returned in the head's layout by
    `head_gradient`; here it is the head's own layout throughout.
    """

    def softmax(self, z: jax.Array, m: jax.Array, dtype: jnp.dtype) -> tuple[jax.Array, jax.Array | None]:
        """(logsumexp(z), softmax(z) or None) of a chunk's float32 logits z with max m; `dtype` is the hidden
        states'. None: the caller forms softmax(z) = exp(z - lse)."""
        del dtype
        return logsumexp_from_max(z, m), None

    def gradient_shape(self, w_shape: tuple[int, ...], vocab_major: bool, dtype: jnp.dtype) -> tuple[int, ...]:
        """The shape of the float32 sum of dL/dW over chunks."""
        del vocab_major, dtype
        return w_shape

    def gradient_chunk(self, hc: jax.Array, g: jax.Array, vocab_major: bool) -> jax.Array:
        """One chunk's dL/dW from h [B, C, D] and dL/dz g [B, C, V], summed over batch and chunk positions."""
        return jnp.einsum("bcd,bcv->vd" if vocab_major else "bcd,bcv->dv", hc, g, preferred_element_type=jnp.float32)

    def head_gradient(self, dw: jax.Array, vocab_major: bool, dtype: jnp.dtype) -> jax.Array:
        """The summed dL/dW in the head's layout ([V, D] when vocab_major, else [D, V])."""
        del vocab_major, dtype
        return dw


PLAIN_FORMS = HeadForms()


def _chunk_stats(h, w, targets, vocab_major, softcap):
    """(z, capped tanh or None, target logit, max) for one chunk; z is [B, C, V] float32."""
    z = head_logits(h, w, vocab_major)
    y = None
    if softcap is not None:
        y = jnp.tanh(z / softcap)
        z = softcap * y
    m = jnp.max(z, axis=-1)
    zt = jnp.take_along_axis(z, targets[..., None].astype(jnp.int32), axis=-1, mode="clip")[..., 0]
    return z, y, zt, m


def split_chunks(x: jax.Array, chunk: int) -> jax.Array:
    """[B, T, ...] -> [T / chunk, B, chunk, ...]: scan over sequence chunks, the (sharded) batch axis kept."""
    b, t = x.shape[:2]
    return x.reshape(b, t // chunk, chunk, *x.shape[2:]).swapaxes(0, 1)


def unsplit_chunks(x: jax.Array) -> jax.Array:
    n, b, c = x.shape[:3]
    return x.swapaxes(0, 1).reshape(b, n * c, *x.shape[3:])


def compaction_groups(rows: int) -> int:
    """How many groups of rows `compact_positions` sorts separately: 1 on one device; under an active mesh
    (`jax.set_mesh`) one per device, each device's contiguous share of the (batch-sharded) rows, so the sort and
    gather stay on the device; one per row when the rows do not split evenly."""
    mesh = jax.sharding.get_abstract_mesh()
    devices = 1 if mesh.empty else mesh.size
    return devices if rows % devices == 0 else rows


def compact_positions(mask_bt: jax.Array, groups: int) -> tuple[jax.Array, jax.Array]:
    """(order [G, N], counts [G]): within each of `groups` groups of rows, flattened to N = rows / G * T
    positions, the indices of the positions whose mask (or weight) is not 0, in order, followed by the others; and
    how many there are. A stable sort, so `take_positions(x, order)` keeps the masked positions in sequence order."""
    b, t = mask_bt.shape
    unset = (mask_bt.reshape(groups, (b // groups) * t) == 0).astype(jnp.int32)  # a weight of either sign counts
    return jnp.argsort(unset, axis=-1, stable=True), jnp.sum(1 - unset, axis=-1)


def take_positions(x_bt: jax.Array, order: jax.Array) -> jax.Array:
    """x [B, T, ...] -> [G, N, ...] in `order` (`compact_positions`)."""
    g, n = order.shape
    flat = x_bt.reshape(g, n, *x_bt.shape[2:])
    index = order.reshape(g, n, *([1] * (x_bt.ndim - 2)))
    return jnp.take_along_axis(flat, index, axis=1)


def put_positions(x_gn: jax.Array, order: jax.Array, shape_bt: tuple[int, int]) -> jax.Array:
    """The inverse of `take_positions`: [G, N, ...] in `order` -> [B, T, ...] in place."""
    inverse = jnp.argsort(order, axis=-1)
    index = inverse.reshape(*inverse.shape, *([1] * (x_gn.ndim - 2)))
    return jnp.take_along_axis(x_gn, index, axis=1).reshape(*shape_bt, *x_gn.shape[2:])


def active_chunks(counts: jax.Array, length: int, chunk: int) -> jax.Array:
    """[length / chunk] bool: chunk k of compacted positions holds a masked position in some group."""
    return jnp.arange(length // chunk) * chunk < jnp.max(counts)


def compacted_chunks(mask_bt: jax.Array, chunk_len: int | None) -> tuple[jax.Array, int, jax.Array]:
    """(order, chunk, active) for both fused forms: the compaction of `mask_bt` into its groups
    (`compact_positions`), the chunk length over the N compacted positions (`chunk_size`), and which chunks run.

    `chunk_len` counts positions of a row: a chunk of a group holds `chunk_len` times the group's rows, as many
    positions as `chunk_len` positions of every row would. A group is the whole batch on one device, so counting
    the chunk over the group's flattened positions instead would shrink the head's products by the batch size
    (64-row products at the default, too few rows for the matrix units of a CPU or a TPU), and the memory plan
    (`tempax.train.memory`) sizes a chunk per row.

    A loss mask often covers a small part of a batch (assistant turns, a preference pair's two replies), and the
    head's three products and the [C, V] softmax cost the same at every position. So the masked positions of each
    group of rows are gathered to the front (in order: a stable sort of the mask), every chunk that holds none is
    skipped (`jax.lax.cond` inside the scan), and the results are put back in place. The values are unchanged: a
    position outside the mask contributes nothing to the loss, and its reported NLL / log-prob is 0."""
    groups = compaction_groups(mask_bt.shape[0])
    order, counts = compact_positions(mask_bt, groups)
    length = order.shape[1]
    chunk = chunk_size(length, chunk_len and chunk_len * (mask_bt.shape[0] // groups))
    return order, chunk, active_chunks(counts, length, chunk)


def _skipped(hc: jax.Array, *outputs_like: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
    """Zeros shaped like a chunk's per-position outputs (float32 [B, C], or [B, C, D] in h's dtype)."""
    return tuple(jnp.zeros(hc.shape[:-1] + extra, dtype) for extra, dtype in outputs_like)


def _h_product(g, w, vocab_major, dtype):
    """g [.., V] W^T -> [.., D]: the product that takes d/dz back to d/dh."""
    dims = (((g.ndim - 1,), (0,) if vocab_major else (1,)), ((), ()))
    return jax.lax.dot_general(g.astype(dtype), w, dims, preferred_element_type=jnp.float32)


@partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _weighted_nll(h, w, targets, coef, active, chunk, vocab_major, softcap, forms):
    """(sum c_i nll_i, nll [B, T], hit [B, T]); only the first output is differentiable. `w` may be a float32
    master of a lower-precision `h` (`fused_causal_lm_loss`). `active` [T / chunk] bool: chunks not active hold no
    position with c_i != 0 and are skipped (their nll and hit are 0)."""
    w = w.astype(h.dtype)

    def compute(hc, tc):
        z, _, zt, m = _chunk_stats(hc, w, tc, vocab_major, softcap)
        lse = logsumexp_from_max(z, m)
        return lse - zt, (zt >= m).astype(jnp.float32)

    def body(_, xs):
        hc, tc, on = xs
        skip = lambda hc, tc: _skipped(hc, ((), jnp.float32), ((), jnp.float32))
        return None, jax.lax.cond(on, compute, skip, hc, tc)

    _, (nll, hit) = jax.lax.scan(body, None, (split_chunks(h, chunk), split_chunks(targets, chunk), active))
    nll, hit = unsplit_chunks(nll), unsplit_chunks(hit)
    return jnp.sum(coef * nll), nll, hit


def _weighted_nll_fwd(h, w_master, targets, coef, active, chunk, vocab_major, softcap, forms):
    w = w_master.astype(h.dtype)  # the compute copy, made once for every chunk

    def compute(dw, hc, tc, cc):
        z, y, zt, m = _chunk_stats(hc, w, tc, vocab_major, softcap)
        lse, p = forms.softmax(z, m, hc.dtype)
        vocab = jax.lax.broadcasted_iota(jnp.int32, z.shape, z.ndim - 1)
        p = jnp.exp(z - lse[..., None]) if p is None else p
        g = (p - (vocab == tc[..., None]).astype(jnp.float32)) * cc[..., None]
        if y is not None:
            g = g * (1.0 - y * y)
        g = g.astype(hc.dtype)
        # dL/dh = g W^T; dL/dW = h^T g (or g^T h for a [V, D] head), summed over batch and chunk positions.
        dh = _h_product(g, w, vocab_major, hc.dtype).astype(hc.dtype)
        return dw + forms.gradient_chunk(hc, g, vocab_major), (lse - zt, (zt >= m).astype(jnp.float32), dh)

    def body(dw, xs):
        hc, tc, cc, on = xs
        skip = lambda dw, hc, tc, cc: (dw, _skipped(hc, ((), jnp.float32), ((), jnp.float32), ((hc.shape[-1],), hc.dtype)))
        return jax.lax.cond(on, compute, skip, dw, hc, tc, cc)

    dw0 = jnp.zeros(forms.gradient_shape(w.shape, vocab_major, h.dtype), jnp.float32)
    xs = (split_chunks(h, chunk), split_chunks(targets, chunk), split_chunks(coef, chunk), active)
    dw, (nll, hit, dh) = jax.lax.scan(body, dw0, xs)
    nll, hit, dh = unsplit_chunks(nll), unsplit_chunks(hit), unsplit_chunks(dh)
    dw = forms.head_gradient(dw, vocab_major, h.dtype)
    return (jnp.sum(coef * nll), nll, hit), (dh, dw.astype(w_master.dtype), nll, targets, active)


def _weighted_nll_bwd(chunk, vocab_major, softcap, forms, residuals, cotangents):
    dh, dw, nll, targets, active = residuals
    ct = cotangents[0]  # the NLL and hit outputs are reported, not differentiated
    return (dh * ct.astype(dh.dtype), dw * ct.astype(dw.dtype), _no_gradient(targets), nll * ct,
            _no_gradient(active))


def _no_gradient(x: jax.Array) -> np.ndarray:
    """The cotangent of an integer or boolean input."""
    return np.zeros(x.shape, dtype=jax.dtypes.float0)


_weighted_nll.defvjp(_weighted_nll_fwd, _weighted_nll_bwd)


def chunk_size(length: int, chunk_len: int | None) -> int:
    """The largest divisor of `length` that is at most `chunk_len` (None or >= length: the whole length). A
    divisor under a quarter of `chunk_len` (e.g. a prime length) would mean a long scan of tiny matmuls, slower
    than one whole-length chunk, so the whole length is used then."""
    if not chunk_len or chunk_len >= length:
        return length
    best = max(d for d in range(1, chunk_len + 1) if length % d == 0)
    return best if 4 * best >= chunk_len else length


def fused_causal_lm_loss(forms: HeadForms, hidden_btd: jax.Array, head: jax.Array, targets_bt: jax.Array,
                         loss_mask_bt: jax.Array, vocab_major: bool, normalize: str, chunk_len: int | None,
                         softcap: float | None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`tempax.ops.fused_causal_lm_loss` (whose docstring gives the arguments) with the softmax and dL/dW formed
    by `forms`: `PLAIN_FORMS`, or the CPU variant's.

    The head may be a float32 master weight under bfloat16 hidden states (`train.precision=bf16`): it is cast to
    the hidden states' dtype once, every product is bf16 x bf16 with float32 accumulation, and dL/dW is summed in
    float32 and returned in the master's dtype, never rounded to bf16 on the way. Token accuracy uses
    argmax == target <=> z[y] >= max(z), free once the max is known (ties count as a hit; they have probability
    ~0 with real logits)."""
    b, t = targets_bt.shape
    mask = loss_mask_bt.astype(jnp.float32)
    tokens_b = jnp.sum(mask, axis=-1)
    has_tokens_b = (tokens_b > 0).astype(jnp.float32)
    num_sequences = jnp.sum(has_tokens_b)
    num_tokens = jnp.sum(tokens_b)
    if normalize == "tokens":
        coef = mask / jnp.maximum(num_tokens, 1.0)
    elif normalize == "sequences":
        coef = mask / (jnp.maximum(tokens_b, 1.0) * jnp.maximum(num_sequences, 1.0))[:, None]
    else:
        raise ValueError(f"unknown normalization {normalize!r}")
    order, chunk, active = compacted_chunks(mask, chunk_len)
    loss, nll, hit = _weighted_nll(take_positions(hidden_btd, order), head, take_positions(targets_bt, order),
                                   take_positions(coef, order), active, chunk, vocab_major, softcap, forms)
    reported = put_positions(jax.lax.stop_gradient(jnp.stack([nll, hit], axis=-1)), order, (b, t))  # one inverse
    nll, hit = reported[..., 0], reported[..., 1]
    masked_nll = jnp.where(mask > 0, nll, 0.0)
    metrics = {
        "loss": loss,
        "nll_sum": jnp.sum(masked_nll),
        "num_tokens": num_tokens,
        "num_sequences": num_sequences,
        "token_accuracy": jnp.sum(jnp.where(mask > 0, hit, 0.0)) / jnp.maximum(num_tokens, 1.0),
        "per_example_loss": jnp.sum(masked_nll, axis=-1) / jnp.maximum(tokens_b, 1.0),
    }
    return loss, metrics


# --------------------------------------------------------------------------------------------------------------
# log p(y_t) at the masked positions only


def _chunk_logprob(hc, w, tc, vocab_major, softcap):
    """log p(y) [B, C] of one chunk: the forward value alone (`_chunk_logprob_and_dz` also returns p - onehot(y),
    minus its gradient in z)."""
    z, _, zt, m = _chunk_stats(hc, w, tc, vocab_major, softcap)
    return zt - logsumexp_from_max(z, m)


def _chunk_logprob_and_dz(hc, w, tc, vocab_major, softcap):
    """(log p(y) [B, C], p - onehot(y) scaled by the soft-cap's derivative [B, C, V]) of one chunk."""
    z, y, zt, m = _chunk_stats(hc, w, tc, vocab_major, softcap)
    lse = logsumexp_from_max(z, m)
    vocab = jax.lax.broadcasted_iota(jnp.int32, z.shape, z.ndim - 1)
    g = jnp.exp(z - lse[..., None]) - (vocab == tc[..., None]).astype(jnp.float32)
    if y is not None:
        g = g * (1.0 - y * y)
    return zt - lse, g


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _target_logprobs(h, w, targets, active, chunk, vocab_major, softcap):
    """log p(targets) [B, T] float32 from hidden states h [B, T, D] and the head `w`; chunks not `active` are
    skipped and give 0."""
    w = w.astype(h.dtype)

    def body(_, xs):
        hc, tc, on = xs
        compute = lambda hc, tc: _chunk_logprob(hc, w, tc, vocab_major, softcap)
        skip = lambda hc, tc: _skipped(hc, ((), jnp.float32))[0]
        return None, jax.lax.cond(on, compute, skip, hc, tc)

    _, logp = jax.lax.scan(body, None, (split_chunks(h, chunk), split_chunks(targets, chunk), active))
    return unsplit_chunks(logp)


def _target_logprobs_fwd(h, w_master, targets, active, chunk, vocab_major, softcap):
    w = w_master.astype(h.dtype)

    def body(_, xs):
        hc, tc, on = xs

        def compute(hc, tc):
            logp, g = _chunk_logprob_and_dz(hc, w, tc, vocab_major, softcap)
            return logp, (-_h_product(g, w, vocab_major, hc.dtype)).astype(hc.dtype)  # d log p / d h

        skip = lambda hc, tc: _skipped(hc, ((), jnp.float32), ((hc.shape[-1],), hc.dtype))
        return None, jax.lax.cond(on, compute, skip, hc, tc)

    _, (logp, score) = jax.lax.scan(body, None, (split_chunks(h, chunk), split_chunks(targets, chunk), active))
    return unsplit_chunks(logp), (h, w_master, targets, active, unsplit_chunks(score))


def _target_logprobs_bwd(chunk, vocab_major, softcap, residuals, ct):
    h, w_master, targets, active, score = residuals
    w = w_master.astype(h.dtype)
    dh = (score * ct[..., None].astype(score.dtype)).astype(h.dtype)

    # dL/dW = sum_t ct_t h_t^T d log p_t / d z_t, the chunk's logits computed again. A frozen head (LoRA) never
    # uses it, and JAX drops the scan from the program then.
    def body(dw, xs):
        hc, tc, cc, on = xs

        def compute(dw, hc, tc, cc):
            _, g = _chunk_logprob_and_dz(hc, w, tc, vocab_major, softcap)
            g = (-g * cc[..., None]).astype(hc.dtype)
            return dw + jnp.einsum("bcd,bcv->vd" if vocab_major else "bcd,bcv->dv", hc, g,
                                   preferred_element_type=jnp.float32)

        return jax.lax.cond(on, compute, lambda dw, *_: dw, dw, hc, tc, cc), None

    xs = (split_chunks(h, chunk), split_chunks(targets, chunk), split_chunks(ct, chunk), active)
    dw, _ = jax.lax.scan(body, jnp.zeros(w.shape, jnp.float32), xs)
    return dh, dw.astype(w_master.dtype), _no_gradient(targets), _no_gradient(active)


_target_logprobs.defvjp(_target_logprobs_fwd, _target_logprobs_bwd)


def fused_token_logprobs(hidden_btd: jax.Array, head: jax.Array, targets_bt: jax.Array, mask_bt: jax.Array,
                         vocab_major: bool, chunk_len: int | None, softcap: float | None) -> jax.Array:
    """`tempax.ops.fused_token_logprobs` (whose docstring gives the arguments): log p(y_t) at the masked positions,
    the preference losses' per-row sums of reply log-probs. Its forward pass keeps each position's d log p / d h,
    so a LoRA run's backward pass is a product by the incoming cotangent; only a trained head (full fine-tuning)
    recomputes the chunk's logits for dL/dW."""
    b, t = targets_bt.shape
    order, chunk, active = compacted_chunks(mask_bt, chunk_len)
    logp = _target_logprobs(take_positions(hidden_btd, order), head, take_positions(targets_bt, order), active,
                            chunk, vocab_major, softcap)
    return jnp.where(mask_bt != 0, put_positions(logp, order, (b, t)), 0.0)
