"""Fixtures for generation tests: a tiny llama whose logits are peaked enough that float noise never flips an
argmax (the default 0.02 init leaves top-1/top-2 gaps of 1e-3), and the tiny chat tokenizer (vocab 400)."""

from __future__ import annotations

import jax
import pytest
from flax import nnx

from tests.kit.models import tiny_tempax_model
from tests.kit.tokenizers import tiny_chat_tokenizer


def peaked_tiny_model(family: str = "llama", seed: int = 0, **changes):
    """Tiny model (vocab 400) with matrices scaled by 5: logits std ~0.8, smallest top-1/top-2 gap ~0.02."""
    model = tiny_tempax_model(family, seed=seed, vocab_size=400, **changes)
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda x: x * 5.0 if x.ndim == 2 else x, params))
    return model


@pytest.fixture(scope="session")
def model():
    return peaked_tiny_model()


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_chat_tokenizer()
