"""bench/tpu_tunix.py: Tunix's side of the chip workloads. Its shapes are tempax's presets, its prompts go through
Tunix's sampler as the ids drawn for them, and its tiny form runs every part on a CPU with Tunix's own Python
(.venv-tunix, or TEMPAX_TUNIX_PYTHON), skipped where Tunix is not set up."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from bench import tpu_tunix
from bench.peers import SHARED
from bench.peers_tunix import TUNIX_SETUP, tunix_python

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_shapes_are_tempax_presets():
    """The SFT and decode shapes are tempax's presets of the same names, in Tunix's ModelConfig names."""
    from tempax.models.presets import get_preset

    for name, dims in tpu_tunix.SHAPES.items():
        cfg = get_preset(name)
        assert dims == dict(num_layers=cfg.num_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.hidden_size,
                            hidden_dim=cfg.intermediate_size, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
                            num_kv_heads=cfg.num_kv_heads, rope_theta=int(cfg.rope.theta),
                            norm_eps=cfg.rms_norm_eps), name
    assert cfg.tie_word_embeddings  # shape_config ties them for both shapes


def test_word_ids_reads_back_the_ids_drawn():
    """Text in ("w17 w4032"), the numpy array of texts Tunix's GRPO rollout hands the sampler, and ids already:
    the same ids; decoding leaves out BOS, EOS and PAD."""
    import numpy as np

    words = tpu_tunix.WordIds(vocab_size=100)
    ids = [17, 42, 99]
    assert words.encode(tpu_tunix.ids_text(ids)) == ids
    assert words.encode(np.array([tpu_tunix.ids_text(ids)])) == ids
    assert words.encode(np.array(ids)) == ids
    assert words.decode([tpu_tunix.BOS, 17, tpu_tunix.EOS, tpu_tunix.PAD, 42]) == "w17 w42"
    assert (words.bos_id(), words.eos_id(), words.pad_id()) == (tpu_tunix.BOS, tpu_tunix.EOS, tpu_tunix.PAD)


def test_unknown_part_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        tpu_tunix.main(["--parts", "sft,serve"])
    assert exit_info.value.code == 2 and "unknown serve" in capsys.readouterr().err


@pytest.mark.heavy
def test_tiny_run_of_every_part_with_tunix():
    """Every part at its tiny size on a CPU, with Tunix's Python: one JSON line each, none an error, each with its
    figures, the first step's or call's time and the versions."""
    python = tunix_python()
    if python is None:
        pytest.skip(f"no Tunix environment (.venv-tunix or TEMPAX_TUNIX_PYTHON): `{TUNIX_SETUP}`")
    parts = "sft,decode,grpo" if os.path.isfile(os.path.join(SHARED, "workloads.json")) else "sft,decode"
    done = subprocess.run(
        [python, os.path.join(ROOT, "bench", "tpu_tunix.py"), "--tiny", "--parts", parts, "--steps", "1",
         "--decode-shapes", "smollm2-135m", "--decode-batches", "1,2", "--shared", SHARED],
        capture_output=True, text=True, cwd=ROOT, timeout=900, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert not [r for r in records if "error" in r], records
    expected = [("sft", None), ("decode", 1), ("decode", 2)] + ([("grpo", None)] if "grpo" in parts else [])
    assert [(r["part"], r.get("batch") if r["part"] == "decode" else None) for r in records] == expected
    assert all(r["tunix"] == "0.1.7" and r["jax"] and r["flax"] and r["library"] == "tunix" for r in records)
    sft = records[0]
    assert sft["tokens_per_s"] > 0 and sft["first_step_s"] > 0 and sft["base_dtype"] == "bfloat16"
    assert 0 < sft["trainable"] < sft["params"] and sft["lora_rank"] == 16
    for decode in records[1:3]:
        assert decode["tokens_per_s"] > 0 and decode["first_call_s"] > 0
        assert (decode["prompt_len"], decode["new_tokens"]) == (64, 128)
    if "grpo" in parts:
        grpo = records[-1]
        assert grpo["size"] == "tiny" and grpo["s_per_step"] > 0 and grpo["first_step_s"] > 0
