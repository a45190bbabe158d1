"""Same-machine reference figures from Tunix, the JAX peer: the shared `decode` workload run by Tunix's Sampler.

    bash scripts/setup.sh --tunix                      # .venv-tunix: google-tunix, pinned (once)
    .venv-tunix/bin/python bench/peers_tunix.py --one decode small
    .venv-tunix/bin/python bench/peers_tunix.py --one decode small --tempax-xla-flags

`bench/compare.py` runs this file with Tunix's Python beside tempax's and transformers' measurements and prints
the ratio to each. Tunix cannot share tempax's environment: google-tunix 0.1.7 requires safetensors < 0.8 and
tempax >= 0.8, so it has its own (`TUNIX_PYTHON` below).

decode, exactly the shared work (../shared/bench/workloads.json), as `bench/decode.py` and `bench/peers.py` run it:
- the model: `tunix.models.llama3.model.Llama3` with the workload's shape (weight tying on, float32), built with
  Tunix's own initialisers from `nnx.Rngs(0)`;
- the sampler: `tunix.generate.sampler.Sampler` with a KV cache of prompt_len + max_new_tokens positions, greedy
  (temperature 0), `max_prompt_length` = prompt_len (no padding), and an EOS id no token can equal (-1), so every
  row decodes exactly max_new_tokens tokens (the count is checked);
- the prompts: bench/decode.py's ids, handed over as the text of the workload's word-level tokenizer ("w17 w4032
  ..."), which Tunix encodes back to exactly those ids with BOS first (checked before timing);
- one timed call is one whole `Sampler(...)` call, text in and text out (tempax's timed call also goes from ids
  to texts); the first is the warm-up (compilation), generated tokens/s = batch * max_new_tokens / median.

XLA flags: the environment's, as a Tunix user runs it (JAX's defaults when XLA_FLAGS is unset). `--tempax-xla-flags`
applies the flags tempax sets for itself on this CPU (`tempax.runtime.process.tuned_env`), to tell a difference of
flags from a difference of programs. Peak RSS is the process's ru_maxrss, as the other benches measure it.

Prints one JSON object; it names the CPU (`settings_in_effect`) and the versions of Tunix, JAX and Flax.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:  # this checkout's bench and tempax.runtime (standard library only), when run as a script
    sys.path.insert(0, ROOT)

from bench.decode import workload_prompts  # noqa: E402  (standard library only, as bench.peers)
from bench.peers import SHARED, load_spec  # noqa: E402
# Tunix's own environment, made by `scripts/setup.sh --tunix`; TEMPAX_TUNIX_PYTHON names another interpreter.
TUNIX_VENV = os.path.join(ROOT, ".venv-tunix")
TUNIX_SETUP = "bash scripts/setup.sh --tunix"


def tunix_python() -> str | None:
    """The Python that has Tunix installed: $TEMPAX_TUNIX_PYTHON, else .venv-tunix's, else None (not set up)."""
    named = os.environ.get("TEMPAX_TUNIX_PYTHON")
    if named:
        return named
    python = os.path.join(TUNIX_VENV, "bin", "python")
    return python if os.path.exists(python) else None


def prompt_texts(prompt_ids: list[list[int]]) -> list[str]:
    """The workload's prompts (`bench.decode.workload_prompts`: BOS + word ids) as the word-level tokenizer's text,
    "w17 w4032 ...", which Tunix's `Sampler` takes and encodes back to the same ids, BOS first."""
    return [" ".join(f"w{i}" for i in ids[1:]) for ids in prompt_ids]


def measure_decode(size: str) -> dict:
    import flax
    import jax
    import transformers
    from flax import nnx
    from tunix.generate import sampler as tunix_sampler
    from tunix.models.llama3 import model as tunix_llama3

    from tempax.runtime.process import settings_in_effect

    load_before = os.getloadavg()[0]
    spec = load_spec()
    shape, w = spec["models"][size], spec["workloads"]["decode"]
    runs = w["runs"][size]
    batch, prompt_len, new = w["batch_size"], w["prompt_len"], w["max_new_tokens"]
    config = tunix_llama3.ModelConfig(
        num_layers=shape["num_layers"], vocab_size=shape["vocab_size"], embed_dim=shape["hidden_size"],
        hidden_dim=shape["intermediate_size"], num_heads=shape["num_heads"], head_dim=shape["head_dim"],
        num_kv_heads=shape["num_kv_heads"], rope_theta=int(shape["rope_theta"]), norm_eps=shape["rms_norm_eps"],
        weight_tying=True)
    model = tunix_llama3.Llama3(config, rngs=nnx.Rngs(spec["init"]["seed"]))
    params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert params == shape["expected_num_params"], f"{params} parameters, workloads.json says " \
                                                   f"{shape['expected_num_params']}"
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        os.path.join(SHARED, "tokenizers", f"wordlevel_{shape['vocab_size']}"))
    cache = tunix_sampler.CacheConfig(cache_size=prompt_len + new, num_layers=shape["num_layers"],
                                      num_kv_heads=shape["num_kv_heads"], head_dim=shape["head_dim"])
    sampler = tunix_sampler.Sampler(model, tokenizer, cache)
    ids = workload_prompts(spec, shape["vocab_size"])
    texts = prompt_texts(ids)
    encoded = [list(map(int, sampler.tokenize(t))) for t in texts]
    assert encoded == ids, "the word-level texts do not encode back to the workload's prompt ids"

    times = []
    for i in range(runs["warmup"] + runs["measured"]):
        start = time.perf_counter()
        out = sampler(texts, max_generation_steps=new, max_prompt_length=prompt_len, eos_tokens=[-1],
                      temperature=0.0)
        elapsed = time.perf_counter() - start
        assert [len(t) for t in out.tokens] == [new] * batch, "a row did not decode max_new_tokens tokens"
        if i >= runs["warmup"]:
            times.append(elapsed)
    median = statistics.median(times)
    from importlib.metadata import version

    return {"workload": "decode", "size": size, "dtype": "float32",
            "generated_tokens_per_s": round(batch * new / median, 1), "call_s": [round(t, 4) for t in times],
            "library": f"Tunix {version('google-tunix')} (JAX {jax.__version__}, Flax {flax.__version__})",
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
            "load_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            **settings_in_effect()}


MEASURE = {"decode": measure_decode}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "SIZE"), required=True,
                        help="measure once in this process: decode tiny|small")
    parser.add_argument("--tempax-xla-flags", action="store_true",
                        help="run under the XLA flags tempax sets for itself on this CPU")
    args = parser.parse_args()
    workload, size = args.one
    if workload not in MEASURE:
        parser.error(f"--one: Tunix is measured on {', '.join(MEASURE)} only, not {workload!r}")
    if size not in ("tiny", "small"):
        parser.error(f"--one: unknown size {size!r}; choose tiny or small")
    if args.tempax_xla_flags:
        from tempax.runtime.process import tuned_env

        os.environ["XLA_FLAGS"] = tuned_env(dict(os.environ)).get("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    try:
        import tunix  # noqa: F401
    except ImportError:
        raise SystemExit(f"Tunix is not installed in {sys.executable}: run `{TUNIX_SETUP}` and use "
                         f"{os.path.join(TUNIX_VENV, 'bin', 'python')}")
    print(json.dumps(MEASURE[workload](size)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
