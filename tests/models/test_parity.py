"""tempax logits equal transformers logits (float32, max abs diff < 1e-4) for a tiny model of every family, the
mixture-of-experts ones (Qwen3-MoE, Mixtral, gpt-oss) included."""

import numpy as np
import jax.numpy as jnp
import pytest

torch = pytest.importorskip("torch")

from tempax.models.cache import KVCache  # noqa: E402
from tests.kit.models import (HEAVY_FAMILIES, TINY_FAMILIES, TINY_MOE_FAMILIES, family_cases,  # noqa: E402
                              hf_reference_pair, random_ids)

from flax import nnx  # noqa: E402

TOL = 1e-4
pytestmark = pytest.mark.needs_torch


@nnx.jit
def _forward(model, ids, segment_ids):
    return model(ids, segment_ids=segment_ids)[0]


@nnx.jit
def _cached_forward(model, ids, segment_ids, cache):
    return model(ids, segment_ids=segment_ids, cache=cache)


def _seg(ids):
    return jnp.ones(ids.shape, jnp.int32)


@pytest.fixture(scope="module", params=family_cases(TINY_FAMILIES + TINY_MOE_FAMILIES))
def pair(request):
    return request.param, *hf_reference_pair(request.param)


# Every family's logits are checked against transformers (`test_logits_match`). The padding, packing and cache checks
# differ between families only through what depends on a token's position or on which keys it sees: the rope
# (Llama 3's, linear with a local rope, YaRN, partial, none in some layers), sliding windows, attention sinks and
# soft-caps. Norms, biases, activations and experts act on each token alone, the same in every layout, so the default
# suite runs these checks on one family per position-dependent feature: llama (Llama 3 rope), gemma2 (soft-caps and
# a window), gemma3 (sliding and full layers with a local rope), mixtral (experts, every layer sliding), gpt_oss
# (sinks, YaRN, experts), smollm3 (layers without rope), olmo3 (sliding, norms after attention), phi3 (partial
# rotary), qwen3_5 (linear-attention layers: a state carried along the sequence, reset between packed
# documents and kept in the cache) and gemma4 (a proportional rope on full layers of their own attention shape,
# layers attending to an earlier layer's keys and values, per-layer inputs); the others (qwen2, qwen3, gemma,
# qwen3_moe, olmo2, qwen3_5_moe: a plain rope over full attention, which smollm3 and olmo3's full layers run too,
# or qwen3_5's layers with experts) under -m slow.
_POSITION_REPRESENTATIVES = ("llama", "gemma2", "gemma3", "mixtral", "gpt_oss", "smollm3", "olmo3", "phi3",
                            "qwen3_5", "gemma4")
by_position_feature = pytest.mark.parametrize("pair", [
    pytest.param(family, marks=(pytest.mark.heavy if family in HEAVY_FAMILIES else ()) if family in _POSITION_REPRESENTATIVES
                 else pytest.mark.slow)
    for family in TINY_FAMILIES + TINY_MOE_FAMILIES
], indirect=True)


def _ref_logits(ref, ids, attention_mask=None):
    with torch.no_grad():
        kw = {} if attention_mask is None else {"attention_mask": torch.tensor(attention_mask)}
        return ref(torch.tensor(ids, dtype=torch.long), **kw).logits.numpy()


def test_logits_match(pair):
    family, ref, model = pair
    ids = random_ids((2, 13))  # longer than the tiny sliding window (4): windows are exercised
    out = _forward(model, jnp.asarray(ids), _seg(ids))
    np.testing.assert_allclose(np.asarray(out), _ref_logits(ref, ids), atol=TOL, rtol=0)


@by_position_feature
def test_left_padded_batch_matches(pair):
    """Row 0 is left-padded by 5; its real tokens get positions 0.. and the same logits as transformers."""
    family, ref, model = pair
    ids = random_ids((2, 12), seed=1)
    mask = np.ones_like(ids)
    mask[0, :5] = 0
    ids[0, :5] = 0
    expected = _ref_logits(ref, ids, mask)
    out = _forward(model, jnp.asarray(ids), jnp.asarray(mask))
    out = np.asarray(out)
    np.testing.assert_allclose(out[mask == 1], expected[mask == 1], atol=TOL, rtol=0)
    # And the padded row's real tokens equal the unpadded prompt alone.
    alone = _forward(model, jnp.asarray(ids[:1, 5:]), _seg(ids[:1, 5:]))
    np.testing.assert_allclose(out[0, 5:], np.asarray(alone)[0], atol=TOL, rtol=0)


