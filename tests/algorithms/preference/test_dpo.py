"""DPO-family training: stacked batches, per-pair masking, micro-batching, where reference log-probs come from,
learning a synthetic preference on a tiny model (full weights, LoRA, QLoRA), bad rows, configs and recipes."""

from __future__ import annotations

import gc
import glob
import json
import math
import os
import random

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from tempax.algorithms.preference.batches import (
    REF_LOGPS,
    annotated_pair_loader,
    compute_reference_logps,
    jit_sequence_logps,
    pair_mask,
    pair_preference_loss,
    sequence_logps,
)
from tempax.algorithms.preference.losses import dpo_loss
from tempax.algorithms.preference.dpo import DPOConfig, DPOKnobsConfig, DPOLoss, main, prepare
from tempax.configlib import from_dict, load_config
from tempax.data.packing import pad_examples
from tempax.data.preference import PreferenceOptions, collate_pairs, tokenize_preference_rows
from tempax.errors import ConfigError
from tempax.models.lora import LoraConfig, apply_lora, lora_layers
from tempax.train.state import ModelParts, init_state
from tempax.train.step import make_train_step
from tests.kit.models import tiny_tempax_model
from tests.kit.tokenizers import tiny_chat_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SEQ = 48
# A one-layer model compiles fast; the synthetic preference needs no depth.
SMALL = {"vocab_size": 400, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "num_kv_heads": 1,
         "head_dim": 16, "intermediate_size": 64}
WORDS = "bread salt water yeast flour fox dog capital France Paris numbers help merges quick brown lazy".split()


