"""SFT on the shared training core: packing invariance, memorising a small set, bad data handling."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from numpy.testing import assert_allclose

from tempax.algorithms.common import ModelSourceConfig
from tempax.algorithms.sft.main import SFTConfig, SFTLossConfig, main, make_sft_loss
from tempax.data.sft import SFTDataConfig
from tempax.configlib import from_dict
from tempax.data.packing import collate_rows, plan_packing
from tempax.errors import DataError
from tempax.models.decoder import Decoder
from tempax.models.logprobs import token_logprobs
from tempax.models.presets import PRESETS
from tests.kit.tokenizers import DIALOGUES, tiny_chat_tokenizer
from tests.train.helpers import random_examples


def test_packed_batch_gives_the_same_per_example_losses_as_padded():
    """Five examples packed into fewer rows (segment ids + restarting positions) vs one per row: every example's
    summed next-token NLL is the same, and so is the batch's token-mean loss."""
    examples = random_examples(5, vocab=128, seed=5, min_len=3, max_len=9)
    model = Decoder(PRESETS["tiny-llama"].replace(num_layers=1), rngs=nnx.Rngs(0))
    seq = 16
    plan = plan_packing([len(e) for e in examples], seq)
    assert len(plan) < len(examples)
    packed = collate_rows([[examples[i] for i in row] for row in plan], seq_len=seq, pad_id=0, num_rows=5)
    padded = collate_rows([[e] for e in examples], seq_len=seq, pad_id=0, num_rows=5)

    @jax.jit
    def nll(batch):
        logits, _ = model(batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"])
        return -token_logprobs(logits, batch["targets"]) * batch["loss_mask"], make_sft_loss()(model, batch)[0]

    packed_nll, packed_loss = jax.device_get(nll({k: jnp.asarray(v) for k, v in packed.items()}))
    padded_nll, padded_loss = jax.device_get(nll({k: jnp.asarray(v) for k, v in padded.items()}))
    for r, row in enumerate(plan):
        for seg, i in enumerate(row, start=1):
            in_packed = packed_nll[r][packed["segment_ids"][r] == seg].sum()
            assert_allclose(in_packed, padded_nll[i].sum(), rtol=1e-5, err_msg=f"example {i}")
    assert_allclose(packed_loss, padded_loss, rtol=1e-5)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    tiny_chat_tokenizer().hf.save_pretrained(folder)
    return str(folder)


def _write_rows(path, rows, extra_lines=()):
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return str(path)


def _config(tmp_path, tokenizer_dir, data_path, packing=False, **train):
    raw = {
        "model": {"source": "preset:tiny-llama", "tokenizer": tokenizer_dir,
                  "overrides": {"vocab_size": 400, "num_layers": 2}},
        "data": {"path": data_path, "packing": packing},
        "train": {"steps": 40, "batch_size": 4, "seq_len": 64, "progress_bar": False, "tensorboard": False,
                  "run_dir": str(tmp_path / "run"), "mesh": {"num_devices": 1},
                  "optimizer": {"learning_rate": 1e-2, "schedule": "constant", "weight_decay": 0.0},
                  "checkpoint": {"save_at_end": False}, **train},
    }
    return from_dict(SFTConfig, raw)


@pytest.mark.heavy
def test_short_sft_run_memorises_a_small_set(tmp_path, tokenizer_dir):
    """Four dialogues, 40 full fine-tuning steps of a 2-layer model: the assistant-token loss goes to ~0."""
    data = _write_rows(tmp_path / "train.jsonl", [{"messages": m} for m in DIALOGUES])
    cfg = _config(tmp_path, tokenizer_dir, data, log_every=5)
    result = main(cfg, log=lambda _: None)
    assert result.losses[0] > 3.0
    assert result.losses[-1] < 0.05, result.losses
    assert os.path.isfile(tmp_path / "run" / "config.yaml")
    assert os.path.isdir(tmp_path / "run" / "tokenizer")


def test_broken_rows_are_skipped_and_reported(tmp_path, tokenizer_dir):
    """12 lines: 10 good rows, one that is not JSON, one without messages. Training runs on the 10 and the report
    names the two bad lines (file:line) and their reasons."""
    good = [{"messages": DIALOGUES[i % 4]} for i in range(10)]
    data = _write_rows(tmp_path / "rows.jsonl", good[:5] + [{"prompt_only": "hi"}] + good[5:], ['{"messages": [oops'])
    cfg = _config(tmp_path, tokenizer_dir, data, steps=2)
    cfg = from_dict(SFTConfig, {**__import__("tempax.configlib", fromlist=["to_dict"]).to_dict(cfg),
                                "data": {"path": data, "max_bad_fraction": 0.2, "packing": True}})
    messages = []
    result = main(cfg, log=messages.append)
    report = result.extras["data_report"]
    assert (report.total, report.kept, report.num_skipped) == (12, 10, 2)
    where = {w.rsplit(":", 1)[1]: reason for w, reason, _ in report.bad_rows}
    assert where == {"6": "unknown_format", "12": "invalid_json"}
    assert any("skipped" in m and "rows.jsonl:12" in m for m in messages)
    saved = json.loads((tmp_path / "run" / "data_report.json").read_text())
    assert saved["kept"] == 10 and len(result.losses) == 2


def test_missing_dataset_names_the_path(tmp_path, tokenizer_dir):
    cfg = _config(tmp_path, tokenizer_dir, str(tmp_path / "nope" / "train.jsonl"))
    with pytest.raises(DataError, match=r"nope/train\.jsonl"):
        main(cfg, log=lambda _: None)


def test_sequence_normalisation_weights_examples():
    """normalize='sequences' reports loss_weight = rows with a supervised token (for exact accumulation)."""
    model = Decoder(PRESETS["tiny-llama"].replace(num_layers=1), rngs=nnx.Rngs(0))
    batch = collate_rows([[e] for e in random_examples(3, seed=1)], seq_len=16, pad_id=0, num_rows=4)
    _, metrics = make_sft_loss("sequences")(model, {k: jnp.asarray(v) for k, v in batch.items()})
    assert float(metrics["loss_weight"]) == 3.0
    assert SFTLossConfig().normalize == "tokens" and SFTDataConfig().packing
    assert ModelSourceConfig().source == "smollm2-135m-instruct"


@pytest.mark.slow
def test_qlora_with_bf16_compute_trains_only_adapters(tmp_path, tokenizer_dir):
    """QLoRA (NF4 base) + bf16 compute: only lora_a / lora_b get optimizer state (float32 masters), the loss is
    finite and falls, and the checkpoint holds just the adapters."""
    data = _write_rows(tmp_path / "train.jsonl", [{"messages": m} for m in DIALOGUES])
    cfg = _config(tmp_path, tokenizer_dir, data, steps=3, precision="bf16",
                  checkpoint={"save_at_end": True, "async_save": False})
    from tempax.configlib import to_dict

    cfg = from_dict(SFTConfig, {**to_dict(cfg), "lora": {"rank": 4, "alpha": 8, "quantize_base": "nf4",
                                                          "block_size": 16}})
    result = main(cfg, log=lambda _: None)
    keys = list(result.state.params)
    assert keys and all(k.endswith(("lora_a", "lora_b")) for k in keys)
    assert all(v.dtype == jnp.float32 for v in result.state.params.values())
    assert np.all(np.isfinite(result.losses)) and result.losses[-1] < result.losses[0]
    from tempax.train.checkpoint import Checkpointer

    meta = Checkpointer(tmp_path / "run" / "checkpoints", async_save=False).read_meta()
    assert meta["trainable"] == "adapters" and sorted(meta["keys"]) == sorted(keys)
