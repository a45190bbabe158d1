"""Tunix's side of the chip workloads, beside tempax's (`bench/gpu_train_check.py`, `bench/grpo_step.py`), on the
same device: LoRA SFT of the Llama-3.2-1B shape, greedy decoding at batch 1 and 64, and a GRPO step.

    .venv-tunix/bin/python bench/tpu_tunix.py --tiny             # every part at a tiny size (a CPU smoke run)
    bash scripts/tpu/run.sh tunix python bench/tpu_tunix.py      # on a TPU machine: Tunix's own install
    bash scripts/tpu/run.sh tunix python bench/tpu_tunix.py --parts decode --decode-batches 1

Tunix (google-tunix 0.1.7) cannot share tempax's environment (it pins safetensors < 0.8, tempax >= 0.8), so this
runs with Tunix's own Python: `.venv-tunix` here (`bash scripts/setup.sh --tunix`), `.tpu/site-tunix` on a TPU
machine (`scripts/tpu/run.sh tunix ...`). It imports nothing of tempax. Every part uses Tunix's own API, as its
examples do, on random weights of a real shape (`tunix.models.llama3.model.Llama3`, `nnx.Rngs(0)`), cast to
bfloat16 after initialisation (Tunix's Llama3 has no dtype setting; computation follows the weights' dtype):

* `sft`: `tunix.sft.peft_trainer.PeftTrainer` with qwix LoRA (`qwix.LoraProvider`, rank 16, alpha 32) on the
  projections tempax adapts by default (q, k, v, o, gate, up, down), applied after the cast so the adapters are
  in the weights' dtype as qwix makes them; AdamW (lr 1e-5, constant) on the adapters; batch 8 x 1024 random
  tokens (`--batch-size`, `--seq-len`), Tunix's default loss (next-token cross-entropy) with
  `tunix.sft.utils`'s positions and causal mask; `--remat` picks `RematConfig` (decoder: each decoder layer
  recomputed, the nearest to tempax's `train.remat=full`; block: the attention block only; none). The model is
  placed on a one-device mesh (`tunix.rl.reshard`) and trained inside `with mesh:`, as Tunix's examples do, so
  the step compiles once. Step times come from a `TrainingHooks` at each step's start, with one computation in
  flight (`max_inflight_computations=1`), so the gap between two starts is one whole step (`step_s_each` lists
  them all, so a recompilation would show); first_step_s is from `train()`'s call to the second step's start
  (compilation plus the first step); step_s is the median after `--warmup` steps.
* `decode`: `tunix.generate.sampler.Sampler`, greedy, 64-token prompts and 128 new tokens (as
  `bench/gpu_train_check.py` decodes for tempax), an EOS no token can equal so every row decodes them all, a KV
  cache of exactly prompt + new positions; shapes SmolLM2-135M and Llama-3.2-1B (`--decode-shapes`), batch 1 and
  64 (`--decode-batches`). tokens/s = batch x new tokens / the second call's wall time (the first compiles). It
  includes the prefill, which tempax's record reports apart: its batch x 128 / (prefill_s + decode_s) is the
  like-for-like figure.
* `grpo`: `tunix.rl.grpo.grpo_learner.GRPOLearner` over `tunix.rl.rl_cluster.RLCluster` (vanilla rollout) on the
  shared grpo_step workload (../shared/bench/workloads.json, as `bench/grpo_step.py`): 2 prompts x 4 samples,
  64-token prompts, up to 64 new tokens, temperature 1, reward len(text) / 100, beta 0.04, epsilon 0.2, float32
  weights (the workload's dtype), LoRA rank 16 on the same projections, AdamW lr 1e-5; the reference is the base
  model without adapters, the policy the same weights with qwix's (as Tunix's GRPO examples pair them). Seconds a
  step from the actor trainer's step starts: between two lie a train step, the next rollout and the reference
  pass.

The prompts are token ids written as the text "w17 w4032 ..." and read back by a word-id tokenizer with the
methods Tunix's `TokenizerAdapter` asks of a tokenizer (encode, decode, bos_id, eos_id, pad_id), so no tokenizer
file is carried. Prints one JSON line per workload (a part that fails prints its error, and the rest still run),
each with the first-call or first-step time and the versions of Tunix, JAX and Flax.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
import warnings
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Shapes as `tempax.models.presets` gives them (Hugging Face configs), in Tunix's `ModelConfig` names.
SHAPES: dict[str, dict[str, Any]] = {
    "llama3.2-1b": dict(num_layers=16, vocab_size=128256, embed_dim=2048, hidden_dim=8192, num_heads=32,
                        head_dim=64, num_kv_heads=8, rope_theta=500_000, norm_eps=1e-5),
    "smollm2-135m": dict(num_layers=30, vocab_size=49152, embed_dim=576, hidden_dim=1536, num_heads=9,
                         head_dim=64, num_kv_heads=3, rope_theta=100_000, norm_eps=1e-5),
}
# `bench/gpu_train_check.py`'s tiny copy of a shape: 2 layers, 128 wide.
TINY_SHAPE: dict[str, Any] = dict(num_layers=2, embed_dim=128, hidden_dim=256, num_heads=4, num_kv_heads=2,
                                  head_dim=32, vocab_size=2048)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_RANK, LORA_ALPHA = 16, 32.0
BOS, EOS, PAD = 1, 2, 0
DECODE_PROMPT_LEN, DECODE_NEW = 64, 128


class WordIds:
    """A tokenizer of token ids written as words, "w17 w4032", for Tunix's `TokenizerAdapter` (which takes any
    object with encode, decode, bos_id, eos_id and pad_id): prompts go through Tunix's sampler exactly as the ids
    drawn for them, without a tokenizer file. Ids below `first` (BOS, EOS, PAD) decode to nothing."""

    def __init__(self, vocab_size: int, first: int = 4):
        self.vocab_size, self.first = vocab_size, first

    def encode(self, text: Any, **_: Any) -> list[int]:
        """The ids of "w17 w4032 ..." (also of a numpy array holding such texts, as Tunix's GRPO rollout hands
        them over; ids already in it stay as they are)."""
        items = text.tolist() if hasattr(text, "tolist") else text
        items = [items] if isinstance(items, (str, int)) else items
        return [int(w[1:]) for item in items for w in (item.split() if isinstance(item, str) else ["w%d" % item])]

    def decode(self, ids: Any, **_: Any) -> str:
        return " ".join(f"w{int(i)}" for i in list(ids) if int(i) >= self.first)

    def bos_id(self) -> int:
        return BOS

    def eos_id(self) -> int:
        return EOS

    def pad_id(self) -> int:
        return PAD


def ids_text(ids: Any) -> str:
    return " ".join(f"w{int(i)}" for i in ids)


def versions() -> dict[str, str]:
    from importlib.metadata import version

    import flax
    import jax

    return {"tunix": version("google-tunix"), "jax": jax.__version__, "flax": flax.__version__,
            "qwix": version("qwix")}


def device_kind() -> str:
    import jax

    device = jax.devices()[0]
    return getattr(device, "device_kind", str(device))


def shape_config(shape: str, tiny: bool, remat: str = "none"):
    """Tunix's `llama3.ModelConfig` for one of SHAPES (its tiny copy with `tiny`), weights tied as both models
    tie them."""
    from tunix.models.llama3 import model as llama3

    dims = dict(SHAPES[shape])
    if tiny:
        dims.update(TINY_SHAPE)
    return llama3.ModelConfig(**dims, weight_tying=True, remat_config=llama3.RematConfig[remat.upper()])


def bf16_model(config):
    """Tunix's Llama3 with random weights from `nnx.Rngs(0)`, every parameter cast to bfloat16."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from tunix.models.llama3 import model as llama3

    model = llama3.Llama3(config, rngs=nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda x: x.astype(jnp.bfloat16), state))
    jax.block_until_ready(nnx.state(model))
    return model