def synthetic_rows(n: int, seed: int) -> list[dict]:
    """Replies that start "Sure," are preferred over replies that start "No."; the words vary per pair, so held-out
    pairs (another seed) are new combinations and only the preference itself carries over."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.sample(WORDS, 2)
        rows.append({"prompt": f"Tell me about {a} and {b}.", "chosen": f"Sure, {b} {a}.", "rejected": f"No. {a} {b}."})
    return rows


def write_jsonl(path: str, rows: list) -> str:
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


@pytest.fixture(scope="module")
def tok():
    return tiny_chat_tokenizer()


@pytest.fixture(scope="module")
def files(tmp_path_factory, tok):
    d = tmp_path_factory.mktemp("dpo")
    tok.hf.save_pretrained(str(d / "tok"))
    return {
        "tok": str(d / "tok"),
        "train": write_jsonl(str(d / "train.jsonl"), synthetic_rows(64, seed=0)),
        "test": write_jsonl(str(d / "test.jsonl"), synthetic_rows(24, seed=1)),
    }


def with_changes(cfg: dict, changes: dict) -> dict:
    """Sets dotted keys ("train.steps") of a nested config dict in place."""
    for key, value in changes.items():
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return cfg


def tiny_cfg(files: dict, run_dir: str, **changes) -> DPOConfig:
    cfg = {
        "model": {"source": "preset:tiny-llama", "tokenizer": files["tok"], "overrides": dict(SMALL)},
        "data": {"path": files["train"], "eval_path": files["test"]},
        "dpo": {"loss": "sigmoid", "beta": 0.1},
        "train": {"steps": 24, "batch_size": 16, "seq_len": SEQ, "run_dir": run_dir, "progress_bar": False,
                  "tensorboard": False, "mesh": {"num_devices": 1}, "checkpoint": {"save_at_end": False},
                  "optimizer": {"learning_rate": 1e-2, "schedule": "constant"}},
    }
    with_changes(cfg, changes)
    return from_dict(DPOConfig, cfg)


def tiny_model(seed: int = 0):
    return tiny_tempax_model("llama", seed=seed, **SMALL)


def tiny_pairs(tok, n: int = 6, seed: int = 0):
    pairs, _ = tokenize_preference_rows(synthetic_rows(n, seed), tok, PreferenceOptions(max_length=SEQ))
    return pairs


# ---------------------------------------------------------------------------------------------- batches and masking


def test_per_pair_loss_matches_hand_numbers_and_ignores_padding_pairs():
    """Two real pairs and one padding pair (B = 3), beta = 1, reference log-probs 0:
    pair 0: logits = (-1) - (-2) = 1   -> loss -log sigmoid(1)  = log(1 + e^-1) = 0.31326
    pair 1: logits = (-3) - (-1) = -2  -> loss -log sigmoid(-2) = log(1 + e^2)  = 2.12693
    mean over the 2 real pairs = 1.22009; accuracy (1 + 0) / 2 = 0.5; loss_weight 2.
    The padding pair (logits 0, loss log 2) must not count."""
    policy = jnp.array([-1.0, -3.0, 0.0, -2.0, -1.0, 0.0])  # chosen rows, then rejected rows
    lengths = jnp.array([2.0, 2.0, 0.0, 2.0, 2.0, 0.0])
    weights = jnp.array([1.0, 1.0, 0.0])
    loss, m = pair_preference_loss("sigmoid", policy, lengths, weights, ref_logps=jnp.zeros(6), beta=1.0)
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(2.0))) / 2
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(m["accuracy"]) == pytest.approx(0.5)
    assert float(m["loss_weight"]) == 2.0
    # With every pair real, the per-pair mean is exactly the batch loss of losses.py.
    full, _ = dpo_loss(policy[:3], policy[3:], jnp.zeros(3), jnp.zeros(3), beta=1.0)
    same, _ = pair_preference_loss("sigmoid", policy, lengths, jnp.ones(3), ref_logps=jnp.zeros(6), beta=1.0)
    assert float(same) == pytest.approx(float(full), rel=1e-6)


def test_stacked_batch_scores_each_side_as_if_alone(tok):
    """Invariance: each response's summed log-prob from the stacked [2B, T] batch (chosen rows, then rejected
    rows, a padding pair at the end) equals the one from a plain batch of the same sequences in another order
    with much more right padding; the padding pair gives 0 and is masked out."""
    model = tiny_model()
    score = jit_sequence_logps(model)
    pairs = tiny_pairs(tok, 3)
    logps, n = score(collate_pairs(pairs, seq_len=SEQ, pad_id=tok.pad_id, batch_size=4))
    assert np.asarray(pair_mask(collate_pairs(pairs, seq_len=SEQ, pad_id=0, batch_size=4))).tolist() == [1, 1, 1, 0]
    examples = [p.rejected for p in pairs][::-1] + [p.chosen for p in pairs]
    plain_logps, plain_n = score(pad_examples(examples, seq_len=2 * SEQ, pad_id=tok.pad_id))
    # stacked: rows 0-2 chosen, 4-6 rejected; plain: rows 0-2 the rejected ones reversed, rows 3-5 chosen
    np.testing.assert_allclose(plain_logps[[3, 4, 5, 2, 1, 0]], logps[[0, 1, 2, 4, 5, 6]], rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(plain_n[[3, 4, 5, 2, 1, 0]], n[[0, 1, 2, 4, 5, 6]])
    assert n[0] == pairs[0].chosen.num_targets and n[4] == pairs[0].rejected.num_targets
    assert logps[3] == 0.0 and n[7] == 0.0


@pytest.mark.heavy
def test_reply_log_probs_from_the_fused_head_equal_those_from_the_full_logits(tok):
    """`sequence_logps` applies a `Decoder`'s head at the reply tokens only; anything else is scored from its
    full logits. The same model both ways: equal summed log-probs (value and gradient) and reply lengths."""
    model = tiny_model()
    batch = {k: jnp.asarray(v) for k, v in collate_pairs(tiny_pairs(tok, 3), seq_len=SEQ, pad_id=tok.pad_id,
                                                          batch_size=4).items()}

    class FullLogits:  # not a Decoder: called for its logits
        def __init__(self, m):
            self.m = m

        def __call__(self, tokens, **kw):
            return self.m(tokens, **kw)

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def summed(p, wrap):
        m = nnx.merge(graphdef, p, rest)
        logps, n = sequence_logps(wrap(m), batch)
        return jnp.sum(logps * jnp.arange(1.0, 9.0)), (logps, n)

    (_, (fused, n_fused)), g_fused = jax.value_and_grad(summed, has_aux=True)(params, lambda m: m)
    (_, (full, n_full)), g_full = jax.value_and_grad(summed, has_aux=True)(params, FullLogits)
    np.testing.assert_allclose(fused, full, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(n_fused, n_full)
    for a, b in zip(jax.tree.leaves(g_fused), jax.tree.leaves(g_full)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_micro_batches_keep_pairs_together(tok):
    """The train step's micro-batch i takes rows i, i + n, ... of a stacked batch, which is again a stacked batch
    of aligned pairs when n divides B: 4 pairs in 2 micro-batches give the same loss and gradient as 1 pass."""
    pairs = tiny_pairs(tok, 4)
    batch = collate_pairs(pairs, seq_len=SEQ, pad_id=tok.pad_id)
    batch[REF_LOGPS] = np.linspace(-60.0, -40.0, 8).astype(np.float32)
    loss_fn = DPOLoss("sigmoid", (("beta", 0.5), ("label_smoothing", 0.1)), "batch")
    outs = []
    for n in (1, 2):
        model = tiny_model()
        parts, params = ModelParts.split(model)
        step = jax.jit(make_train_step(loss_fn, parts, optax.sgd(0.0), num_micro_batches=n))
        state = init_state(params, optax.sgd(0.0), 0)
        _, metrics = step(state, parts.rest, {k: jnp.asarray(v) for k, v in batch.items()})
        outs.append({k: float(v) for k, v in metrics.items() if jnp.ndim(v) == 0})
    for key in ("loss", "grad_norm", "accuracy", "reward_margin", "chosen_logps"):
        assert outs[0][key] == pytest.approx(outs[1][key], rel=2e-5, abs=1e-6), key


def test_precomputed_reference_travels_with_its_rows(tok):
    """`compute_reference_logps` equals scoring each pair directly, and the shuffled loader puts each pair's
    reference next to its rows (ref_logps[j] and ref_logps[B + j] belong to rows j and B + j)."""
    model = tiny_model()
    pairs = tiny_pairs(tok, 6)
    items = compute_reference_logps(model, pairs, batch_size=4, seq_len=SEQ, pad_id=tok.pad_id)
    score = jit_sequence_logps(model)
    by_tokens = {}
    for it in items:
        lp, _ = score(collate_pairs([it.pair], seq_len=SEQ, pad_id=tok.pad_id))
        np.testing.assert_allclose(it.values[REF_LOGPS], lp, rtol=1e-5, atol=1e-4)
        by_tokens[tuple(it.pair.chosen.tokens)] = it.values[REF_LOGPS]
    loader = annotated_pair_loader(items, batch_size=3, seq_len=SEQ, pad_id=tok.pad_id, seed=3)
    batch = next(loader)
    for j in range(3):
        chosen_tokens = batch["tokens"][j][batch["segment_ids"][j] > 0]
        c, r = by_tokens[tuple(chosen_tokens)]
        assert batch[REF_LOGPS][j] == pytest.approx(c) and batch[REF_LOGPS][3 + j] == pytest.approx(r)


@pytest.mark.parametrize("name", ["ipo", "hinge", "orpo", "simpo"])
def test_every_loss_gives_finite_loss_and_gradients(tok, name):
    spec = DPOKnobsConfig(loss=name, beta=2.0 if name == "simpo" else 0.1)
    mode = spec.reference_mode(has_adapters=False)
    assert mode == ("none" if name in ("orpo", "simpo") else "precomputed")
    loss_fn = DPOLoss.from_spec(spec, mode)
    batch = {k: jnp.asarray(v) for k, v in collate_pairs(tiny_pairs(tok, 2), seq_len=SEQ, pad_id=tok.pad_id).items()}
    batch[REF_LOGPS] = jnp.full((4,), -50.0)
    model = tiny_model()
    (loss, metrics), grads = nnx.jit(nnx.value_and_grad(loss_fn, has_aux=True))(model, batch)
    assert np.isfinite(float(loss)) and float(metrics["loss_weight"]) == 2.0
    assert {"chosen_reward", "rejected_reward", "reward_margin", "accuracy", "chosen_logps"} <= set(metrics)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


# ---------------------------------------------------------------------------------------------- reference without a copy


@pytest.mark.parametrize("quantize", [None, "nf4"])
def test_adapters_off_reference_is_the_base_model(tok, quantize):
    """With trained (non-zero) adapters, log-probs inside `disable_adapters` equal the base's: the float model for
    LoRA, the same model with B = 0 for QLoRA (its base is the quantized one). And `DPOLoss(reference=
    'adapters_off')` gives the same loss as feeding those base log-probs in with the batch."""
    base = tiny_model()
    lora = apply_lora(base, LoraConfig(rank=4, alpha=8.0, quantize_base=quantize, block_size=16), rngs=nnx.Rngs(1))
    batch = {k: jnp.asarray(v) for k, v in collate_pairs(tiny_pairs(tok, 3), seq_len=SEQ, pad_id=tok.pad_id).items()}
    base_logps, _ = jit_sequence_logps(lora if quantize else base)(batch)  # B = 0 still: exactly the base
    for i, (_, layer) in enumerate(lora_layers(lora)):
        layer.lora_b.set_value(jax.random.normal(jax.random.key(i), layer.lora_b.shape) * 0.3)
    off_logps, _ = jit_sequence_logps(lora, adapters_off=True)(batch)
    on_logps, _ = jit_sequence_logps(lora)(batch)
    np.testing.assert_allclose(off_logps, base_logps, rtol=1e-6, atol=1e-5)
    assert np.abs(on_logps - base_logps).max() > 1e-3  # the adapters do matter
    losses = nnx.jit(lambda m, b: (DPOLoss("sigmoid", (("beta", 0.1),), "adapters_off")(m, b)[0],
                                   DPOLoss("sigmoid", (("beta", 0.1),), "batch")(m, {**b, REF_LOGPS: base_logps})[0]))
    loss_off, loss_batch = losses(lora, batch)
    assert float(loss_off) == pytest.approx(float(loss_batch), rel=1e-5)


def _live_bytes() -> int:
    gc.collect()
    return sum(a.nbytes for a in jax.live_arrays() if not a.is_deleted())


def _param_bytes(model) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.heavy
def test_lora_reference_holds_no_second_copy_of_the_weights(files, tmp_path):
    """Count bytes. adapters_off: the trainer's frozen rest *is* the base (its bytes equal the base's parameter
    bytes), the loss function holds no arrays, and no reference model exists. frozen_copy: the reference copy
    adds the base's bytes again, which is what adapters_off avoids."""
    base_bytes = _param_bytes(tiny_model())
    runs = {}
    for mode in ("adapters_off", "frozen_copy"):
        cfg = tiny_cfg(files, str(tmp_path / mode), lora={"rank": 4, "alpha": 8.0}, **{"dpo.reference": mode})
        before = _live_bytes()
        run = prepare(cfg, log=lambda s: None)
        runs[mode] = (run, _live_bytes() - before)
    run, _ = runs["adapters_off"]
    assert run.reference == "adapters_off" and run.reference_model is None
    assert not [x for x in jax.tree.leaves(vars(run.loss_fn)) if isinstance(x, jax.Array)]
    rest_bytes = sum(x.nbytes for x in jax.tree.leaves(run.trainer.rest))
    lora_bytes = sum(x.nbytes for x in run.trainer.state.params.values())
    assert rest_bytes == base_bytes
    assert lora_bytes < base_bytes / 4
    copy_run, _ = runs["frozen_copy"]
    assert _param_bytes(copy_run.reference_model) >= base_bytes  # the copy is a whole second model
    # ... and it scores like the untrained policy (B = 0), which is what adapters_off computes inside the loss.
    eval_batch = copy_run.eval_batches()[0]
    policy_logps, _ = jit_sequence_logps(run.trainer.model, adapters_off=True)(eval_batch)
    np.testing.assert_allclose(eval_batch[REF_LOGPS], policy_logps, rtol=1e-5, atol=1e-4)
    extra = runs["frozen_copy"][1] - runs["adapters_off"][1]
    assert extra >= 0.9 * base_bytes, (extra, base_bytes)


