"""Numerics on a TPU: each family's bf16 and float32 logits on the chip against a float32 CPU reference.

    bash scripts/tpu/run.sh python bench/tpu_numerics.py --record $OUT/tpu.jsonl
    python bench/tpu_numerics.py --families llama,qwen3      # anywhere: the "device" is then JAX's default backend

The TPU machine has no PyTorch, so the reference is tempax itself in float32 on XLA:CPU, computed in a child
process with `JAX_PLATFORMS=cpu` (tempax on CPU equals transformers within 1e-5 for every family:
tests/models/test_parity.py). The child builds each tiny family's random model, perturbs every weight (so norms
and biases matter), and saves the weights, its logits for four 64-token rows and 12 greedy tokens; the parent loads
the same weights on the default device and prints one JSON line per family:
  * bf16 weights and activations: max |logit - reference| and the fraction of positions whose top-1 token equals
    the reference's;
  * float32 at "highest" matmul precision: max |logit - reference|, and whether its 12 greedy tokens equal the
    reference's.
Exits non-zero when a float32 difference passes 1e-3 or greedy tokens differ. `--record FILE` appends one table
record (topic "tpu") for bench/results.py.

Where the reference's process has PyTorch and transformers (a development environment, not the TPU machine), it
also exports each perturbed model to Hugging Face files and runs transformers on them in bfloat16 on the CPU, and
each line adds transformers' own bf16 difference and top-1 agreement against the same float32 reference: the
baseline a bf16 figure is judged by (a family whose layers amplify bf16 rounding falls short in both libraries).

    python bench/tpu_numerics.py --families qwen3_5,qwen3_5_moe,qwen3    # on a CPU with the test extra
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

PROMPT_SHAPE = (4, 64)
NEW_TOKENS = 12


def _leaves(model):
    import jax
    from flax import nnx

    return jax.tree_util.tree_leaves(nnx.state(model))


def _with_leaves(model, arrays):
    """The model with its state's leaves replaced by arrays (cast to each leaf's own dtype), in leaf order."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree_util.tree_flatten(state)
    if len(leaves) != len(arrays):
        raise SystemExit(f"tpu_numerics: the saved model has {len(arrays)} arrays, this one {len(leaves)}")
    new = [jnp.asarray(a, dtype=leaf.dtype) for a, leaf in zip(arrays, leaves)]
    return nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, new))


def _logits_and_greedy(model, ids, prompts):
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from tempax.generate import SamplingConfig, generate

    logits = np.asarray(nnx.jit(lambda m, x: m(x)[0])(model, jnp.asarray(ids)), np.float32)
    if prompts is None:
        return logits, None
    out = generate(model, None, prompts, SamplingConfig(max_new_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True))
    return logits, np.asarray(out.token_ids)


def _inputs(vocab: int):
    from tests.kit.models import random_ids

    ids = random_ids(PROMPT_SHAPE, vocab=min(vocab, 128), seed=5)
    prompts = [row.tolist() for row in random_ids((2, 7), vocab=min(vocab, 100) - 3, seed=9) + 3]
    return ids, prompts


def _transformers_bf16_logits(model, ids):
    """transformers' logits of `model`'s weights (exported to Hugging Face files) in bfloat16 on the CPU, or None
    where PyTorch or transformers is not installed."""
    try:
        import torch
        import transformers
    except ImportError:
        return None
    import numpy as np

    from tempax.models.hf_io import save_hf_checkpoint

    with tempfile.TemporaryDirectory() as out:
        save_hf_checkpoint(model, out)
        hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).eval()
        with torch.no_grad():
            return hf(torch.tensor(np.asarray(ids), dtype=torch.long)).logits.float().numpy()


def reference(families: list[str], folder: str) -> None:
    """The child: float32 on CPU, weights and outputs saved to folder/<family>.npz."""
    import jax
    import numpy as np

    from tests.kit.models import tiny_config, tiny_tempax_model

    for family in families:
        model = tiny_tempax_model(family, seed=0)
        rng = np.random.RandomState(0)
        arrays = [np.asarray(a) for a in _leaves(model)]
        arrays = [a + (rng.standard_normal(a.shape) * 0.05).astype(a.dtype) if np.issubdtype(a.dtype, np.floating)
                  else a for a in arrays]
        model = _with_leaves(model, arrays)
        ids, prompts = _inputs(tiny_config(family).vocab_size)
        with jax.default_matmul_precision("highest"):
            logits, greedy = _logits_and_greedy(model, ids, prompts)
        extra = {}
        transformers_logits = _transformers_bf16_logits(model, ids)
        if transformers_logits is not None:
            extra["transformers_bf16"] = transformers_logits
        np.savez(os.path.join(folder, f"{family}.npz"), logits=logits, greedy=greedy, **extra,
                 **{f"w{i}": a for i, a in enumerate(arrays)})
        print(f"reference {family}", flush=True)