def with_lora(model):
    """qwix LoRA (Tunix's way, as its `apply_lora_to_model` helper does) on LORA_TARGETS."""
    import qwix

    provider = qwix.LoraProvider(module_path=".*(" + "|".join(LORA_TARGETS) + ")", rank=LORA_RANK,
                                 alpha=LORA_ALPHA)
    from flax import nnx

    return qwix.apply_lora_to_model(model, provider, rngs=nnx.Rngs(1), **model.get_model_input())


def one_device_mesh():
    """A 1 x 1 mesh with the axis names of Tunix's default sharding ("fsdp", "tp"), axes of the Auto kind (the
    model's sharding annotations are hints, as under the `with mesh:` of Tunix's examples)."""
    import jax

    return jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def count(model, kind) -> tuple[int, str]:
    import jax
    from flax import nnx

    leaves = jax.tree.leaves(nnx.state(model, kind))
    return sum(int(x.size) for x in leaves), str(leaves[0].dtype) if leaves else ""


def step_timer():
    """A `TrainingHooks` recording when `train()` was called (set `.called`), each step's start, and the end."""
    from tunix.sft import hooks

    class StepTimes(hooks.TrainingHooks):
        def __init__(self) -> None:
            self.called = 0.0
            self.starts: list[float] = []
            self.end = 0.0

        def on_train_start(self, train_ctx) -> None:
            pass

        def on_train_end(self, train_ctx) -> None:
            self.end = time.perf_counter()

        def on_train_step_start(self, train_ctx) -> None:
            self.starts.append(time.perf_counter())

        def on_train_step_end(self, train_ctx, train_loss=None, eval_loss=None) -> None:
            pass

        def on_eval_step_start(self, train_ctx) -> None:
            pass

        def on_eval_step_end(self, train_ctx, eval_loss=None) -> None:
            pass

        def step_seconds(self) -> tuple[float, list[float]]:
            """(first step with compilation, the later steps' seconds)."""
            marks = self.starts + [self.end]
            return marks[1] - self.called, [b - a for a, b in zip(marks[1:], marks[2:])]

    return StepTimes()


