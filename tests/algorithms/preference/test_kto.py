"""KTO training: the stacked (completion, mismatched) batch and its loss, the adapters-off reference, learning a
synthetic preference from unpaired rows on a tiny model, configs, recipe and command."""

from __future__ import annotations

import glob
import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from tempax.algorithms.preference.batches import REF_LOGPS, collate_annotated, jit_sequence_logps
from tempax.algorithms.preference.kto import DESIRABLE, KTOConfig, KTOKnobsConfig, KTOLoss, kto_items, main
from tempax.algorithms.preference.losses import kto_loss
from tempax.configlib import from_dict, load_config
from tempax.data.preference import PreferenceOptions
from tempax.data.unpaired import tokenize_unpaired_rows
from tempax.errors import ConfigError
from tempax.models.lora import LoraConfig, apply_lora
from tests.algorithms.preference.test_dpo import SEQ, SMALL, synthetic_rows, with_changes, write_jsonl
from tests.kit.models import tiny_tempax_model
from tests.kit.tokenizers import tiny_chat_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def unpaired_rows(n: int, seed: int) -> list[dict]:
    """The DPO test's synthetic task as unpaired feedback: replies starting "Sure," are desirable, "No." ones
    not; each pair gives one row of each kind, in separate rows with no pairing left in the file."""
    out = []
    for r in synthetic_rows(n, seed):
        out.append({"prompt": r["prompt"], "completion": r["chosen"], "label": True})
        out.append({"prompt": r["prompt"], "completion": r["rejected"], "label": False})
    return out


@pytest.fixture(scope="module")
def tok():
    return tiny_chat_tokenizer()


@pytest.fixture(scope="module")
def files(tmp_path_factory, tok):
    d = tmp_path_factory.mktemp("kto")
    tok.hf.save_pretrained(str(d / "tok"))
    return {
        "tok": str(d / "tok"),
        "unpaired": write_jsonl(str(d / "unpaired.jsonl"), unpaired_rows(48, seed=0)),
        "pairs": write_jsonl(str(d / "pairs.jsonl"), synthetic_rows(48, seed=0)),
        "test": write_jsonl(str(d / "test.jsonl"), synthetic_rows(24, seed=1)),
    }


def tiny_cfg(files: dict, run_dir: str, **changes) -> KTOConfig:
    cfg = {
        "model": {"source": "preset:tiny-llama", "tokenizer": files["tok"], "overrides": dict(SMALL)},
        "data": {"path": files["unpaired"], "eval_path": files["test"], "convert_pairs": False},
        "kto": {"beta": 0.1},
        "train": {"steps": 24, "batch_size": 16, "seq_len": SEQ, "run_dir": run_dir, "progress_bar": False,
                  "tensorboard": False, "mesh": {"num_devices": 1}, "checkpoint": {"save_at_end": False},
                  "optimizer": {"learning_rate": 1e-2, "schedule": "constant"}},
    }
    with_changes(cfg, changes)
    return from_dict(KTOConfig, cfg)


def kto_batch(tok, n: int = 4):
    examples, _ = tokenize_unpaired_rows(unpaired_rows(n, seed=3), tok, PreferenceOptions(max_length=SEQ))
    return collate_annotated(kto_items(examples), seq_len=SEQ, pad_id=tok.pad_id, batch_size=len(examples) + 2)


