"""GGUF loading: metadata -> config, tensor names, llama.cpp's edits undone, dequantisation, tokenizer cache.

The files are written here with `gguf.GGUFWriter` the way llama.cpp's `convert_hf_to_gguf.py` writes them:
q/k rows permuted for the llama architecture, Gemma norm weights stored as w + 1, Llama 3 rope scaling as a
`rope_freqs` tensor of per-frequency divisors, 2-D weights quantised with `gguf.quants.quantize`, norms in F32,
and no `output.weight` for tied embeddings. The writer below is written from that description, independently of
`tempax.models.gguf_io` (tensor names and shape keys are `tempax.models.gguf_export`'s, which tests/models/test_gguf_export.py
checks against transformers' reader).
"""

from __future__ import annotations

import math
import os
import time

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tempax.models.fused import fuse_tensors
from tempax.models.gguf_io import (
    _llama3_rope_from_factors,
    gguf_architecture,
    gguf_config,
    llama3_rope_factors,
    load_gguf,
    permute_qk,
    read_gguf_header,
    unpermute_qk,
)
from tempax.models.config import RopeConfig
from tempax.models.gguf_export import _add_hyperparameters, hf_to_gguf_name
from tempax.models.weights import iter_hf_tensors
from tests.kit.models import TINY_FAMILIES, random_ids, tiny_tempax_model

# the tiny families llama.cpp runs (Qwen3.5's linear-attention layers are refused: test_gguf_export.py)
GGUF_FAMILIES = tuple(f for f in TINY_FAMILIES if f not in ("qwen3_5", "gemma4"))

Q = gguf.GGMLQuantizationType

