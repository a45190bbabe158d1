"""The fused head + cross-entropy equals `causal_lm_loss` on the model's logits, and `fused_token_logprobs` equals
`token_logprobs`: values, metrics and gradients; both compute only the chunks that hold masked positions."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from numpy.testing import assert_allclose

from tempax.algorithms.sft.main import make_sft_loss
from tempax.models.decoder import Decoder
from tempax.models.logprobs import token_logprobs
from tempax.ops import fused_causal_lm_loss, fused_token_logprobs
from tempax.ops.fused_head import (active_chunks, chunk_size, compact_positions, compacted_chunks, compaction_groups,
                                   put_positions, take_positions)
from tempax.models.presets import PRESETS
from tests.train.helpers import random_batch


@pytest.mark.parametrize(
    "family, normalize, chunk_len",
    [("llama", "tokens", None), ("qwen2", "tokens", 4), ("gemma2", "sequences", 8), ("qwen3", "tokens", 6)],
    ids=["untied-whole", "tied-chunked", "softcap-sequences", "chunk-not-a-divisor"],
)
def test_fused_loss_matches_plain_loss(family, normalize, chunk_len):
    """tiny-llama has an untied head, tiny-qwen2 a tied one, tiny-gemma2 a final soft-cap (30)."""
    cfg = PRESETS[f"tiny-{family}"]
    cfg = cfg.replace(num_layers=1, layer_types=cfg.layer_types[:1])
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    batch = {k: jnp.asarray(v) for k, v in random_batch(3, 16, seed=2).items()}
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def run(loss_fn):
        def f(p):
            return loss_fn(nnx.merge(graphdef, p, rest), batch)
        (loss, metrics), grads = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
        return loss, metrics, grads

    plain = run(make_sft_loss(normalize))
    fused = run(make_sft_loss(normalize, fused=True, chunk_len=chunk_len))
    assert_allclose(fused[0], plain[0], rtol=1e-5)
    for key in ("nll_sum", "num_tokens", "num_sequences", "token_accuracy", "per_example_loss", "loss_weight"):
        assert_allclose(fused[1][key], plain[1][key], rtol=1e-5, atol=1e-6, err_msg=key)
    for (path, g_fused), g_plain in zip(jax.tree_util.tree_leaves_with_path(fused[2]), jax.tree.leaves(plain[2])):
        assert_allclose(g_fused, g_plain, atol=2e-6, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


def test_chunk_size_is_the_largest_divisor_not_above_the_request():
    assert chunk_size(256, 64) == 64
    assert chunk_size(16, 6) == 4  # 16 = 4 x 4; 5 and 6 do not divide it
    assert chunk_size(255, 64) == 51  # 255 = 3 x 5 x 17
    assert chunk_size(97, 64) == 97  # a prime length: one whole chunk rather than 97 single positions
    assert chunk_size(16, None) == chunk_size(16, 16) == chunk_size(16, 99) == 16


def test_a_chunk_holds_chunk_len_positions_of_every_row():
    """On one device the whole batch is one group of compacted positions, and `chunk_len` counts positions of a
    row: 4 rows x 16 positions at chunk_len 4 give chunks of 16 compacted positions (4 chunks), not of 4 (16
    chunks of 4-row products). With 5 masked positions only the first chunk runs."""
    mask = jnp.zeros((4, 16), jnp.int32).at[0, :3].set(1).at[3, 7:9].set(1)
    order, chunk, active = compacted_chunks(mask, 4)
    assert order.shape == (1, 64) and chunk == 16
    assert active.tolist() == [True, False, False, False]
    assert compacted_chunks(mask, None)[1] == 64


@pytest.mark.parametrize("vocab_major", [False, True], ids=["untied", "tied"])
def test_float32_master_head_gets_its_gradient_in_float32(vocab_major):
    """bf16 hidden states with a float32 master head (train.precision=bf16): the head's gradient is summed and
    returned in float32, not rounded to bf16. Zero head, V = 3, one token with h = [1, 3], target 0, mask 1:
    softmax is uniform, so g = (1/3 - onehot) = [-2/3, 1/3, 1/3], cast to bf16 for the products:
    bf16(1/3) = 0.333984375, bf16(-2/3) = -0.66796875. dL/dW[d, v] = h_d g_v, so the row for h = 3 is
    [-2.00390625, 1.001953125, 1.001953125]: exact in float32, while bf16 (8 significant bits) would round
    1.001953125 = 1 + 2^-9 to 1.0."""
    h = jnp.array([[[1.0, 3.0]]], jnp.bfloat16)
    w = jnp.zeros((3, 2) if vocab_major else (2, 3), jnp.float32)
    targets, mask = jnp.array([[0]]), jnp.array([[1]])

    def loss(w):
        return fused_causal_lm_loss(h, w, targets, mask, vocab_major=vocab_major)[0]

    dw = jax.grad(loss)(w)
    assert dw.dtype == jnp.float32
    third, two_thirds = 0.333984375, -0.66796875
    want = jnp.array([[two_thirds, third, third], [3 * two_thirds, 3 * third, 3 * third]])
    assert_allclose(dw.T if vocab_major else dw, want, rtol=0, atol=0)
    assert_allclose(loss(w), jnp.log(3.0), rtol=1e-6)


def test_sft_loss_hands_the_fused_loss_the_float32_master_head():
    """Under bf16 compute the SFT loss passes the stored float32 head (so its gradient is never rounded to bf16
    on the way back through a cast); `lm_head_of` alone still gives the compute-dtype copy."""
    from tempax.models.decoder import lm_head_of
    from tempax.train.state import training_view

    cfg = PRESETS["tiny-qwen2"]
    view = training_view(Decoder(cfg.replace(num_layers=1, layer_types=cfg.layer_types[:1]), rngs=nnx.Rngs(0)),
                         precision="bf16")
    assert lm_head_of(view)[0].dtype == jnp.bfloat16
    head, vocab_major = lm_head_of(view, master=True)
    assert head.dtype == jnp.float32 and vocab_major


def _tied_case(v=64, d=16, b=2, t=12):
    kh, kw, kt = jax.random.split(jax.random.key(3), 3)
    h = jax.random.normal(kh, (b, t, d), jnp.float32)
    w = 0.5 * jax.random.normal(kw, (v, d), jnp.float32)
    targets = jax.random.randint(kt, (b, t), 0, v)
    mask = jnp.ones((b, t), jnp.int32).at[1, -3:].set(0)
    return h, w, targets, mask


@pytest.mark.parametrize("softcap", [None, 5.0], ids=["plain", "softcap"])
def test_bf16_tied_head_tracks_float32(softcap):
    """bf16 hidden states with a float32 tied [V, D] head, 3 chunks: loss within 1e-2 relative and both
    gradients within 2% relative L2 of the float32 computation (bf16 products, float32 sums)."""
    h, w, targets, mask = _tied_case()

    def loss(h, w):
        return fused_causal_lm_loss(h, w, targets, mask, vocab_major=True, chunk_len=4, softcap=softcap)[0]

    grad = jax.jit(jax.value_and_grad(loss, (0, 1)))
    ref, (dh_ref, dw_ref) = grad(h, w)
    got, (dh, dw) = grad(h.astype(jnp.bfloat16), w)
    assert dh.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
    assert_allclose(got, ref, rtol=1e-2)
    for g, r in ((dh.astype(jnp.float32), dh_ref), (dw, dw_ref)):
        assert float(jnp.linalg.norm(g - r) / jnp.linalg.norm(r)) < 0.02


def test_bf16_tied_head_gradient_is_made_in_the_embeddings_layout():
    """The bf16 tied head's gradient is summed as [V, D], so nothing after the chunk loop transposes a
    [V, D]-shaped array (the optimizer's fusions on the embedding read it row-major)."""
    h, w, targets, mask = _tied_case()

    def update(h, w):
        dw = jax.grad(lambda w: fused_causal_lm_loss(h, w, targets, mask, vocab_major=True, chunk_len=4)[0])(w)
        return w - 0.1 * dw

    hlo = jax.jit(update).lower(h.astype(jnp.bfloat16), w).compile().as_text()
    assert "transpose" in jax.jit(update).lower(h, w).compile().as_text()  # float32: [D, V] sum, transposed once
    assert not [line for line in hlo.splitlines() if "f32[64,16]" in line and "transpose(" in line]


# ------------------------------------------------------------------------------------------------------------
# Only the masked positions: compaction, skipped chunks, and `fused_token_logprobs`


def test_compaction_puts_the_masked_positions_first_in_order_and_back_in_place():
    """mask [[0, 1, 0, 1], [1, 0, 0, 0]]: as one group the flattened set positions 1, 3, 4 come first, then the
    unset ones in order; as two groups (one per row) each row is sorted alone."""
    mask = jnp.array([[0, 1, 0, 1], [1, 0, 0, 0]])
    order, counts = compact_positions(mask, 1)
    assert order.tolist() == [[1, 3, 4, 0, 2, 5, 6, 7]] and counts.tolist() == [3]
    order2, counts2 = compact_positions(mask, 2)
    assert order2.tolist() == [[1, 3, 0, 2], [0, 1, 2, 3]] and counts2.tolist() == [2, 1]
    x = jnp.arange(8.0).reshape(2, 4) * 10
    assert take_positions(x, order).tolist() == [[10.0, 30.0, 40.0, 0.0, 20.0, 50.0, 60.0, 70.0]]
    for o in (order, order2):
        assert_allclose(put_positions(take_positions(x, o), o, (2, 4)), x)
    # Chunks of 2 of the 8 compacted positions: the 3 set ones fill chunks 0 and 1.
    assert active_chunks(counts, 8, 2).tolist() == [True, True, False, False]
    assert active_chunks(counts2, 4, 2).tolist() == [True, False]
    # A weighted mask (RFT's) keeps every position whose weight is not 0, of either sign.
    weighted, n = compact_positions(jnp.array([[0.0, -0.5, 0.0, 2.0]]), 1)
    assert weighted.tolist() == [[1, 3, 0, 2]] and n.tolist() == [2]


def test_compaction_groups_follow_the_devices_of_an_active_mesh():
    assert compaction_groups(8) == 1  # one device: the whole batch is one group
    devices = jax.devices()[:2]
    if len(devices) < 2:
        pytest.skip("needs two devices (tests/conftest.py asks XLA for eight host devices)")
    with jax.set_mesh(jax.make_mesh((2,), ("data",), devices=devices)):
        assert compaction_groups(8) == 2  # each device's four rows
        assert compaction_groups(3) == 3  # rows that do not split evenly: one group a row


def _logprob_case(v=50, d=16, b=4, t=24, seed=0):
    kh, kw, kt, km, kc = jax.random.split(jax.random.key(seed), 5)
    h = jax.random.normal(kh, (b, t, d), jnp.float32)
    w = 0.5 * jax.random.normal(kw, (v, d), jnp.float32)
    targets = jax.random.randint(kt, (b, t), 0, v)
    mask = (jax.random.uniform(km, (b, t)) < 0.3).astype(jnp.int32).at[3].set(0)  # the last row: no position
    return h, w, targets, mask, jax.random.normal(kc, (b, t))


@pytest.mark.parametrize("vocab_major, softcap, chunk_len", [(True, None, 4), (False, None, 5), (True, 5.0, None)],
                         ids=["tied-chunked", "untied-chunk-not-a-divisor", "softcap-one-chunk"])
def test_fused_token_logprobs_equal_token_logprobs_at_the_masked_positions(vocab_major, softcap, chunk_len):
    """Values and both gradients (hidden states and head) equal autodiff of `token_logprobs` on the full logits,
    at the masked positions; 0 elsewhere."""
    h, w, targets, mask, ct = _logprob_case()
    w = w if vocab_major else w.T

    def plain(h, w):
        z = h @ (w.T if vocab_major else w)
        z = z if softcap is None else softcap * jnp.tanh(z / softcap)
        return jnp.where(mask > 0, token_logprobs(z, targets), 0.0)

    def fused(h, w):
        return fused_token_logprobs(h, w, targets, mask, vocab_major=vocab_major, chunk_len=chunk_len, softcap=softcap)

    assert_allclose(jax.jit(fused)(h, w), plain(h, w), atol=2e-6)
    got = jax.jit(jax.grad(lambda h, w: jnp.sum(fused(h, w) * ct), (0, 1)))(h, w)
    want = jax.grad(lambda h, w: jnp.sum(plain(h, w) * ct), (0, 1))(h, w)
    for g, r in zip(got, want):
        assert_allclose(g, r, atol=2e-6)


def test_fused_token_logprobs_of_a_zero_head_are_minus_log_vocab():
    """A zero head gives uniform next-token probabilities: log p = -log V = -log 4 at each masked position."""
    h = jnp.ones((1, 3, 2))
    logp = fused_token_logprobs(h, jnp.zeros((4, 2)), jnp.array([[0, 3, 1]]), jnp.array([[1, 0, 1]]), vocab_major=True)
    assert_allclose(logp, [[-jnp.log(4.0), 0.0, -jnp.log(4.0)]], rtol=1e-6)


def test_chunks_without_masked_positions_are_never_computed():
    """NaN hidden states at every unmasked position: a chunk computed from them would put NaN into the loss's or
    the log-probs' gradient (0 x NaN). With 4 masked positions in 2 rows and chunks of 2 positions a row (4
    compacted positions) only the first compacted chunk runs, so values and gradients stay finite and equal those
    of the masked positions alone."""
    h, w, targets, _, ct = _logprob_case(b=2, t=8)
    mask = jnp.zeros((2, 8), jnp.int32).at[0, 1].set(1).at[0, 6].set(1).at[1, 0].set(1).at[1, 5].set(1)
    poisoned = jnp.where(mask[..., None] > 0, h, jnp.nan)

    def logps(h, w):
        return jnp.sum(fused_token_logprobs(h, w, targets, mask, vocab_major=True, chunk_len=2) * ct)

    def loss(h, w):
        return fused_causal_lm_loss(h, w, targets, mask, vocab_major=True, chunk_len=2)[0]

    for f in (logps, loss):
        value, grads = jax.jit(jax.value_and_grad(f, (0, 1)))(poisoned, w)
        clean_value, clean_grads = jax.jit(jax.value_and_grad(f, (0, 1)))(h, w)
        assert_allclose(value, clean_value, rtol=1e-6)
        assert_allclose(grads[0], jnp.where(mask[..., None] > 0, clean_grads[0], 0.0), atol=1e-7)
        assert_allclose(grads[1], clean_grads[1], rtol=1e-5, atol=1e-7)


def test_a_frozen_head_costs_no_head_gradient_product():
    """Differentiated for the hidden states only (a LoRA run: the head is frozen), the compiled program has no
    product shaped like the head ([V, D] = [50, 16]): the backward pass is d log p / d h times the cotangent, and
    the recomputation for dL/dW is dropped. Differentiated for the head too, it is there."""
    h, w, targets, mask, ct = _logprob_case()

    def objective(h, w):
        return jnp.sum(fused_token_logprobs(h, w, targets, mask, vocab_major=True, chunk_len=4) * ct)

    def head_products(argnums):
        hlo = jax.jit(jax.grad(objective, argnums)).lower(h, w).compile().as_text()
        return re.findall(r"%(?:dot|ynn_fusion)[\w.]* = f32\[50,16\]", hlo)  # a product, plain or YNNPACK's

    assert not head_products(0)
    assert head_products((0, 1))
