"""tests/kit/mappings.py: JAX's compiled programs are dropped past the given share of the mapping limit, and only
then."""

import jax
import jax.numpy as jnp
import pytest

from tests.kit.mappings import map_limit, mapped_regions, release_if_crowded


def test_the_caches_are_dropped_past_the_share_and_kept_below_it():
    if map_limit() is None or mapped_regions() is None:
        pytest.skip("no /proc to read the mappings from")
    add = jax.jit(lambda x: x + 1)
    add(jnp.ones(3))
    assert add._cache_size() == 1
    assert not release_if_crowded(map_limit(), 1.0) and add._cache_size() == 1
    regions = mapped_regions()
    assert release_if_crowded(map_limit(), 0.0) and add._cache_size() == 0
    assert mapped_regions() < regions  # the executable's mappings went with it