def _llamacpp_rope_factors(rope: RopeConfig, head_dim: int) -> np.ndarray:
    """llama.cpp's converter loop for Llama 3 rope: one divisor per base frequency."""
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / rope.theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        old = rope.original_max_position_embeddings
        if wavelen < old / rope.high_freq_factor:
            out.append(1.0)
        elif wavelen > old / rope.low_freq_factor:
            out.append(rope.factor)
        else:
            smooth = (old / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
            out.append(1 / ((1 - smooth) / rope.factor + smooth))
    return np.asarray(out, np.float32)


def write_gguf(path: str, model, *, qtype: str = "F32", tokenizer=None, pre: str = "default") -> str:
    """Writes a tempax model as llama.cpp would convert its Hugging Face checkpoint (see the module docstring).

    `tokenizer`: a `Tokenizer` (written as a byte-level "gpt2" vocabulary, `pre` naming its split pattern) or a
    dict of tokenizer metadata (`tests.kit.tokenizers.tiny_sentencepiece_metadata()`), or None for no tokenizer.
    """
    cfg = model.config
    arch = gguf_architecture(cfg)  # OLMo 3 is llama.cpp's olmo2
    w = gguf.GGUFWriter(path, arch)
    _add_hyperparameters(w, cfg)  # the exporter's shape keys; the attention scale llama.cpp ignores is added here
    if cfg.query_pre_attn_scalar:
        w.add_attention_scale(cfg.query_pre_attn_scalar ** -0.5)
    if isinstance(tokenizer, dict):
        _add_metadata(w, tokenizer)
    elif tokenizer is not None:
        _add_tokenizer(w, tokenizer, pre)
    if cfg.rope.scaling == "llama3":
        w.add_tensor("rope_freqs.weight", _llamacpp_rope_factors(cfg.rope, cfg.head_dim))
    for hf_name, array in fuse_tensors(iter_hf_tensors(model), cfg):  # Phi-3's converter keeps its fused tensors
        array = np.asarray(array, np.float32)
        if arch in ("llama", "smollm3") and ".q_proj." in hf_name:  # Llama's converter, which SmolLM3's extends
            array = permute_qk(array, cfg.num_heads)
        if arch in ("llama", "smollm3") and ".k_proj." in hf_name:
            array = permute_qk(array, cfg.num_kv_heads)
        if arch.startswith("gemma") and hf_name.endswith("norm.weight"):
            array = array + 1.0
        name = hf_to_gguf_name(hf_name, cfg)
        if array.ndim == 2 and qtype != "F32":
            w.add_tensor(name, gguf.quants.quantize(array, Q[qtype]), raw_dtype=Q[qtype])
        else:
            w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_metadata(w: gguf.GGUFWriter, metadata: dict) -> None:
    """Key/value metadata as the writer's typed fields (strings, bools, ints, floats and lists of them)."""
    for key, value in metadata.items():
        if isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_string(key, value)


def _add_tokenizer(w: gguf.GGUFWriter, tok, pre: str) -> None:
    """A byte-level BPE tokenizer in llama.cpp's "gpt2" layout: token strings, merges, types, special ids."""
    import json

    hf = tok.hf
    vocab = hf.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = json.loads(hf.backend_tokenizer.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    special = set(hf.all_special_ids)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    w.add_token_merges(merges)
    w.add_bos_token_id(hf.bos_token_id)
    w.add_eos_token_id(hf.eos_token_id)
    w.add_pad_token_id(hf.pad_token_id)
    w.add_add_bos_token(False)
    if hf.chat_template:
        w.add_chat_template(hf.chat_template)


def perturbed_model(family: str, seed: int = 0, **changes):
    """A tiny model whose every weight (norms included) is moved off its init, so each tensor matters."""
    model = tiny_tempax_model(family, **changes)
    rng = np.random.RandomState(seed)
    for _, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Param):
            value = np.asarray(var[...])
            var.set_value(jnp.asarray(value + 0.05 * rng.standard_normal(value.shape).astype(np.float32)))
    return model


def _params(model) -> dict[str, np.ndarray]:
    return dict(iter_hf_tensors(model))


def _logits(model, ids) -> np.ndarray:
    return np.asarray(model(jnp.asarray(ids))[0])


# ------------------------------------------------------------------------------------------------------------
def test_unpermute_hand_example():
    """llama.cpp turns rotate-half row order into interleaved pairs per head.

    One head of dim 4, rows r0..r3: rotate-half pairs are (r0, r2) and (r1, r3); llama.cpp stores them adjacent,
    [r0, r2, r1, r3]. Two heads of dim 4 (rows 0..7): [0, 2, 1, 3, 4, 6, 5, 7]. `unpermute_qk` restores the order.
    """
    rows = np.arange(4.0)[:, None]
    np.testing.assert_array_equal(permute_qk(rows, 1)[:, 0], [0, 2, 1, 3])
    np.testing.assert_array_equal(permute_qk(np.arange(8.0), 2), [0, 2, 1, 3, 4, 6, 5, 7])
    np.testing.assert_array_equal(unpermute_qk(np.array([0.0, 2, 1, 3, 4, 6, 5, 7]), 2), np.arange(8.0))
    w = np.random.RandomState(0).standard_normal((3 * 16, 5))
    np.testing.assert_array_equal(unpermute_qk(permute_qk(w, 3), 3), w)


def test_header_parser_agrees_with_gguf_reader(tmp_path):
    """Our struct-based header parser reads the same metadata and tensor layout as `gguf.GGUFReader`."""
    path = write_gguf(str(tmp_path / "m.gguf"), perturbed_model("llama"), qtype="Q4_1")
    ours = read_gguf_header(path)
    ref = gguf.GGUFReader(path)
    assert ours.architecture == "llama"
    for key, f in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        value = f.contents()
        got = ours.metadata[key]
        if isinstance(value, float):
            assert got == pytest.approx(value)
        else:
            assert got == value, key
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert info.ggml_type == t.tensor_type and info.offset == t.data_offset and info.nbytes == t.n_bytes
        assert info.shape == tuple(reversed(t.shape.tolist()))


@pytest.mark.parametrize("family", GGUF_FAMILIES)
def test_metadata_gives_config(tmp_path, family):
    """GGUF metadata + tensor names rebuild the model's config (llama's rope from its rope_freqs divisors)."""
    model = perturbed_model(family)
    cfg = model.config
    got = gguf_config(write_gguf(str(tmp_path / f"{family}.gguf"), model))
    # Metadata floats are float32: 1e-6 comes back as 9.99999997e-07.
    assert got.rms_norm_eps == pytest.approx(cfg.rms_norm_eps, rel=1e-6)
    if cfg.rope.scaling == "llama3":
        np.testing.assert_allclose(llama3_rope_factors(got.rope, cfg.head_dim),
                                   llama3_rope_factors(cfg.rope, cfg.head_dim), rtol=1e-6)
        got = got.replace(rope=cfg.rope)
    if cfg.query_pre_attn_scalar:
        assert got.query_pre_attn_scalar == pytest.approx(cfg.query_pre_attn_scalar, rel=1e-5)
        got = got.replace(query_pre_attn_scalar=cfg.query_pre_attn_scalar)
    assert got.replace(rms_norm_eps=cfg.rms_norm_eps) == cfg


@pytest.mark.parametrize("family", GGUF_FAMILIES)
def test_f32_file_loads_exact_weights(tmp_path, family):
    """F32 GGUF -> every weight bit-identical (permutation and Gemma's +1 undone), same logits."""
    model = perturbed_model(family)
    loaded = load_gguf(write_gguf(str(tmp_path / f"{family}.gguf"), model))
    want = _params(model)
    got = _params(loaded)
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=2e-7 if "norm" in name else 0, err_msg=name)
    ids = random_ids((2, 9))
    np.testing.assert_allclose(_logits(loaded, ids), _logits(model, ids), atol=1e-5, rtol=0)


