"""What each GGUF storage type costs: file size, export time and how far the read-back logits move.

    python bench/gguf_export.py                 # SmolLM2-135M-Instruct, every --quant type, one table row each
    python bench/gguf_export.py --tiny          # the tiny model of every family instead (the test tolerances)

SmolLM2 is loaded from its shipped Q4_1 file (dequantised to float32), exported with `tempax export` in each type,
and read back by tempax. Printed per type: the file's MiB, the export's wall seconds, max |logit difference| /
max |logit| against the float32 model on one chat prompt, and whether the greedy next token is the same. The tiny
mode prints the same error for each family (tests/models/test_gguf_export.py bounds it per type).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

PROMPT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def smollm2_table(folder: str) -> list[str]:
    import jax.numpy as jnp

    from tempax.export.exporter import export
    from tempax.models.gguf_export import GGUF_QUANTS
    from tempax.models.registry import load

    model, tok = load("smollm2-135m-instruct")
    ids = jnp.asarray([tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)])
    want = np.asarray(model(ids)[0])
    rows = ["| --quant | file MiB | export s | max abs logit error / max abs logit | same next token |",
            "|---|---|---|---|---|"]
    for quant in GGUF_QUANTS:
        path = os.path.join(folder, f"smollm2.{quant}.gguf")
        start = time.perf_counter()
        export("smollm2-135m-instruct", path, quant=quant)
        seconds = time.perf_counter() - start
        back, _ = load(path)
        got = np.asarray(back(ids)[0])
        same = bool(got[0, -1].argmax() == want[0, -1].argmax())
        rows.append(f"| {quant} | {os.path.getsize(path) / 2**20:.1f} | {seconds:.1f} | "
                    f"{_relative_error(got, want):.2e} | {'yes' if same else 'no'} |")
    return rows


def tiny_table(folder: str) -> list[str]:
    import jax.numpy as jnp

    from tempax.models.gguf_export import GGUF_QUANTS, save_gguf
    from tempax.models.gguf_io import load_gguf
    from tests.kit.models import TINY_FAMILIES, random_ids
    from tests.models.test_gguf_export import exportable_model

    rows = ["| family | " + " | ".join(GGUF_QUANTS) + " |", "|---" * (len(GGUF_QUANTS) + 1) + "|"]
    ids = jnp.asarray(random_ids((2, 12), 128))
    for family in TINY_FAMILIES:
        model = exportable_model(family)
        want = np.asarray(model(ids)[0])
        errors = []
        for quant in GGUF_QUANTS:
            back = load_gguf(save_gguf(model, os.path.join(folder, f"{family}.{quant}.gguf"), quant=quant))
            errors.append(f"{_relative_error(np.asarray(back(ids)[0]), want):.1e}")
        rows.append(f"| {family} | " + " | ".join(errors) + " |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny model of every family instead of SmolLM2")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        print("\n".join(tiny_table(folder) if args.tiny else smollm2_table(folder)))


if __name__ == "__main__":
    main()