# ---------------------------------------------------------------------------------------------- learning


@pytest.mark.parametrize("variant", [
    "full",
    # LoRA/QLoRA training compiles another step (~40 s on 2 busy cores); their reference path is covered fast by
    # the two tests above.
    pytest.param("lora", marks=pytest.mark.slow),
    pytest.param("qlora", marks=pytest.mark.slow),
])
def test_dpo_learns_a_synthetic_preference(files, tmp_path, variant):
    """Held-out implicit rewards start at 0 (policy = reference) and end with accuracy ~1 and a clearly positive
    margin, with full weights (reference precomputed once), LoRA and QLoRA (reference = adapters off); the
    policy's own mean-log-prob preference ends at ~1 too."""
    changes = {}
    if variant != "full":
        changes["lora"] = {"rank": 8, "alpha": 32.0, **({"quantize_base": "nf4", "block_size": 16}
                                                           if variant == "qlora" else {})}
    logs = []
    result = main(tiny_cfg(files, str(tmp_path / variant), **changes), log=logs.append)
    before, after = result.extras["eval_before"], result.extras["eval_after"]
    assert result.extras["reference"] == ("precomputed" if variant == "full" else "adapters_off")
    assert before["reward_margin"] == pytest.approx(0.0, abs=1e-4)
    assert after["accuracy"] >= 0.95 and after["mean_logp_accuracy"] >= 0.9, after
    # beta = 0.1: a margin of 0.25 is a log-ratio gap of 2.5 nats between the two replies.
    assert after["reward_margin"] > 0.25 and after["chosen_reward"] > after["rejected_reward"]
    assert after["loss"] < before["loss"] - 0.15
    assert any("before" in line and "after" in line for line in logs)  # the before/after table is printed
    summary = json.load(open(tmp_path / variant / "eval_summary.json"))
    assert summary["after"]["accuracy"] == after["accuracy"]
    eval_lines = [json.loads(l) for l in open(tmp_path / variant / "metrics.jsonl") if "eval/accuracy" in l]
    assert eval_lines and eval_lines[-1]["eval/accuracy"] == after["accuracy"]