def test_batch_rows_are_completions_then_mismatched_with_labels_and_padding(tok):
    """4 synthetic pairs -> 8 unpaired examples, padded to 10: rows 0..9 the completions (labels alternate
    desirable / undesirable), rows 10..19 their mismatched partners; two empty examples pad the end."""
    batch = kto_batch(tok)
    assert batch["tokens"].shape == (20, SEQ)
    np.testing.assert_array_equal(batch[DESIRABLE][:10], [1, 0, 1, 0, 1, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(batch[DESIRABLE][:10], batch[DESIRABLE][10:])
    assert batch["segment_ids"][8:10].max() == 0 and batch["segment_ids"][18:].max() == 0


def test_loss_fn_is_kto_loss_of_the_rows_log_probs(tok):
    """KTOLoss on the stacked batch (its completions and mismatched halves scored in separate passes) equals
    `kto_loss` of the rows' log-probs from one pass over the whole batch, with the padding examples masked out;
    loss_weight counts the 8 real examples."""
    model = tiny_tempax_model("llama", seed=0, **SMALL)
    batch = kto_batch(tok)
    batch[REF_LOGPS] = np.linspace(-30.0, -10.0, 20).astype(np.float32)
    loss_fn = nnx.jit(KTOLoss(beta=0.5, desirable_weight=1.5, reference="batch"))
    loss, metrics = loss_fn(model, {k: jax.numpy.asarray(v) for k, v in batch.items()})
    logps, _ = jit_sequence_logps(model)(batch)
    expected, exp_metrics = kto_loss(logps[:8], batch[REF_LOGPS][:8], logps[10:18], batch[REF_LOGPS][10:18],
                                     batch[DESIRABLE][:8], beta=0.5, desirable_weight=1.5)
    np.testing.assert_allclose(loss, expected, rtol=1e-4)
    np.testing.assert_allclose(metrics["kl"], exp_metrics["kl"], rtol=1e-4, atol=1e-4)
    assert float(metrics["loss_weight"]) == 8.0


def test_adapters_off_reference_is_the_base_so_rewards_start_at_zero(tok):
    """LoRA starts with B = 0, so the policy equals the adapters-off base: every log-ratio is 0, z_0 = 0 and the
    loss is lambda (1 - sigmoid(0)) = 0.5 for every row; the adapters_off path matches a precomputed base pass."""
    model = tiny_tempax_model("llama", seed=0, **SMALL)
    model = apply_lora(model, LoraConfig(rank=4, alpha=8.0), rngs=nnx.Rngs(1)) or model
    batch = {k: jax.numpy.asarray(v) for k, v in kto_batch(tok).items()}
    loss, metrics = nnx.jit(KTOLoss(reference="adapters_off"))(model, batch)
    np.testing.assert_allclose(loss, 0.5, atol=1e-5)
    assert abs(float(metrics["kl"])) < 1e-5 and abs(float(metrics["reward_margin"])) < 1e-5
    batch[REF_LOGPS] = jax.numpy.asarray(jit_sequence_logps(model, adapters_off=True)(batch)[0])
    loss_b, _ = nnx.jit(KTOLoss(reference="batch"))(model, batch)
    np.testing.assert_allclose(loss, loss_b, atol=1e-6)


@pytest.mark.heavy
@pytest.mark.parametrize("rows", ["unpaired", "pairs"])
def test_kto_learns_a_synthetic_preference_from_unpaired_rows(files, tmp_path, rows):
    """Held-out pairs: implicit rewards start at 0 (policy = reference; full weights, reference precomputed) and
    end ranking the chosen reply first in >= 95% of the 24 pairs with a clear margin, though training never saw
    a pair: from unpaired rows, and from pairs split into rows (`convert_pairs`)."""
    changes = {"data.convert_pairs": True, "data.path": files["pairs"]} if rows == "pairs" else {}
    logs = []
    result = main(tiny_cfg(files, str(tmp_path / rows), **changes), log=logs.append)
    before, after = result.extras["eval_before"], result.extras["eval_after"]
    assert result.extras["reference"] == "precomputed"
    assert before["reward_margin"] == pytest.approx(0.0, abs=1e-4)
    assert after["accuracy"] >= 0.95 and after["reward_margin"] > 0.25, after
    history = [m for _, m in result.history]
    assert history[-1]["desirable_reward"] > history[-1]["undesirable_reward"]
    assert all(m["kl"] >= 0.0 for m in history)
    assert any("48 desirable, 48 undesirable" in line for line in logs)
    assert any("before" in line and "after" in line for line in logs)
    summary = json.load(open(tmp_path / rows / "eval_summary.json"))
    assert summary["loss"] == "kto" and summary["after"]["accuracy"] == after["accuracy"]


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="batch_size"):
        from_dict(KTOConfig, {"train": {"batch_size": 7}})
    with pytest.raises(ConfigError, match="kto.beta"):
        from_dict(KTOConfig, {"kto": {"beta": 0.0}})
    with pytest.raises(ConfigError, match="undesirable_weight"):
        from_dict(KTOConfig, {"kto": {"undesirable_weight": -1.0}})
    with pytest.raises(ConfigError, match="eval_fraction"):
        from_dict(KTOConfig, {"data": {"convert_pairs": False, "eval_path": None, "eval_fraction": 0.1}})
    with pytest.raises(ConfigError, match="kto.reference=adapters_off needs LoRA"):
        KTOKnobsConfig(reference="adapters_off").reference_mode(has_adapters=False)
    assert KTOKnobsConfig().reference_mode(has_adapters=True) == "adapters_off"


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "recipes", "kto_*.yaml"))))
def test_kto_recipes_parse_and_say_how_to_run(path):
    cfg = load_config(KTOConfig, path)
    text = open(path).read()
    assert text.startswith("#") and f"tempax kto --config recipes/{os.path.basename(path)}" in text
    assert cfg.train.batch_size % 2 == 0