def check(family: str, folder: str) -> dict:
    import jax
    import numpy as np

    from tests.kit.models import tiny_config, tiny_tempax_model

    saved = np.load(os.path.join(folder, f"{family}.npz"))
    arrays = [saved[f"w{i}"] for i in range(len([k for k in saved.files if k.startswith("w")]))]
    ids, prompts = _inputs(tiny_config(family).vocab_size)
    ref, ref_greedy = saved["logits"], saved["greedy"]
    bf16 = _with_leaves(tiny_tempax_model(family, param_dtype="bfloat16", dtype="bfloat16"), arrays)
    bf16_logits, _ = _logits_and_greedy(bf16, ids, None)
    with jax.default_matmul_precision("highest"):
        f32 = _with_leaves(tiny_tempax_model(family), arrays)
        f32_logits, greedy = _logits_and_greedy(f32, ids, prompts)
    row = {
        "family": family,
        "device": getattr(jax.devices()[0], "device_kind", str(jax.devices()[0])),
        "logit_abs_max": round(float(np.abs(ref).max()), 3),
        "bf16_vs_f32_reference": round(float(np.abs(bf16_logits - ref).max()), 4),
        "bf16_top1_agreement": float((bf16_logits.argmax(-1) == ref.argmax(-1)).mean()),
        "f32_highest_vs_f32_reference": float(np.abs(f32_logits - ref).max()),
        "greedy_tokens_equal": bool((greedy == ref_greedy).all()),
    }
    if "transformers_bf16" in saved.files:
        theirs = saved["transformers_bf16"]
        row["transformers_bf16_vs_f32_reference"] = round(float(np.abs(theirs - ref).max()), 4)
        row["transformers_bf16_top1_agreement"] = float((theirs.argmax(-1) == ref.argmax(-1)).mean())
    return row


def numerics_record(rows: list[dict], jax_version: str) -> dict:
    """The table record (topic tpu) of the lines `check` gave; transformers' columns where the lines have them."""
    device = rows[0]["device"] if rows else "?"
    theirs = bool(rows) and all("transformers_bf16_top1_agreement" in r for r in rows)
    where = "on the chip" if "TPU" in device.upper() else "on a CPU" if device == "cpu" else f"on {device}"
    columns = ["family", "bf16 top-1 agreement", "bf16 max |diff| (logits up to)", "float32 highest max |diff|",
               "12 greedy tokens equal"]
    if theirs:
        columns += ["transformers bf16 top-1 agreement", "transformers bf16 max |diff|"]
    table = []
    for r in rows:
        row = [r["family"], f"{r['bf16_top1_agreement']:.1%}",
               f"{r['bf16_vs_f32_reference']:.3g} ({r['logit_abs_max']:.3g})",
               f"{r['f32_highest_vs_f32_reference']:.2g}", "yes" if r["greedy_tokens_equal"] else "NO"]
        if theirs:
            row += [f"{r['transformers_bf16_top1_agreement']:.1%}", f"{r['transformers_bf16_vs_f32_reference']:.3g}"]
        table.append(row)
    title = (f"Numerics {where}: each tiny family's random perturbed weights, logits of 4 x 64 tokens against "
             "tempax float32 on XLA:CPU (itself within 1e-5 of transformers)")
    if theirs:
        title += "; transformers in bfloat16 on the CPU beside it, the same weights"
    if where != "on the chip" and device == "cpu":
        from tempax.runtime.host import cpu_line

        device = cpu_line()
    return {"kind": "table", "topic": "tpu", "title": title, "columns": columns, "rows": table, "cpu": device,
            "jax": jax_version, "command": "bash scripts/tpu/run.sh python bench/tpu_numerics.py" if where ==
            "on the chip" else "python bench/tpu_numerics.py --record FILE"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default=None, help="comma-separated (default: every tiny family, MoE included)")
    ap.add_argument("--record", metavar="FILE", help="append a table record (topic tpu)")
    ap.add_argument("--reference", metavar="DIR", help=argparse.SUPPRESS)  # the child's mode
    args = ap.parse_args()
    from tests.kit.models import TINY_FAMILIES, TINY_MOE_FAMILIES

    families = args.families.split(",") if args.families else list(TINY_FAMILIES) + list(TINY_MOE_FAMILIES)
    if args.reference:
        reference(families, args.reference)
        return 0
    import jax

    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        child = subprocess.run([sys.executable, os.path.abspath(__file__), "--families", ",".join(families),
                                "--reference", folder], env=env, cwd=ROOT)
        if child.returncode != 0:
            print("tpu_numerics: the CPU reference failed (above)", file=sys.stderr)
            return 2
        rows, ok = [], True
        for family in families:
            row = check(family, folder)
            ok &= row["f32_highest_vs_f32_reference"] < 1e-3 and row["greedy_tokens_equal"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.record:
        with open(args.record, "a") as f:
            f.write(json.dumps(numerics_record(rows, jax.__version__)) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
