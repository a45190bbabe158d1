"""Cost of a checkpoint save, and what the per-file CRC-32 record adds to it.

    python bench/checkpoint_save.py                        # tiny-llama and bench-small, 3 saves each
    python bench/checkpoint_save.py --presets bench-small --saves 5

The state is a full fine-tune's: every weight of the preset (float32) plus Adam's two moments, saved with
`Checkpointer` as a run does (asynchronous). Per save: `save_s`, the time `save` holds the training loop (device to
host copy, Orbax's start); `total_s`, until the files and their record are on disk (`save` + `wait`);
`record_s`, the CRC-32 pass over the finished files alone (it runs in a background thread during training, so it
adds to neither `save_s` nor the step time). Median of `--saves` saves after one warm-up save. Run it with this
tree's `tempax` and with an older one on PYTHONPATH to compare before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def measure(preset: str, saves: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from tempax.models.decoder import Decoder
    from tempax.models.presets import get_preset
    from tempax.train import checkpoint as ck
    from tempax.train.state import TrainState
    from flax import nnx

    cfg = get_preset(preset)
    shapes = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))[1].flat_state()
    rng = np.random.default_rng(0)
    params = {".".join(map(str, k)): jnp.asarray(rng.standard_normal(v.shape, np.float32) * 0.02)
              for k, v in shapes}
    opt = optax.adam(1e-3)
    state = TrainState(step=jnp.int32(1), params=params, opt_state=opt.init(params),
                       rng=jnp.zeros(2, jnp.uint32), bad_step=jnp.int32(-1))
    nbytes = sum(int(x.nbytes) for x in jax.tree.leaves(state))
    row = {"preset": preset, "state_mib": round(nbytes / 2**20, 1), "has_record": hasattr(ck, "file_crc32")}
    save_s, total_s, record_s = [], [], []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        c = ck.Checkpointer(os.path.join(tmp, "checkpoints"), keep=2, async_save=True)
        for i in range(saves + 1):
            s = TrainState(step=jnp.int32(i + 1), params=state.params, opt_state=state.opt_state, rng=state.rng,
                           bad_step=state.bad_step)
            t0 = time.perf_counter()
            c.save(s)
            t1 = time.perf_counter()
            c.wait()
            t2 = time.perf_counter()
            if hasattr(ck, "file_crc32"):
                t3 = time.perf_counter()
                c._write_record(i + 1)
                record = time.perf_counter() - t3
            else:
                record = 0.0
            if i:  # the first save includes Orbax's and TensorStore's start-up
                save_s.append(t1 - t0)
                total_s.append(t2 - t0)
                record_s.append(record)
        c.close()
    row.update(save_s=round(statistics.median(save_s), 3), total_s=round(statistics.median(total_s), 3),
               record_s=round(statistics.median(record_s), 3))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", default="tiny-llama,bench-small")
    parser.add_argument("--saves", type=int, default=3)
    args = parser.parse_args()
    for preset in args.presets.split(","):
        print(json.dumps(measure(preset, args.saves)), flush=True)


if __name__ == "__main__":
    main()