# max |dequantised - original| as a fraction of the tensor's max |w| (per-block scale d, rounded to float16):
#   F16: relative rounding 2^-11.  BF16: 2^-9 (round to nearest), so 4e-3 is loose.
#   Q8_0: d = amax/127, error <= d/2 + 127 * d * 2^-11 < 0.57 d.
#   Q5_0 / Q4_0: d = amax/16 or amax/8 and the top code is clipped, error <= d (+ float16 rounding of d).
#   Q5_1 / Q4_1: d = (max - min)/31 or /15 <= 2 amax/31 or 2 amax/15, error <= d/2, plus float16 rounding of min.
_QUANT_BOUNDS = {"F16": 1e-3, "BF16": 4e-3, "Q8_0": 0.6 / 127, "Q5_0": 1.01 / 16, "Q5_1": 0.6 * 2 / 31 + 1e-3,
                 "Q4_0": 1.01 / 8, "Q4_1": 0.6 * 2 / 15 + 1e-3}
# Max |logit difference| against the float32 model, as a fraction of max |logit| (a sanity bound; the exact
# weight check above is the real test). Measured: F16 6.5e-4, BF16 5.8e-3, Q8_0 2.8e-2, Q5_0 0.16, Q5_1 0.21,
# Q4_0 0.33, Q4_1 0.37. They are large for 4/5 bits because this random tiny model's logits are small (max ~1.4)
# and every one of its weights is noise, so quantisation noise is a big share of the signal.
_LOGIT_BOUNDS = {"F16": 1e-3, "BF16": 1e-2, "Q8_0": 4e-2, "Q5_0": 0.25, "Q5_1": 0.3, "Q4_0": 0.5, "Q4_1": 0.5}


