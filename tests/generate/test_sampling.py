"""Hand-computed checks of the sampling functions (no model)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from numpy.testing import assert_allclose, assert_array_equal

from tempax.generate.sampling import (
    SamplerSpec,
    filtered_probs,
    inverse_cdf_sample,
    row_keys,
    row_uniforms,
    sample_from_logits,
)

LN = math.log


def _pick(weights, us):
    w = jnp.asarray([weights] * len(us), jnp.float32)
    return np.asarray(inverse_cdf_sample(w, jnp.asarray(us, jnp.float32))).tolist()


def test_inverse_cdf_small_vocab():
    """Weights [1, 2, 1, 0], total 4, cumulative [1, 3, 4, 4]; target = 4u.
    u=0.25 -> 1 -> index 0; u=0.26 -> 1.04 -> 1; u=0.75 -> 3 -> 1; u=0.76 -> 3.04 -> 2;
    u=1 -> 4 -> 2 (index 3 has zero weight and is never chosen)."""
    assert _pick([1, 2, 1, 0], [0.25, 0.26, 0.75, 0.76, 1.0]) == [0, 1, 1, 2, 2]


def test_inverse_cdf_blocked_large_vocab():
    """V = 1000 uses the two-level path. Weight 3 at index 5 and 1 at index 700, total 4:
    u=0.5 -> 2 -> index 5; u=0.75 -> 3 -> 5; u=0.8 -> 3.2 -> 700; u=1 -> 4 -> 700."""
    w = [0.0] * 1000
    w[5], w[700] = 3.0, 1.0
    assert _pick(w, [0.5, 0.75, 0.8, 1.0]) == [5, 5, 700, 700]


def test_inverse_cdf_frequencies_follow_probabilities():
    """Probabilities [0.5, 0.25, 0.25] and the 8 evenly spread uniforms u = (i + 0.5) / 8: u <= 0.5 for
    i = 0..3 (index 0), 0.5 < u <= 0.75 for i = 4, 5 (index 1), the rest index 2: counts 4, 2, 2."""
    us = [(i + 0.5) / 8 for i in range(8)]
    assert _pick([0.5, 0.25, 0.25], us) == [0, 0, 0, 0, 1, 1, 2, 2]


def _filter(logits, **kw):
    kw = {"top_k": 0, "use_top_p": False, "use_min_p": False, "top_p": 1.0, "min_p": 0.0, **kw}
    w, ids = filtered_probs(jnp.asarray([logits], jnp.float32), **kw)
    return np.asarray(w)[0], None if ids is None else np.asarray(ids)[0]


# Probabilities 0.1, 0.4, 0.2, 0.3 (log-probabilities are valid logits).
LOGITS = [LN(0.1), LN(0.4), LN(0.2), LN(0.3)]


def test_top_k():
    """k = 2 keeps tokens 1 (0.4) and 3 (0.3), renormalised: 0.4/0.7 = 4/7 and 3/7."""
    w, ids = _filter(LOGITS, top_k=2)
    assert_array_equal(ids, [1, 3])
    assert_allclose(w, [4 / 7, 3 / 7], rtol=1e-6)


def test_top_p():
    """Sorted 0.4, 0.3, 0.2, 0.1; mass before each: 0, 0.4, 0.7, 0.9. top_p = 0.65 keeps those with mass before
    < 0.65: the first two (0.4 + 0.3 = 0.7 >= 0.65). top_p = 0.75 keeps three. A tiny top_p keeps the top one."""
    w, ids = _filter(LOGITS, use_top_p=True, top_p=0.65)
    assert_array_equal(ids[:2], [1, 3])
    assert_allclose(w, [0.4, 0.3, 0.0, 0.0], rtol=1e-6)
    w, _ = _filter(LOGITS, use_top_p=True, top_p=0.75)
    assert_allclose(w, [0.4, 0.3, 0.2, 0.0], rtol=1e-6)
    w, _ = _filter(LOGITS, use_top_p=True, top_p=1e-3)
    assert_allclose(w, [0.4, 0.0, 0.0, 0.0], rtol=1e-6)


def test_top_p_after_top_k():
    """top-k 3 renormalises 0.4, 0.3, 0.2 to 4/9, 3/9, 2/9; top_p 0.7 keeps the first two (mass before the third
    is 7/9 = 0.78 >= 0.7)."""
    w, ids = _filter(LOGITS, top_k=3, use_top_p=True, top_p=0.7)
    assert_array_equal(ids, [1, 3, 2])
    assert_allclose(w, [4 / 9, 3 / 9, 0.0], rtol=1e-6)


def test_min_p():
    """min_p 0.6: threshold 0.6 * 0.4 = 0.24 keeps 0.4 and 0.3 in vocabulary order (no sort)."""
    w, ids = _filter(LOGITS, use_min_p=True, min_p=0.6)
    assert ids is None
    assert_allclose(w, [0.0, 0.4, 0.0, 0.3], rtol=1e-6)


def test_greedy_and_logprobs():
    """Greedy picks token 1 (p = 0.4): log p = ln 0.4 at any temperature."""
    logits = jnp.asarray([LOGITS], jnp.float32)
    tok, lp, raw = sample_from_logits(logits, jnp.ones(1), SamplerSpec(greedy=True), temperature=1.0)
    assert tok.tolist() == [1]
    assert_allclose([lp[0], raw[0]], [LN(0.4), LN(0.4)], rtol=1e-6)


def test_temperature_logprob():
    """Logits [0, 0, 2 ln 2] at tau = 2 become [0, 0, ln 2]: p = [1/4, 1/4, 1/2]. u = 1 picks the last token,
    log p_tau = -ln 2 and log p_1 = 2 ln 2 - ln(1 + 1 + 4) = ln(4/6)."""
    logits = jnp.asarray([[0.0, 0.0, 2 * LN(2)]])
    tok, lp, raw = sample_from_logits(logits, jnp.ones(1), SamplerSpec(), temperature=2.0)
    assert tok.tolist() == [2]
    assert_allclose([lp[0], raw[0]], [-LN(2), LN(4 / 6)], rtol=1e-6)
    # u = 0.2: target 0.2 <= 1/4, token 0 with log p_tau = -ln 4.
    tok, lp, _ = sample_from_logits(logits, jnp.full(1, 0.2), SamplerSpec(), temperature=2.0)
    assert tok.tolist() == [0]
    assert_allclose(lp[0], -LN(4), rtol=1e-6)


def test_top_k_one_is_greedy():
    logits = jnp.asarray([LOGITS, LOGITS[::-1]], jnp.float32)
    tok, _, _ = sample_from_logits(logits, jnp.asarray([0.9, 0.1]), SamplerSpec(top_k=1), temperature=1.0)
    assert tok.tolist() == [1, 2]


def test_row_streams_do_not_depend_on_the_batch():
    """Row (prompt 3, sample 1) draws the same uniforms alone as inside a batch of other rows."""
    batch = row_keys(7, jnp.asarray([0, 3, 3]), jnp.asarray([0, 0, 1]))
    alone = row_keys(7, jnp.asarray([3]), jnp.asarray([1]))
    for step in (0, 5):
        u_batch = np.asarray(row_uniforms(batch, jnp.int32(step)))
        u_alone = np.asarray(row_uniforms(alone, jnp.int32(step)))
        assert u_batch[2] == u_alone[0]
        assert len(set(u_batch.tolist())) == 3 and np.all((u_batch > 0) & (u_batch <= 1))
    assert jax.random.key_data(batch).shape[0] == 3


def test_sampled_frequencies_match_probabilities():
    """4000 rows with their own random streams sample from p = [0.4, 0.3, 0.15, 0.1, 0.05]; each frequency is
    within 0.03 of p (the standard deviation of a frequency is at most sqrt(0.25 / 4000) = 0.008: 3.8 sigma)."""
    p = np.asarray([0.4, 0.3, 0.15, 0.1, 0.05])
    rows = 4000
    keys = row_keys(11, jnp.arange(rows), jnp.zeros(rows, jnp.int32))
    u = row_uniforms(keys, jnp.int32(0))
    logits = jnp.broadcast_to(jnp.log(jnp.asarray(p, jnp.float32)), (rows, 5))
    tok, _, _ = sample_from_logits(logits, u, SamplerSpec(), temperature=1.0)
    freq = np.bincount(np.asarray(tok), minlength=5) / rows
    assert np.abs(freq - p).max() < 0.03, freq
