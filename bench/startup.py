"""Start-up cost of a randomly initialised model vs its depth: one-program constructor vs `init_decoder`.

    python bench/startup.py                                  # llama3.2-1b and llama3.1-8b, 1..32 layers
    python bench/startup.py --presets llama3.2-1b --layers 2,16 --init   # also run the initialisers

"before" is what `init_sharded` did: `jax.jit` of the whole `Decoder` constructor, lowered and compiled (the
weights stay abstract, so an 8B shape needs no memory). "after" is `tempax.models.init.init_decoder`: the
embedding, the layers (one layer's initialiser under a scan) and the head compiled once each. With
`--init` the weights are also created (`init_decoder` in full, timed to the last array), which needs the memory
of the model: leave it off for 8B on a small machine (`--init-max-params 2e9` creates only shapes up to 2B).
"""

from __future__ import annotations

import argparse
import json
import time


def measure(preset: str, layers: int, devices: int, run_init: bool) -> dict:
    import jax
    from flax import nnx

    from tempax.models.decoder import Decoder
    from tempax.models.init import decoder_programs, init_decoder
    from tempax.models.presets import get_preset
    from tempax.parallel import make_mesh
    from tempax.parallel.rules import param_shardings

    cfg = get_preset(preset).replace(num_layers=layers)
    mesh = make_mesh(fsdp=devices, devices=jax.devices()[:devices])
    build = lambda: Decoder(cfg, rngs=nnx.Rngs(0))  # noqa: E731
    row = {"preset": preset, "layers": layers, "params": cfg.num_params(), "devices": devices}

    t0 = time.perf_counter()
    abstract = nnx.split(nnx.eval_shape(build))[1]
    one = jax.jit(lambda: nnx.split(build())[1], out_shardings=param_shardings(abstract, mesh))
    one.lower().compile()
    row["before_compile_s"] = round(time.perf_counter() - t0, 2)

    t0 = time.perf_counter()
    programs = decoder_programs(cfg, 0, mesh)
    for name in ("embedding", "layers", "head"):
        programs[name].lower(programs["rngs"]).compile()
    row["after_compile_s"] = round(time.perf_counter() - t0, 2)

    if run_init:
        jax.clear_caches()
        t0 = time.perf_counter()
        model = init_decoder(cfg, 0, mesh)
        jax.block_until_ready(nnx.state(model))
        row["after_compile_plus_init_s"] = round(time.perf_counter() - t0, 2)
        del model
    return row


def _num_params(preset: str, layers: int) -> int:
    from tempax.models.presets import get_preset

    return get_preset(preset).replace(num_layers=layers).num_params()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="llama3.2-1b,llama3.1-8b")
    ap.add_argument("--layers", default="1,2,4,8,16,32", help="comma-separated layer counts")
    ap.add_argument("--devices", type=int, default=1, help="fsdp devices (XLA host devices on CPU)")
    ap.add_argument("--init", action="store_true", help="also create the weights (needs the model's memory)")
    ap.add_argument("--init-max-params", type=float, default=None, metavar="N",
                    help="create the weights (as --init) only for shapes of at most N parameters")
    args = ap.parse_args(argv)
    for preset in args.presets.split(","):
        for layers in (int(x) for x in args.layers.split(",")):
            limit = args.init_max_params
            run_init = args.init or (limit is not None and _num_params(preset, layers) <= limit)
            print(json.dumps(measure(preset, layers, args.devices, run_init)), flush=True)


if __name__ == "__main__":
    main()