# ---------------------------------------------------------------------------------------------- bad input and config


def test_bad_rows_are_skipped_counted_and_reported(files, tmp_path, tok):
    good = synthetic_rows(16, seed=5)
    bad = [
        {"prompt": "hi", "rejected": "no"},                                     # missing chosen
        {"prompt": "hi", "chosen": "yes"},                                      # missing rejected
        {"prompt": "hi", "chosen": "  ", "rejected": "no"},                     # empty response
        {"chosen": "\n\nHuman: hello", "rejected": "\n\nHuman: hello there"},   # dialogue without an assistant turn
        {"prompt": "hi", "chosen": "same", "rejected": "same"},                 # identical: dropped
        "{not json",
    ]
    path = write_jsonl(str(tmp_path / "mixed.jsonl"), good + bad)
    cfg = tiny_cfg(files, str(tmp_path / "run"), **{"data.path": path, "data.max_bad_fraction": 0.5})
    logs = []
    run = prepare(cfg, log=logs.append)
    rep = run.data.report
    assert rep.kept == 16 and len(run.data.train) == 16
    assert rep.skipped == {"missing_field": 2, "empty_response": 1, "no_assistant_turn": 1, "invalid_json": 1}
    assert rep.dropped == {"identical": 1}
    saved = json.load(open(tmp_path / "run" / "data_report.json"))
    assert saved["train"]["skipped"]["missing_field"] == 2 and saved["train"]["dropped"] == {"identical": 1}
    assert "eval" in saved
    text = "\n".join(logs)
    assert "skipped 5" in text and "mixed.jsonl:17: missing_field" in text