def sft(args: argparse.Namespace) -> dict:
    import jax
    import numpy as np
    import optax
    from tunix.rl import reshard
    from tunix.sft import peft_trainer
    from tunix.sft import utils as sft_utils

    batch, seq = (2, 64) if args.tiny else (args.batch_size, args.seq_len)
    steps = args.warmup + args.steps
    t0 = time.perf_counter()
    config = shape_config("llama3.2-1b", args.tiny, args.remat)
    mesh = one_device_mesh()
    # Placed on the mesh as Tunix's LoRA helper does (tunix.rl.reshard), so the first step's inputs carry the
    # shardings of every later one and the step compiles once.
    model = reshard.reshard_model_to_mesh(with_lora(bf16_model(config)), mesh)
    init_s = time.perf_counter() - t0
    from flax import nnx

    params, base_dtype = count(model, nnx.Param)
    trainable, lora_dtype = count(model, nnx.LoRAParam)
    base = params - trainable

    def model_input(x: peft_trainer.TrainingInput) -> dict:
        return {"input_tokens": x.input_tokens, "input_mask": x.input_mask,
                "positions": sft_utils.build_positions_from_mask(x.input_mask),
                "attention_mask": sft_utils.make_causal_attn_mask(x.input_mask)}

    rng = np.random.default_rng(0)
    data = [peft_trainer.TrainingInput(input_tokens=rng.integers(4, config.vocab_size, (batch, seq), dtype=np.int32),
                                       input_mask=np.ones((batch, seq), dtype=bool)) for _ in range(steps)]
    training = peft_trainer.TrainingConfig(eval_every_n_steps=10**9, max_steps=steps, max_inflight_computations=1,
                                           pbar_description=None)
    trainer = peft_trainer.PeftTrainer(model, optax.adamw(1e-5, weight_decay=0.0), training)
    trainer = trainer.with_gen_model_input_fn(model_input)
    timer = step_timer()
    trainer.with_training_hooks(timer)
    # `with mesh:` (JAX's older form, which it warns about): PeftTrainer reads the mesh from it to place the
    # optimizer's state before compiling; `jax.set_mesh` leaves it unset, and the second step compiles again.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        mesh.__enter__()
    try:
        timer.called = time.perf_counter()
        trainer.train(data)
    finally:
        mesh.__exit__(None, None, None)
    first, later = timer.step_seconds()
    measured = later[max(args.warmup - 1, 0):] or later
    step_s = statistics.median(measured)
    tokens_per_s = batch * seq / step_s
    return {"part": "sft", "library": "tunix", "shape": "tiny" if args.tiny else "llama3.2-1b", "params": params,
            "base_params": base, "trainable": trainable, "base_dtype": base_dtype, "lora_dtype": lora_dtype,
            "lora_rank": LORA_RANK, "remat": args.remat, "batch": batch, "seq_len": seq, "init_s": round(init_s, 2),
            "first_step_s": round(first, 2), "step_s_each": [round(t, 4) for t in later],
            "steps_timed": len(measured), "step_s": round(step_s, 4),
            "tokens_per_s": round(tokens_per_s, 1),
            "model_tflops_per_s": round(4 * base * tokens_per_s / 1e12, 3),  # 4N a token, as gpu_train_check's LoRA
            "device": device_kind(), **versions()}