@by_position_feature
def test_packed_segments_match_unpacked(pair):
    """Three examples packed into one row give each example's own logits: no attention across segments."""
    family, ref, model = pair
    lengths = [5, 3, 6]
    examples = [random_ids((1, n), seed=10 + i)[0] for i, n in enumerate(lengths)]
    packed = np.concatenate(examples + [np.zeros(2, np.int32)])[None]
    segments = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)] + [np.zeros(2, int)])[None]
    out = _forward(model, jnp.asarray(packed), jnp.asarray(segments, jnp.int32))
    out = np.asarray(out)[0]
    start = 0
    for ex in examples:
        expected = _ref_logits(ref, ex[None])[0]
        np.testing.assert_allclose(out[start:start + len(ex)], expected, atol=TOL, rtol=0)
        start += len(ex)


@by_position_feature
def test_kv_cache_decoding_matches_full_forward(pair):
    """Prefill 4 tokens of a left-padded batch, then feed 7 tokens one by one through the cache."""
    family, ref, model = pair
    ids = random_ids((2, 11), seed=3)
    mask = np.ones_like(ids)
    mask[1, :2] = 0
    ids[1, :2] = 0
    expected = _ref_logits(ref, ids, mask)
    cache = KVCache.init(model.config, batch_size=2, max_len=16)
    logits, cache = _cached_forward(model, jnp.asarray(ids[:, :4]), jnp.asarray(mask[:, :4]), cache)
    steps = [np.asarray(logits)]
    for t in range(4, 11):
        logits, cache = _cached_forward(model, jnp.asarray(ids[:, t:t + 1]), jnp.asarray(mask[:, t:t + 1]), cache)
        steps.append(np.asarray(logits))
    got = np.concatenate(steps, axis=1)
    np.testing.assert_allclose(got[mask == 1], expected[mask == 1], atol=TOL, rtol=0)


@by_position_feature
def test_a_prefill_into_a_fresh_cache_reads_only_the_keys_it_wrote(pair):
    """`fresh_cache=True` (the engine's prefill) attends to the 4 keys just written instead of the 64-slot buffer
    with its empty slots masked: the same logits and the same cached keys and values at the real tokens as the
    full-buffer prefill, and decoding from it gives transformers' logits."""
    family, ref, model = pair
    ids = random_ids((2, 6), seed=5)
    mask = np.ones_like(ids)
    mask[1, :2] = 0
    ids[1, :2] = 0
    expected = _ref_logits(ref, ids, mask)
    prompt, prompt_mask = jnp.asarray(ids[:, :4]), jnp.asarray(mask[:, :4])
    fresh_logits, fresh = model(prompt, segment_ids=prompt_mask, cache=KVCache.init(model.config, 2, 64),
                                fresh_cache=True)
    full_logits, full = model(prompt, segment_ids=prompt_mask, cache=KVCache.init(model.config, 2, 64))
    real = mask[:, :4] == 1  # a padding query attends to other padding either way; nothing reads its output
    # rtol 2e-6: the two prefills are two programs whose layer scans XLA fuses differently (a softmax over 4 keys
    # or over 64 with 60 masked), so float32 sums round differently: seen 1.2e-6 relative on a logit of 1.24, and
    # on the cached values of a later layer of tiny-qwen3-moe 1.2e-6 relative on 0.82 (its experts' products add
    # their own rounding between the layers). atol 2e-6 on the cache: OLMo 2/3 RMS-normalise each layer's attention
    # output itself (post-norms), which scales that rounding up by 1 / RMS of a small output: seen 1.26e-6 absolute
    # on a later layer's key of 0.1 (tiny-olmo3), where every pre-norm family stays under 1e-6. Gemma 4 adds its value
    # norms and per-layer-input norms, which scale the rounding up the same way: atol 2e-6 on its logits too.
    logits_atol = 2e-6 if family == "gemma4" else 1e-6
    np.testing.assert_allclose(np.asarray(fresh_logits)[real], np.asarray(full_logits)[real], atol=logits_atol,
                               rtol=2e-6)
    for a, b in zip((*fresh.k, *fresh.v), (*full.k, *full.v)):  # [B, K, S, H]: the real tokens' slots
        np.testing.assert_allclose(np.asarray(a)[:, :, :4].swapaxes(1, 2)[real],
                                   np.asarray(b)[:, :, :4].swapaxes(1, 2)[real], atol=2e-6, rtol=2e-6)
    steps, cache = [np.asarray(fresh_logits)], fresh
    for t in (4, 5):
        logits, cache = model(jnp.asarray(ids[:, t:t + 1]), segment_ids=jnp.asarray(mask[:, t:t + 1]), cache=cache)
        steps.append(np.asarray(logits))
    got = np.concatenate(steps, axis=1)
    np.testing.assert_allclose(got[mask == 1], expected[mask == 1], atol=TOL, rtol=0)




