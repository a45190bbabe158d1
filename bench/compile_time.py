"""How long the training step takes to compile, by depth: the decoder's layer scan keeps it flat.

    python bench/compile_time.py                          # layers 4 and 16, width 256, LoRA and full
    python bench/compile_time.py --layers 2,8,32 --hidden 512 --repeats 3

For each depth it builds a random model of the same width (a Llama-shaped config), LoRA rank 16 on every
projection or full fine-tuning, and compiles one training step (loss, gradient, an AdamW update) with JAX's
persistent cache off and its in-memory caches cleared, so every figure is a cold compile. It prints one JSON line
per (mode, depth) with the median of `--repeats` compiles (lower + compile, seconds) and, per mode, the ratio of
the deepest to the shallowest. Run it against another checkout (PYTHONPATH=that checkout) to compare versions on
one machine; the CPU is named in each line, as a CPU figure holds only beside its peers of the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TEMPAX_COMPILE_CACHE", "0")
os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)


def compile_seconds(layers: int, hidden: int, seq_len: int, mode: str) -> float:
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from tempax.models.config import ModelConfig
    from tempax.models.decoder import Decoder
    from tempax.models.lora import LoraConfig, apply_lora

    cfg = ModelConfig(vocab_size=8192, hidden_size=hidden, num_layers=layers, num_heads=hidden // 64,
                      num_kv_heads=max(1, hidden // 256), head_dim=64, intermediate_size=4 * hidden, remat="full")
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    if mode == "lora":
        model = apply_lora(model, LoraConfig(rank=16), rngs=nnx.Rngs(1))
    trainable = nnx.LoRAParam if mode == "lora" else nnx.Param
    graphdef, params, rest = nnx.split(model, trainable, ...)
    optimizer = optax.adamw(1e-4)
    opt_state = optimizer.init(params)
    tokens = jnp.zeros((4, seq_len), jnp.int32)

    def step(params, opt_state, rest, tokens):
        def loss(params):
            logits, _ = nnx.merge(graphdef, params, rest)(tokens)
            logp = jax.nn.log_softmax(logits[:, :-1])
            return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    jax.clear_caches()
    start = time.perf_counter()
    jax.jit(step, donate_argnums=(0, 1)).lower(params, opt_state, rest, tokens).compile()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="4,16", help="comma-separated depths")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--modes", default="lora,full")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--record", metavar="FILE", help="append the ratio as a figure record (bench/results.py)")
    args = ap.parse_args()
    import jax

    from tempax.runtime.host import cpu_info

    cpu = str(cpu_info()["model"])
    depths = [int(x) for x in args.layers.split(",")]
    for mode in args.modes.split(","):
        medians = {}
        for layers in depths:
            times = [compile_seconds(layers, args.hidden, args.seq_len, mode) for _ in range(args.repeats)]
            medians[layers] = statistics.median(times)
            print(json.dumps({"mode": mode, "layers": layers, "hidden": args.hidden, "compile_s": round(medians[layers], 3),
                              "all_s": [round(t, 3) for t in times], "backend": jax.default_backend(),
                              "device": jax.devices()[0].device_kind, "cpu": cpu,
                              "jax": jax.__version__}), flush=True)
        deep, shallow = max(depths), min(depths)
        ratio = medians[deep] / medians[shallow]
        print(json.dumps({"mode": mode, "ratio": round(ratio, 3), "of": f"{deep} layers / {shallow} layers"}),
              flush=True)
        if args.record:
            figure = (f"{ratio:.2f}x ({medians[deep]:.1f} s for {deep} layers, {medians[shallow]:.1f} s for "
                      f"{shallow}; median of {args.repeats} cold compiles each)")
            record = {"kind": "figure", "topic": "start-up",
                      "what": f"Compile time of a {mode} training step, {deep} layers against {shallow} at width "
                              f"{args.hidden} ({jax.default_backend()})",
                      "figure": figure, "command": f"python bench/compile_time.py --modes {mode} --layers "
                                                   f"{args.layers} --hidden {args.hidden} --repeats {args.repeats}",
                      "cpu": cpu, "versions": {"jax": jax.__version__}}
            with open(args.record, "a") as f:
                f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
