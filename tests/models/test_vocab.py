"""tempax.models.vocab: new vocabulary rows start at the mean of the old ones (Hewitt 2021), the old rows kept."""

from __future__ import annotations

import numpy as np
import pytest

from tempax.errors import ConfigError
from tempax.models.vocab import mean_init_rows, resize_vocab
from tests.kit.models import tiny_tempax_model


def test_new_rows_are_the_mean_of_the_old_ones():
    """Rows [1, 2], [3, 6], [5, 1]: mean [3, 3]; two new rows, both [3, 3]; the dtype kept."""
    table = np.array([[1, 2], [3, 6], [5, 1]], np.float32)
    grown = mean_init_rows(table, 2)
    assert grown.dtype == np.float32 and grown.shape == (5, 2)
    np.testing.assert_array_equal(grown, [[1, 2], [3, 6], [5, 1], [3, 3], [3, 3]])
    np.testing.assert_array_equal(mean_init_rows(table, 0), table)


@pytest.mark.parametrize("tied", [True, False])
def test_a_grown_model_keeps_its_rows_and_adds_mean_rows(tied):
    """The embedding gains rows (an untied head, columns) at the old mean; the old ones are untouched, and the
    model passed in keeps its size. (The expected mean is taken in float32 here: it differs from the module's
    float64 mean in the last bits, hence the tolerance.)"""
    model = tiny_tempax_model("llama", tie_word_embeddings=tied)
    vocab = model.config.vocab_size
    grown = resize_vocab(model, vocab + 3)
    assert grown.config.vocab_size == vocab + 3 and model.config.vocab_size == vocab
    old = np.asarray(model.embed_tokens.embedding[...])
    new = np.asarray(grown.embed_tokens.embedding[...])
    np.testing.assert_array_equal(new[:vocab], old)
    np.testing.assert_allclose(new[vocab:], np.broadcast_to(old.mean(axis=0), (3, old.shape[1])), rtol=1e-5, atol=1e-8)
    if not tied:
        head, grown_head = np.asarray(model.lm_head.kernel[...]), np.asarray(grown.lm_head.kernel[...])
        np.testing.assert_array_equal(grown_head[:, :vocab], head)
        np.testing.assert_allclose(grown_head[:, vocab:], np.broadcast_to(head.mean(axis=1)[:, None],
                                                                          (head.shape[0], 3)), rtol=1e-5, atol=1e-8)


def test_shrinking_is_refused():
    model = tiny_tempax_model("llama")
    with pytest.raises(ConfigError, match="smaller than the model's .*only growing is supported"):
        resize_vocab(model, model.config.vocab_size - 1)