def decode(shape: str, batch: int, args: argparse.Namespace) -> dict:
    import numpy as np
    from tunix.generate import sampler as tunix_sampler

    config = shape_config(shape, args.tiny)
    model = bf16_model(config)
    tokenizer = WordIds(config.vocab_size)
    cache = tunix_sampler.CacheConfig(cache_size=DECODE_PROMPT_LEN + DECODE_NEW, num_layers=config.num_layers,
                                      num_kv_heads=config.num_kv_heads, head_dim=config.head_dim)
    sampler = tunix_sampler.Sampler(model, tokenizer, cache)
    # BOS + 63 ids: the sampler adds BOS to the text's ids, so each prompt is exactly DECODE_PROMPT_LEN tokens.
    ids = np.random.default_rng(1).integers(4, config.vocab_size, (batch, DECODE_PROMPT_LEN - 1))
    texts = [ids_text(row) for row in ids]
    assert len(sampler.tokenize(texts[0])) == DECODE_PROMPT_LEN
    calls = []
    for _ in range(2):  # the first compiles
        t = time.perf_counter()
        out = sampler(texts, max_generation_steps=DECODE_NEW, max_prompt_length=DECODE_PROMPT_LEN, eos_tokens=[-1],
                      temperature=0.0)
        calls.append(time.perf_counter() - t)
        assert [len(row) for row in out.tokens] == [DECODE_NEW] * batch, "a row did not decode every new token"
    return {"part": "decode", "library": "tunix", "shape": "tiny-" + shape if args.tiny else shape,
            "params": count(model, __import__("flax").nnx.Param)[0], "dtype": "bfloat16", "batch": batch,
            "prompt_len": DECODE_PROMPT_LEN, "new_tokens": DECODE_NEW, "first_call_s": round(calls[0], 2),
            "call_s": round(calls[1], 4), "tokens_per_s": round(batch * DECODE_NEW / calls[1], 1),
            "device": device_kind(), **versions()}


def _report(part: str, fn: Callable[..., dict], *fn_args: Any, **labels: Any) -> None:
    """Prints fn's JSON record, or the error it raised with the part's labels: the other parts still run."""
    try:
        record = fn(*fn_args)
    except Exception as e:  # noqa: BLE001 - a chip run must report every part it can, whatever one part hits
        where = [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in traceback.extract_tb(e.__traceback__)]
        record = {"part": part, "library": "tunix", **labels, "error": f"{type(e).__name__}: {e}"[:2000],
                  "where": where[-4:]}
    print(json.dumps(record), flush=True)


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


