"""Staleness and truncated importance weights (`tempax.rl.staleness`), against numbers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tempax.rl.staleness import staleness, truncated_importance_weights


def test_truncated_importance_weights_by_hand():
    """Tokens with pi_prox / mu = 0.5 / 0.25 = 2, 0.2 / 0.4 = 0.5, and a masked one (0.9 / 0.1 = 9):
    cap 1.5 -> [1.5, 0.5, 1] (2 is truncated, the masked token weighs 1); cap 3 -> [2, 0.5, 1]."""
    prox = np.log(np.array([[0.5, 0.2, 0.9]], np.float32))
    mu = np.log(np.array([[0.25, 0.4, 0.1]], np.float32))
    mask = np.array([[1, 1, 0]], np.float32)
    np.testing.assert_allclose(truncated_importance_weights(prox, mu, mask, cap=1.5), [[1.5, 0.5, 1.0]], rtol=1e-6)
    np.testing.assert_allclose(truncated_importance_weights(prox, mu, mask, cap=3.0), [[2.0, 0.5, 1.0]], rtol=1e-6)


def test_a_huge_ratio_is_truncated_without_overflow():
    """log ratio 1000 (exp overflows float32) with cap 2: exp(min(1000, log 2)) = 2 exactly."""
    w = truncated_importance_weights(np.array([[0.0]]), np.array([[-1000.0]]), np.ones((1, 1)), cap=2.0)
    assert float(w[0, 0]) == pytest.approx(2.0) and math.isfinite(float(w[0, 0]))


def test_staleness_counts_versions_and_refuses_a_future_version():
    """Sampled with version 3, trained at version 5: 2 versions behind; a rollout from version 6 is impossible."""
    assert staleness(5, 3) == 2 and staleness(4, 4) == 0
    with pytest.raises(ValueError, match="newer than the trainer"):
        staleness(5, 6)