def _variant(name: str):
    """What published checkpoints add to the tiny presets. "olmo3-yarn": Olmo 3 scales the rope of its
    full-attention layers (YaRN: factor 8 over an original context of 32, attention factor 1.2) and leaves the
    sliding layers' unscaled. "phi3-window": Phi-3-mini-4k windows every layer. "phi3-longrope": Phi-3.5 /
    Phi-4-mini's LongRoPE (short and long divisors for tiny-phi3's 6 rotated pairs, original context 32 of 128)."""
    from tempax.models.config import RopeConfig
    from tests.kit.models import tiny_config

    if name == "olmo3-yarn":
        return tiny_config("olmo3").replace(rope=RopeConfig(theta=5e5, scaling="yarn", factor=8.0,
                                                            original_max_position_embeddings=32, attention_factor=1.2))
    if name == "phi3-window":
        return tiny_config("phi3").replace(sliding_window=4, layer_types=("sliding",) * 3)
    return tiny_config("phi3").replace(max_position_embeddings=128, rope=RopeConfig(
        theta=1e4, scaling="longrope", factor=4.0, original_max_position_embeddings=32,
        short_factor=(1.0, 1.05, 1.1, 1.3, 1.6, 2.0), long_factor=(1.5, 2.0, 3.0, 4.5, 6.0, 8.0)))


def _variant_pair(name: str, folder: str):
    """(transformers model, tempax model) of `_variant(name)`: saved by transformers with random weights, loaded by
    tempax."""
    import transformers

    from tempax.models.hf_io import load_hf_checkpoint

    cfg = _variant(name)
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg.to_hf_config()))
    ref.eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ref.save_pretrained(folder)
    model = load_hf_checkpoint(folder)
    assert model.config == cfg
    return ref, model


@pytest.mark.parametrize("name", ["olmo3-yarn", "phi3-window", "phi3-longrope"])
def test_what_the_published_checkpoints_add_to_the_tiny_presets(tmp_path, name):
    """`_variant`'s config reads back unchanged from transformers' save, and 12 tokens (within the original context
    of 32: LongRoPE's short factors) and 40 (past it and past the window of 4) give transformers' logits."""
    ref, model = _variant_pair(name, str(tmp_path))
    for length in (12, 40):
        ids = random_ids((2, length), seed=7)
        out = _forward(model, jnp.asarray(ids), _seg(ids))
        np.testing.assert_allclose(np.asarray(out), _ref_logits(ref, ids), atol=TOL, rtol=0)


@pytest.mark.heavy
def test_longrope_switches_factors_when_decoding_passes_the_original_context(tmp_path):
    """transformers picks LongRoPE's factors per forward pass from its largest position: a prefill of 20 tokens and
    decode steps to 40 switch to the long factors at the step whose position is 32 (keys cached before stay as they
    were rotated). tempax's cached decoding gives the same logits at every step."""
    ref, model = _variant_pair("phi3-longrope", str(tmp_path))
    ids = random_ids((1, 40), seed=9)
    with torch.no_grad():
        out = ref(torch.tensor(ids[:, :20], dtype=torch.long), use_cache=True)
        expected = [out.logits.numpy()]
        for t in range(20, 40):
            out = ref(torch.tensor(ids[:, t:t + 1], dtype=torch.long), cache=out.cache, use_cache=True)
            expected.append(out.logits.numpy())
    logits, cache = _cached_forward(model, jnp.asarray(ids[:, :20]), _seg(ids[:, :20]),
                                    KVCache.init(model.config, 1, 48))
    got = [np.asarray(logits)]
    for t in range(20, 40):
        logits, cache = _cached_forward(model, jnp.asarray(ids[:, t:t + 1]), _seg(ids[:, t:t + 1]), cache)
        got.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(got, 1), np.concatenate(expected, 1), atol=TOL, rtol=0)