PARTS = ("sft", "decode", "grpo")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="2-layer, 128-wide copies of the shapes (CPU smoke run)")
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated: " + ", ".join(PARTS))
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=2, help="sft: steps left out of the median, the first included")
    ap.add_argument("--steps", type=int, default=5, help="sft: measured steps")
    ap.add_argument("--remat", default="decoder", choices=("none", "block", "decoder"),
                    help="sft: Tunix's RematConfig (decoder: each layer recomputed, as tempax's remat=full)")
    ap.add_argument("--decode-shapes", default="smollm2-135m,llama3.2-1b")
    ap.add_argument("--decode-batches", default="1,64")
    ap.add_argument("--shared", default=None, help="grpo: the folder of workloads.json (default: "
                    "$TEMPAX_BENCH_SHARED, else ../shared/bench beside the checkout)")
    args = ap.parse_args(argv)
    parts = _names(args.parts)
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        ap.error(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    try:
        import tunix  # noqa: F401
    except ImportError:
        raise SystemExit(f"Tunix is not installed for {sys.executable}: run `bash scripts/setup.sh --tunix` and use "
                         ".venv-tunix/bin/python (on a TPU machine: bash scripts/tpu/run.sh tunix python ...)")
    if "sft" in parts:
        _report("sft", sft, args, remat=args.remat)
    if "decode" in parts:
        for shape in _names(args.decode_shapes):
            for batch in (int(b) for b in _names(args.decode_batches)):
                _report("decode", decode, shape, batch, args, shape=shape, batch=batch)
    if "grpo" in parts:
        _report("grpo", grpo, args)
    return 0


def load_workloads(shared: str | None) -> dict:
    """../shared/bench/workloads.json (or `shared`/workloads.json, or $TEMPAX_BENCH_SHARED's, as run.sh sets it)."""
    folder = shared or os.environ.get("TEMPAX_BENCH_SHARED") or os.path.join(ROOT, "..", "shared", "bench")
    with open(os.path.join(folder, "workloads.json")) as f:
        return json.load(f)


def grpo(args: argparse.Namespace) -> dict:
    import jax
    import numpy as np
    import optax
    from flax import nnx
    from tunix.models.llama3 import model as llama3
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout

    spec = load_workloads(args.shared)
    size = "tiny" if args.tiny else "small"
    shape, w = spec["models"][size], spec["workloads"]["grpo_step"]
    steps = w["steps"][size]
    total = steps["warmup"] + steps["measured"]
    num_prompts, group, prompt_len, new = w["num_prompts"], w["group_size"], w["prompt_len"], w["max_new_tokens"]
    config = llama3.ModelConfig(
        num_layers=shape["num_layers"], vocab_size=shape["vocab_size"], embed_dim=shape["hidden_size"],
        hidden_dim=shape["intermediate_size"], num_heads=shape["num_heads"], head_dim=shape["head_dim"],
        num_kv_heads=shape["num_kv_heads"], rope_theta=int(shape["rope_theta"]), norm_eps=shape["rms_norm_eps"],
        weight_tying=shape["tie_word_embeddings"])
    t0 = time.perf_counter()
    base = llama3.Llama3(config, rngs=nnx.Rngs(spec["init"]["seed"]))  # float32, as the workload says
    params = count(base, nnx.Param)[0]
    assert params == shape["expected_num_params"], f"{params} parameters, workloads.json says " \
                                                   f"{shape['expected_num_params']}"
    policy = with_lora(base)
    init_s = time.perf_counter() - t0
    # Fresh prompts every step: BOS (added by Tunix's tokenisation) + 63 ids, as bench/grpo_step.py draws them.
    rng = np.random.default_rng(1234 + 2)
    ids = rng.integers(4, config.vocab_size, (total * num_prompts, prompt_len - 1))
    # Each batch's columns are arrays (as Tunix's data loaders give them: its learner repeats every leaf G times).
    batches = [{"prompts": np.array([ids_text(row) for row in ids[i * num_prompts:(i + 1) * num_prompts]])}
               for i in range(total)]

    def length_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        return [len(text) / 100.0 for text in completions]

    mesh = one_device_mesh()
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optax.adamw(1e-5, weight_decay=0.0), eval_every_n_steps=10**9, max_steps=total,
        max_inflight_computations=1, pbar_description=None)
    rollout = base_rollout.RolloutConfig(max_tokens_to_generate=new, max_prompt_length=prompt_len,
                                         kv_cache_size=prompt_len + new, temperature=w["temperature"], top_p=1.0,
                                         top_k=None, eos_tokens=[EOS])
    cluster = rl_cluster_lib.RLCluster(
        actor=policy, reference=base, tokenizer=WordIds(config.vocab_size),
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={rl_cluster_lib.Role.ACTOR: mesh, rl_cluster_lib.Role.REFERENCE: mesh,
                          rl_cluster_lib.Role.ROLLOUT: mesh},
            rollout_engine="vanilla", offload_to_cpu=False, training_config=training, rollout_config=rollout))
    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster, reward_fns=[length_reward],
        algo_config=grpo_learner.GRPOConfig(num_generations=group, num_iterations=w["num_iterations"],
                                            beta=w["beta"], epsilon=w["epsilon"]))
    timer = step_timer()
    cluster.actor_trainer.with_training_hooks(timer)
    timer.called = time.perf_counter()
    learner.train(batches)
    first, later = timer.step_seconds()
    # Between two starts of the actor's train step lie a train step, the next rollout and reference pass: one
    # whole GRPO step. The last gap (to the end of training) holds no rollout, so it is left out.
    later = later[:-1]
    measured = later[max(steps["warmup"] - 1, 0):] or later
    return {"part": "grpo", "library": "tunix", "workload": "grpo_step", "size": size, "params": params,
            "trainable": count(policy, nnx.LoRAParam)[0], "dtype": "float32", "init_s": round(init_s, 2),
            "steps": len(timer.starts), "first_step_s": round(first, 2), "step_s_each": [round(t, 3) for t in later],
            "s_per_step": round(statistics.median(measured), 4), "device": device_kind(), **versions()}


if __name__ == "__main__":
    sys.exit(main())
