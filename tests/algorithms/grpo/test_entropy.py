"""The entropy bonus of the GRPO loss and the duplicate-completion signal, against numbers worked out by hand."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tempax.algorithms.grpo.losses import entropy_bonus
from tempax.rl.rollout import duplicate_fraction

# Two completions: entropies [1, 2, (masked 9)] and [3, (masked 9), (masked 9)].
H = jnp.array([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
MASK = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def test_entropy_bonus_token_mean():
    """token_mean: (1 + 2 + 3) / 3 = 2, so the term is -0.1 * 2 = -0.2 (masked 9s ignored)."""
    term, metrics = entropy_bonus(H, MASK, coef=0.1, aggregation="token_mean")
    assert float(term) == pytest.approx(-0.2)
    assert float(metrics["entropy_bonus"]) == pytest.approx(-0.2)


def test_entropy_bonus_aggregates_like_the_loss():
    """seq_mean_token_mean: mean of per-sequence means (1.5, 3) = 2.25 -> -0.225; seq_mean_token_sum_norm with
    max_len 3: mean of (3 / 3, 3 / 3) = 1 -> -0.1; coef 0 -> 0."""
    assert float(entropy_bonus(H, MASK, coef=0.1, aggregation="seq_mean_token_mean")[0]) == pytest.approx(-0.225)
    assert float(entropy_bonus(H, MASK, coef=0.1, aggregation="seq_mean_token_sum_norm", max_len=3)[0]) == \
        pytest.approx(-0.1)
    assert float(entropy_bonus(H, MASK, coef=0.0)[0]) == 0.0


def test_entropy_bonus_gradient_raises_entropy():
    """d term / d H_t = -coef * m_t / 3 under token_mean: -0.1 / 3 = -0.0333 on the three real tokens and 0 on
    masked ones, so a gradient step on the loss (H -= lr * grad) increases every real token's entropy."""
    grad = jax.grad(lambda h: entropy_bonus(h, MASK, coef=0.1)[0])(H)
    expected = -0.1 / 3 * np.asarray(MASK)
    np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-6)


def test_duplicate_fraction_counts_repeats_within_each_group():
    """Group 0: [5 6], [5 6], [5 7] -> 1 repeat; group 1: [1 0], [1 0], [1 0] -> 2 repeats; 3 of 6 completions
    repeat an earlier one of their group = 0.5. The same completion in two groups is no repeat."""
    tokens = np.array([[[5, 6], [5, 6], [5, 7]], [[1, 0], [1, 0], [1, 0]]])
    assert duplicate_fraction(tokens) == 0.5
    assert duplicate_fraction(np.array([[[5, 6], [1, 2]], [[5, 6], [3, 4]]])) == 0.0


def test_the_grpo_loss_carries_the_bonus_with_its_gradient():
    """With token_mean aggregation the bonus is -coef x the logged token-mean entropy: loss(coef 0.1) -
    loss(coef 0) = -0.1 x entropy exactly as `entropy_bonus` says, the coefficient comes from the batch when it
    holds one (the guard's knob), and the bonus changes the gradient."""
    from flax import nnx

    from tempax.algorithms.grpo.config import GRPOKnobsConfig
    from tempax.algorithms.grpo.objective import make_grpo_loss
    from tests.kit.models import tiny_tempax_model

    model = tiny_tempax_model("llama", vocab_size=400, num_layers=2)
    rng = np.random.RandomState(0)
    batch = {
        "prompt_tokens": jnp.asarray(rng.randint(3, 400, (1, 4)), jnp.int32),
        "prompt_segments": jnp.ones((1, 4), jnp.int32),
        "completion_tokens": jnp.asarray(rng.randint(3, 400, (1, 2, 3)), jnp.int32),
        "completion_mask": jnp.ones((1, 2, 3), jnp.float32),
        "advantages": jnp.asarray([[1.0, -1.0]]),
    }
    settings = GRPOKnobsConfig(group_size=2, max_new_tokens=3, beta=0.0, loss_aggregation="token_mean")
    loss_fn = make_grpo_loss(settings, entropy_bonus=True)
    grad = nnx.jit(nnx.value_and_grad(loss_fn, has_aux=True))  # one program for both coefficients
    (l0, m0), g0 = grad(model, {**batch, "entropy_coef": jnp.asarray([0.0])})
    (l1, m1), g1 = grad(model, {**batch, "entropy_coef": jnp.asarray([0.1])})
    assert float(m1["entropy_bonus"]) == pytest.approx(-0.1 * float(m1["entropy"]), rel=1e-6)
    assert float(l1 - l0) == pytest.approx(float(m1["entropy_bonus"]), rel=1e-5)
    diff = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)))
    assert diff > 0
    assert not getattr(make_grpo_loss(settings), "has_entropy_bonus")
