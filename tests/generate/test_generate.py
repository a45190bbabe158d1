"""The sampler's invariants on a tiny model: cache == full recompute, log-probs, batching, groups, stops, errors."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from numpy.testing import assert_allclose, assert_array_equal

from tempax.errors import GenerationError
from tempax.generate import SamplingConfig, bucket_length, compile_counts, generate, generation, stream
from tests.generate.conftest import peaked_tiny_model
from tests.kit.models import random_ids

# Token-id prompts of mixed lengths (ids >= 3: no special tokens). Tests share these shapes and two sampler
# variants (greedy; temperature + top-k + top-p) so that the whole file compiles only a handful of executables.
PROMPTS = [random_ids((n,), vocab=397, seed=n).tolist() for n in (5, 14, 3)]
PROMPTS = [[t + 3 for t in p] for p in PROMPTS]
GREEDY = SamplingConfig(max_new_tokens=12, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingConfig(max_new_tokens=12, temperature=0.8, top_k=50, top_p=0.9, seed=3, ignore_eos=True)
FULL_LEN = 32


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, ids):
    return nnx.merge(graphdef, state)(ids)[0][0]


def _full_logits(model, prompt, completion):
    """Logits of one plain forward pass (no cache) over prompt + completion: [len(prompt) + T, V].

    Right-padded to FULL_LEN so one executable serves every call; causal attention means the padding cannot
    change earlier positions."""
    ids = list(prompt) + list(completion)
    padded = jnp.asarray([ids + [0] * (FULL_LEN - len(ids))], jnp.int32)
    return np.asarray(_forward(*nnx.split(model), padded))[: len(ids)]


def test_cached_decoding_equals_full_recompute(model):
    """Greedy: each generated token is the argmax of a full forward pass over everything before it.

    One causal forward pass over prompt + completion gives, at position len(prompt) - 1 + t, exactly the logits a
    recompute-from-scratch of step t would see, so one pass checks every step. The reported log-probs equal
    log_softmax of those logits at the chosen tokens."""
    result = generate(model, None, PROMPTS, GREEDY)
    for r, prompt in enumerate(PROMPTS):
        tokens = result.token_ids[r]
        logits = _full_logits(model, prompt, tokens)[len(prompt) - 1: len(prompt) - 1 + len(tokens)]
        assert_array_equal(tokens, logits.argmax(-1))
        expected = np.asarray(jax.nn.log_softmax(logits, -1))[np.arange(len(tokens)), tokens]
        assert_allclose(result.logprobs[r], expected, atol=1e-4)
        assert_allclose(result.raw_logprobs[r], expected, atol=1e-4)


def test_sampled_logprobs_equal_log_softmax_of_full_pass(model):
    """Sampling at tau = 0.8 (top-k 50, top-p 0.9): logprobs = log_softmax(z / 0.8)[y] and raw_logprobs =
    log_softmax(z)[y] of a full forward pass, untruncated, at every generated position of every row."""
    result = generate(model, None, PROMPTS, SAMPLED)
    assert result.token_ids.shape == (3, 12) and result.mask.sum() == 3 * 12
    for r in range(3):
        prompt = PROMPTS[result.prompt_index[r]]
        tokens = result.token_ids[r]
        z = _full_logits(model, prompt, tokens)[len(prompt) - 1: len(prompt) - 1 + len(tokens)]
        pick = lambda lp: np.asarray(lp)[np.arange(len(tokens)), tokens]
        assert_allclose(result.logprobs[r], pick(jax.nn.log_softmax(z / 0.8, -1)), atol=1e-4)
        assert_allclose(result.raw_logprobs[r], pick(jax.nn.log_softmax(z, -1)), atol=1e-4)


@pytest.mark.parametrize("config", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_mixed_length_batch_equals_each_prompt_alone(model, config):
    """A batch of left-padded prompts of lengths 5, 14, 3 gives each prompt the tokens it gets alone (prompt_offset keeps
    its random stream)."""
    batch = generate(model, None, PROMPTS, config)
    for i, prompt in enumerate(PROMPTS):
        alone = generate(model, None, [prompt], config, prompt_offset=i)
        assert_array_equal(batch.token_ids[i], alone.token_ids[0])
        assert_allclose(batch.logprobs[i], alone.logprobs[0], atol=1e-5)


@pytest.mark.heavy
def test_rows_with_their_own_knobs_equal_each_request_alone(model):
    """One DecodeRun over three separate requests (greedy for 12 tokens; tau 0.8 + top-p 0.9 for 7; tau 1 + top-p
    0.95 + min-p 0.05 for 12, another seed): each row's tokens, length and log-probs are what its request gives
    alone, and the 7-token row stops at 7 while the others run on."""
    from tempax.generate.engine import DecodeRun

    own = [GREEDY, SAMPLED.replace(top_k=0, max_new_tokens=7), SAMPLED.replace(top_k=0, temperature=1.0, top_p=0.95,
                                                                             min_p=0.05, seed=9)]
    run = DecodeRun(model, PROMPTS, SAMPLED.replace(top_k=0), stop_ids=(), pad_id=0, prompt_configs=own)
    run.advance()
    out = run.output()
    assert out.lengths.tolist() == [12, 7, 12]
    for i, (prompt, config) in enumerate(zip(PROMPTS, own)):
        alone = generate(model, None, [prompt], config)
        n = config.max_new_tokens
        assert_array_equal(out.tokens[i, :n], alone.token_ids[0, :n])
        assert_allclose(out.logprobs[i, :n], alone.logprobs[0, :n], atol=1e-5)
        assert_allclose(out.raw_logprobs[i, :n], alone.raw_logprobs[0, :n], atol=1e-5)


def test_group_with_one_prefill_equals_independent_runs(model):
    """n = 2 samples of 2 prompts from one prefill each equal 4 separate n = 1 runs with the same seed, placed at
    their (prompt, sample) grid position; all 4 differ."""
    config = SAMPLED.replace(temperature=1.0, n=2)
    group = generate(model, None, PROMPTS[:2], config)
    assert group.prompt_index.tolist() == [0, 0, 1, 1]
    for i in range(2):
        for j in range(2):
            one = generate(model, None, [PROMPTS[i]], config.replace(n=1), prompt_offset=i, sample_offset=j)
            assert_array_equal(group.token_ids[i * 2 + j], one.token_ids[0])
            assert_allclose(group.logprobs[i * 2 + j], one.logprobs[0], atol=1e-5)
    assert len({tuple(t) for t in group.token_ids}) == 4


def test_same_seed_same_samples_other_seed_other_samples(model):
    a = generate(model, None, PROMPTS, SAMPLED)
    b = generate(model, None, PROMPTS, SAMPLED)
    c = generate(model, None, PROMPTS, SAMPLED.replace(seed=4))
    assert_array_equal(a.token_ids, b.token_ids)
    assert not np.array_equal(a.token_ids, c.token_ids)


def test_stop_token_ends_row_and_loop_exits_early(model):
    """Stopping on the 4th greedy token: the row keeps 4 tokens (stop token included in ids and mask, not in the
    text), the rest is padding, and the loop stops after 4 steps instead of 12."""
    free = generate(model, None, [PROMPTS[0]], GREEDY)
    tokens = free.token_ids[0].tolist()
    k = next(i for i in range(1, 12) if tokens[i] not in tokens[:i])  # first token not seen before
    config = GREEDY.replace(ignore_eos=False, stop_token_ids=(tokens[k],))
    out = generate(model, None, [PROMPTS[0]], config)
    assert out.lengths.tolist() == [k + 1]
    assert out.finish_reasons == ["stop_token"]
    assert out.token_ids[0, : k + 1].tolist() == tokens[: k + 1]
    assert out.mask[0].tolist() == [1] * (k + 1) + [0] * (11 - k)
    assert out.stats.steps == k + 1
    assert free.finish_reasons == ["length"]


def test_stop_strings_cut_text_exactly(model, tokenizer, monkeypatch):
    """Greedy text T without stops; with stop = [s] for a substring s first found at index q, the text is T[:q]
    and the kept tokens are the shortest prefix whose text contains s (at q). Stop strings are checked every 4
    tokens here, so the row is stopped mid-way by a host check."""
    monkeypatch.setattr(generation, "STOP_CHECK_EVERY", 4)
    config = GREEDY.replace(max_new_tokens=16)
    prompt = "The quick brown fox"
    free = generate(model, tokenizer, [prompt], config)
    text = free.texts[0]
    clean = [i for i in range(5, len(text) - 2) if "\ufffd" not in text[i:i + 2] and text[i:i + 2].strip()]
    assert clean, f"greedy text has no usable substring: {text!r}"
    s = text[clean[len(clean) // 2]: clean[len(clean) // 2] + 2]
    q = text.find(s)
    cut = generate(model, tokenizer, [prompt], config.replace(stop=("never appears \u2603", s)))
    assert cut.texts[0] == text[:q]
    assert cut.finish_reasons == ["stop_string"]
    kept = int(cut.lengths[0])
    ids = free.token_ids[0]
    assert cut.token_ids[0, :kept].tolist() == ids[:kept].tolist()
    assert tokenizer.decode(ids[:kept]).find(s) == q and s not in tokenizer.decode(ids[: kept - 1])
    assert cut.mask[0].sum() == kept and (cut.token_ids[0, kept:] == tokenizer.pad_id).all()
    assert cut.stats.steps < 16 or kept > 12  # the host check ended the loop early


def test_stream_pieces_join_to_generated_text(model, tokenizer):
    config = SAMPLED.replace(max_new_tokens=16, ignore_eos=False, stop=("e",))
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                                        tokenize=True)
    whole = generate(model, tokenizer, [ids], config).texts[0]
    pieces = list(stream(model, tokenizer, ids, config, chunk_size=3))
    assert "".join(pieces) == whole


def test_no_recompile_within_a_bucket(model):
    """After a warm-up call, other knob values, seeds, batch contents and max_new_tokens in the same buckets
    compile nothing."""
    generate(model, None, PROMPTS, SAMPLED)
    before = sum(compile_counts().values())
    for cfg, prompts in [
        (SAMPLED.replace(temperature=0.5, top_p=0.5, top_k=50, seed=9), PROMPTS),
        (SAMPLED.replace(max_new_tokens=15), PROMPTS[::-1]),
        (SAMPLED.replace(ignore_eos=False, stop_token_ids=(5, 6, 7)), [PROMPTS[1], PROMPTS[1][:2], [7] * 16]),
    ]:
        assert generate(model, None, prompts, cfg).stats.compiles == 0
    assert sum(compile_counts().values()) == before
    assert [bucket_length(n) for n in (1, 16, 17, 64, 65, 512, 513)] == [16, 16, 32, 64, 128, 512, 768]


@pytest.mark.parametrize(
    "kwargs, prompts, match",
    [
        ({}, [[]], "prompt 0 is empty"),
        ({}, [], "no prompts"),
        ({}, [[3, 4], [5] * 250], "prompt 1 has 250 tokens"),
        ({"max_len": 20}, [[3] * 15], "context holds 20"),
        ({"max_new_tokens": 0}, [[3]], "max_new_tokens"),
        ({"max_new_tokens": -2}, [[3]], "max_new_tokens"),
        ({"top_p": 0.0}, [[3]], "top_p"),
        ({"top_p": 1.5}, [[3]], "top_p"),
        ({"n": 0}, [[3]], "n \\(samples per prompt\\)"),
        ({"temperature": -1.0}, [[3]], "temperature"),
        ({"seed": -1}, [[3]], "seed"),
        ({}, [[3, 400]], "token id 400, outside the model's vocabulary"),
        ({"stop": ("x",)}, [[3]], "stop strings need a tokenizer"),
    ],
)
def test_bad_requests_raise_generation_error(model, kwargs, prompts, match):
    with pytest.raises(GenerationError, match=match):
        generate(model, None, prompts, SamplingConfig(**{"max_new_tokens": 8, **kwargs}))


def test_a_cache_larger_than_the_free_memory_is_refused_with_its_size_and_the_fix(model, monkeypatch):
    """The tiny model: 2 (k, v) x 3 layers x 2 kv heads x 16 dims x 4 bytes = 768 bytes a position a row. 3 prompts
    run as 4 rows (the batch bucket) of 16 prompt + 16 completion positions (the length buckets): 4 x 32 x 768 =
    98304 bytes. One byte less free is refused; as much is not."""
    from tempax.generate import engine
    from tempax.models.cache import kv_bytes_per_position

    cfg = model.config
    assert kv_bytes_per_position(cfg) == 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4 == 768
    engine.check_cache_fits(cfg, 4, 32, 98304)
    engine.check_cache_fits(cfg, 4, 32, None)
    with pytest.raises(GenerationError, match=r"4 rows of 32 positions needs 0\.0 GiB of KV cache.*fewer rows"):
        engine.check_cache_fits(cfg, 4, 32, 98303)
    monkeypatch.setattr(engine, "available_memory", lambda: 98303)
    with pytest.raises(GenerationError, match="4 rows of 32 positions"):  # 3 prompts run as 4 rows (bucket)
        generate(model, None, [[3, 4], [5], [6]], SamplingConfig(max_new_tokens=8))
    monkeypatch.setattr(engine, "available_memory", lambda: 98304)
    assert generate(model, None, [[3, 4], [5], [6]], SamplingConfig(max_new_tokens=8)).token_ids.shape == (3, 8)


def test_text_prompt_needs_a_tokenizer(model, tokenizer):
    with pytest.raises(GenerationError, match="no tokenizer"):
        generate(model, None, ["hello"], SamplingConfig(max_new_tokens=2))
    with pytest.raises(GenerationError, match="prompt 0 is empty"):
        generate(model, tokenizer, [""], SamplingConfig(max_new_tokens=2))
    with pytest.raises(GenerationError, match="list of prompts"):
        generate(model, tokenizer, "hello", SamplingConfig(max_new_tokens=2))


def test_decode_layout_on_and_off_give_the_same_generation(model):
    on = generate(model, None, PROMPTS, SAMPLED.replace(decode_layout="on"))
    off = generate(model, None, PROMPTS, SAMPLED.replace(decode_layout="off"))
    assert_array_equal(on.token_ids, off.token_ids)
    assert_allclose(on.logprobs, off.logprobs, atol=1e-4)


def test_a_decode_run_holds_no_copy_of_the_weights():
    """The arrays a run adds to the process are its state and sampling knobs, nothing more: no second copy of any
    weight (the decode layout once kept a fused copy of every projection, as large as the model)."""
    from tempax.generate.engine import DecodeRun

    model = peaked_tiny_model(seed=11, tie_word_embeddings=True)
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    before = {id(a) for a in jax.live_arrays()}
    run = DecodeRun(model, PROMPTS, GREEDY.replace(decode_layout="on"), stop_ids=(), pad_id=0)
    run.advance()
    own = {id(a) for a in jax.tree.leaves((run._state, run._knobs))}
    extra = [a for a in jax.live_arrays() if id(a) not in before and id(a) not in own]
    assert sum(a.nbytes for a in extra) < weight_bytes // 100, [a.shape for a in extra]


def test_a_new_shape_compiles_prefill_and_decode_before_prefill_runs(monkeypatch, caplog):
    """The first request of a shape compiles each program once, both before prefill executes (their transient
    compile memory is then gone before the KV cache exists: the first call no longer peaks above the later
    ones); the same request again compiles nothing. A model of its own (one layer) makes the shape new here."""
    import logging
    import re

    from tempax.generate import engine

    model = peaked_tiny_model(num_layers=1)
    compiled = lambda: [m for r in caplog.records if (m := re.search(r"XLA compilation of jit\((_prefill|_decode)\)",
                                                                     r.getMessage()))]
    seen_at_prefill = []
    prefill = engine._prefill

    def watched(*args, **kwargs):
        seen_at_prefill.append([m.group(1) for m in compiled()])
        return prefill(*args, **kwargs)

    watched.lower = prefill.lower
    monkeypatch.setattr(engine, "_prefill", watched)
    caplog.set_level(logging.WARNING)
    with jax.log_compiles(True):
        first = generate(model, None, PROMPTS, GREEDY)
        assert [m.group(1) for m in compiled()] == ["_prefill", "_decode"]
        caplog.clear()
        again = generate(model, None, PROMPTS, GREEDY)
    assert seen_at_prefill == [["_prefill", "_decode"], []]
    assert compiled() == [] and again.stats.compiles == 0
    assert_array_equal(first.token_ids, again.token_ids)


def test_a_prompt_as_long_as_the_context_is_told_to_shorten_not_to_generate_less(model):
    """A 20-token prompt in a 20-position context leaves no room for even one new token, so fewer new tokens
    cannot help; a 15-token one leaves 20 - 15 = 5."""
    with pytest.raises(GenerationError) as e:
        generate(model, None, [[3] * 20], SamplingConfig(max_new_tokens=8, max_len=20))
    assert str(e.value) == ("prompt 0 has 20 tokens but the context holds 20, so no token can follow it. Shorten "
                            "the prompt to fewer than 20 tokens (or raise max_len).")
    with pytest.raises(GenerationError) as e:
        generate(model, None, [[3] * 15], SamplingConfig(max_new_tokens=8, max_len=20))
    assert "Shorten the prompt or generate at most 5 new tokens (--max-new-tokens" in str(e.value)