def test_over_long_pairs_lose_prompt_tokens_from_the_left(files, tmp_path):
    rows = synthetic_rows(16, seed=2)
    rows[0] = dict(rows[0], prompt="word " * 60 + rows[0]["prompt"])
    path = write_jsonl(str(tmp_path / "long.jsonl"), rows)
    run = prepare(tiny_cfg(files, str(tmp_path / "run"), **{"data.path": path}), log=lambda s: None)
    assert run.data.report.truncated == {"prompt_left": 1}
    assert max(max(len(p.chosen), len(p.rejected)) for p in run.data.train) <= SEQ


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="batch_size"):
        from_dict(DPOConfig, {"train": {"batch_size": 7}})
    with pytest.raises(ConfigError, match="micro"):
        from_dict(DPOConfig, {"train": {"batch_size": 8, "micro_batch_size": 1}})
    with pytest.raises(ConfigError, match="label_smoothing"):
        from_dict(DPOConfig, {"dpo": {"loss": "ipo", "label_smoothing": 0.1}})
    with pytest.raises(ConfigError, match="dpo.loss"):
        from_dict(DPOConfig, {"dpo": {"loss": "kto"}})
    with pytest.raises(ConfigError, match="adapters_off needs LoRA"):
        DPOKnobsConfig(reference="adapters_off").reference_mode(has_adapters=False)
    assert DPOKnobsConfig(loss="orpo", reference="frozen_copy").reference_mode(has_adapters=False) == "none"


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "recipes", "dpo_*.yaml"))))
def test_dpo_recipes_parse_and_say_how_to_run(path):
    cfg = load_config(DPOConfig, path)
    text = open(path).read()
    assert text.startswith("#") and f"tempax dpo --config recipes/{os.path.basename(path)}" in text
    assert cfg.train.batch_size % 2 == 0