@pytest.mark.parametrize("qtype", list(_QUANT_BOUNDS))
def test_quantised_file_loads_dequantised_weights(tmp_path, qtype):
    """Each weight equals gguf's own dequantise(quantise(w)) exactly, and is within the format's error of w."""
    model = perturbed_model("llama")
    loaded = load_gguf(write_gguf(str(tmp_path / f"{qtype}.gguf"), model, qtype=qtype))
    want, got = _params(model), _params(loaded)
    for name, w in want.items():
        if w.ndim == 2:
            # Blocks run along rows, so quantising the permuted q/k rows equals permuting the quantised rows.
            expected = gguf.quants.dequantize(gguf.quants.quantize(w, Q[qtype]), Q[qtype])
            if qtype == "F16":
                expected = w.astype(np.float16).astype(np.float32)
            np.testing.assert_array_equal(got[name], expected, err_msg=name)
            assert np.abs(got[name] - w).max() <= _QUANT_BOUNDS[qtype] * np.abs(w).max(), name
        else:
            np.testing.assert_array_equal(got[name], w, err_msg=name)  # norms stay F32
    ids = random_ids((2, 9))
    ref = _logits(model, ids)
    assert np.abs(_logits(loaded, ids) - ref).max() <= _LOGIT_BOUNDS[qtype] * np.abs(ref).max()


@pytest.mark.parametrize(
    "rope",
    [
        RopeConfig(theta=500000.0, scaling="llama3", factor=8.0, original_max_position_embeddings=8192),  # 3.1
        RopeConfig(theta=500000.0, scaling="llama3", factor=32.0, original_max_position_embeddings=8192),  # 3.2
    ],
)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_llama3_rope_recovered_from_rope_freqs(rope, head_dim):
    """Llama 3.1/3.2 band scaling (low 1, high 4, L 8192) is recovered from llama.cpp's divisors."""
    got = _llama3_rope_from_factors(_llamacpp_rope_factors(rope, head_dim).astype(np.float64), theta=rope.theta,
                                    head_dim=head_dim, source="test")
    assert got.scaling == "llama3" and got.factor == pytest.approx(rope.factor, rel=1e-6)
    assert got.original_max_position_embeddings == 8192
    assert got.low_freq_factor == pytest.approx(1.0, rel=1e-3)
    assert got.high_freq_factor == pytest.approx(4.0, rel=1e-3)


def test_unscaled_rope_freqs_mean_no_scaling():
    got = _llama3_rope_from_factors(np.ones(32), theta=1e4, head_dim=64, source="test")
    assert got == RopeConfig(theta=1e4)


def test_gguf_tokenizer_is_cached(tmp_path, monkeypatch):
    """The first load builds the tokenizer from the file's metadata and saves it under $TEMPAX_CACHE; the second
    reads that folder and does not open the vocabulary again."""
    import tempax.models.gguf_tokenizer as gguf_tokenizer
    from tempax.models.tokenizer import gguf_tokenizer_cache_dir, load_tokenizer
    from tests.kit.tokenizers import tiny_chat_tokenizer

    monkeypatch.setenv("TEMPAX_CACHE", str(tmp_path / "cache"))
    tok = tiny_chat_tokenizer()
    model = perturbed_model("llama", vocab_size=tok.vocab_size)
    path = write_gguf(str(tmp_path / "tok.gguf"), model, tokenizer=tok)
    calls = []
    original = gguf_tokenizer.gguf_file_tokenizer

    def spy(source):
        calls.append(os.path.basename(source))
        return original(source)

    monkeypatch.setattr(gguf_tokenizer, "gguf_file_tokenizer", spy)
    first = load_tokenizer(path)
    assert calls == ["tok.gguf"]
    assert os.path.isfile(os.path.join(gguf_tokenizer_cache_dir(path), "tokenizer.json"))
    second = load_tokenizer(path)
    assert calls == ["tok.gguf"]  # the cached folder, not the GGUF
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    for t in (first, second):
        assert t.encode("The quick brown fox.") == tok.encode("The quick brown fox.")
        assert t.apply_chat_template(messages, add_generation_prompt=True, tokenize=True) == \
            tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        assert t.stop_ids == tok.stop_ids
    # A rewritten file (new size and mtime) gets a fresh cache entry.
    before = gguf_tokenizer_cache_dir(path)
    time.sleep(0.01)
    write_gguf(path, perturbed_model("llama", vocab_size=tok.vocab_size, num_layers=2), tokenizer=tok)
    assert gguf_tokenizer_cache_dir(path) != before
