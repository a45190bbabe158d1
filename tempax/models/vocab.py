"""Growing a model's vocabulary: new embedding (and untied LM head) rows for tokens added to its tokenizer.

New rows start at the mean of the existing rows (Hewitt 2021, "Initializing New Word Embeddings for Pretrained
Language Models"): a random row can get a large logit and swamp the softmax, while the mean row gives every new
token about the average log-probability, so the loss on old text barely moves and training can pull the new
rows apart. The returned model is a new object; the one passed in is left unchanged.
"""

from __future__ import annotations

import numpy as np
from flax import nnx

from tempax.errors import ConfigError
from tempax.models.decoder import Decoder
from tempax.models.weights import abstract_model


def mean_init_rows(table_vd: np.ndarray, new_rows: int) -> np.ndarray:
    """`table_vd` [V, D] with `new_rows` rows appended, each the mean of the V existing rows: [V + new_rows, D]."""
    mean_d = table_vd.astype(np.float64).mean(axis=0).astype(table_vd.dtype)
    return np.concatenate([table_vd, np.broadcast_to(mean_d, (new_rows, table_vd.shape[1]))], axis=0)


def resize_vocab(model: Decoder, vocab_size: int) -> Decoder:
    """A copy of `model` with `vocab_size` embedding rows (and LM-head columns when untied), mean-initialised.

    Raises:
      ConfigError: `vocab_size` is smaller than the model's (shrinking would drop trained rows).
    """
    cfg = model.config
    extra = vocab_size - cfg.vocab_size
    if extra < 0:
        raise ConfigError(f"vocab_size {vocab_size} is smaller than the model's {cfg.vocab_size}; only growing is "
                          "supported (shrinking would drop trained embedding rows)")
    graphdef, state = nnx.split(abstract_model(cfg.replace(vocab_size=vocab_size)))
    old = nnx.state(model, nnx.Param)
    flat = dict(nnx.to_flat_state(old))
    for path, var in flat.items():
        value = np.asarray(var[...])
        if path == ("embed_tokens", "embedding"):
            value = mean_init_rows(value, extra)
        elif path == ("lm_head", "kernel"):  # [D, V]: new columns
            value = mean_init_rows(value.T, extra).T
        flat[path] = var.replace(value=value)
    new_state = nnx.from_flat_state(flat)
    return nnx.merge(graphdef, new_state)
