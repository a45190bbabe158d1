"""`python tests/e2e/load_back.py PATH`: loads an exported model through `tempax.load`, as a user would, and
prints one JSON line: its layer count, vocabulary size, whether the next-token logits of a fixed prompt are all
finite, and the greedy next token (the test compares it with the source model's)."""

from __future__ import annotations

import json
import sys

PROMPT = "The capital of France is"


def main(path: str) -> None:
    import jax.numpy as jnp
    import numpy as np

    import tempax

    model, tokenizer = tempax.load(path)
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    logits, _ = model(jnp.asarray([ids], jnp.int32))
    last = np.asarray(logits[0, -1], np.float32)
    print(json.dumps({"layers": model.config.num_layers, "vocab": int(last.shape[-1]),
                      "finite": bool(np.isfinite(last).all()), "next": tokenizer.decode([int(last.argmax())])}))


if __name__ == "__main__":
    main(sys.argv[1])
