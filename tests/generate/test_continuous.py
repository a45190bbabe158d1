"""The continuously batched slot engine: a row that joins a running decode mid-way gives the tokens it gives alone
(and what `generate` gives), finished rows free their slots, and after `warm_up` nothing compiles."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from tempax.errors import GenerationError
from tempax.generate import SamplingConfig, generate
from tempax.generate.continuous import SlotEngine, SlotKnobs, cache_bucket, sample_rows

CONTEXT = 60  # prompt buckets 16, 32, 64; cache buckets 32, 48, 64 (min_cache): few programs to compile
GREEDY = ([5, 6, 7, 8, 9], SamplingConfig(temperature=0.0, max_new_tokens=24))
TOP_P = ([11, 12, 13], SamplingConfig(temperature=0.9, top_p=0.9, seed=3, max_new_tokens=20))
PLAIN = (list(range(20, 50)), SamplingConfig(temperature=1.0, seed=5, max_new_tokens=28))


def test_cache_buckets_are_powers_of_two_and_the_steps_half_way_between():
    assert [cache_bucket(n) for n in (1, 16, 17, 24, 25, 33, 48, 49)] == [16, 16, 24, 24, 32, 48, 48, 64]
    assert [cache_bucket(n) for n in (192, 193, 342, 384, 385)] == [192, 256, 384, 384, 512]  # a GSM8K row: 384
    assert cache_bucket(20, minimum=32) == 32


@pytest.mark.heavy
def test_a_row_of_90_positions_decodes_in_a_96_position_cache_and_gives_its_tokens_alone(model, tokenizer):
    eng = SlotEngine(model, slots=2, context=200, stop_ids=tokenizer.stop_ids, pad_id=tokenizer.pad_id, min_cache=32)
    assert eng.cache_buckets == [32, 48, 64, 96, 128, 192, 256]
    request = (list(range(5, 45)), SamplingConfig(temperature=0.0, max_new_tokens=50))
    slot = eng.join(request[0], [request[1]], ["a"])[0]
    assert eng.cache_len == 96  # a 40-token prompt and 50 new tokens: 90 positions
    eng.advance(60)
    tokens, lengths, done = eng.snapshot()
    assert done[slot] and tokens[slot, : lengths[slot]].tolist() == _alone(model, tokenizer, request)


@pytest.fixture(scope="module")
def engine(model, tokenizer):
    eng = SlotEngine(model, slots=4, context=CONTEXT, stop_ids=tokenizer.stop_ids, pad_id=tokenizer.pad_id,
                     min_cache=32)
    eng.warm_up()
    return eng


def _run(engine: SlotEngine, schedule: list[tuple[int, tuple]], chunk: int = 4) -> dict[int, list[int]]:
    """Joins each (chunk number, request) when the decode reaches that chunk; returns each request's tokens."""
    slots: dict[int, int] = {}
    out: dict[int, list[int]] = {}
    for chunk_index in range(40):
        for i, (at, (ids, config)) in enumerate(schedule):
            if at == chunk_index:
                slots[i] = engine.join(ids, [config], [i])[0]
        engine.advance(chunk)
        tokens, lengths, done = engine.snapshot()
        ended = [s for i, s in slots.items() if done[s] and i not in out]
        for i, s in slots.items():
            if s in ended:
                out[i] = tokens[s, : lengths[s]].tolist()
        if ended:
            engine.release(ended)
        if len(out) == len(schedule):
            return out
    raise AssertionError(f"requests {sorted(set(range(len(schedule))) - set(out))} never finished")


def _alone(model, tokenizer, request) -> list[int]:
    ids, config = request
    result = generate(model, tokenizer, [ids], config)
    return result.token_ids[0, : result.lengths[0]].tolist()


@pytest.mark.heavy
def test_a_greedy_request_joining_mid_way_gives_its_tokens_alone(engine, model, tokenizer):
    """Alone, then joining a decode two chunks in beside a sampled row (and before another joins): the same
    tokens, which are also what `generate` gives it; the sampled rows equal theirs alone too."""
    alone = _run(engine, [(0, GREEDY)])[0]
    busy = _run(engine, [(0, PLAIN), (2, GREEDY), (3, TOP_P)])
    assert busy[1] == alone == _alone(model, tokenizer, GREEDY)
    assert busy[0] == _alone(model, tokenizer, PLAIN)
    assert busy[2] == _alone(model, tokenizer, TOP_P)
    assert engine.live() == 0


def test_finished_rows_free_their_slots_and_a_full_engine_refuses_more(engine):
    short = ([7, 8], SamplingConfig(temperature=0.0, max_new_tokens=2))
    engine.join(short[0], [short[1]] * 4, list(range(4)))
    assert engine.free_slots() == 0
    with pytest.raises(GenerationError, match="do not fit the free slots"):
        engine.join([7], [short[1]], ["fifth"])
    engine.advance(8)
    _, lengths, done = engine.snapshot()
    assert done.all() and (lengths == 2).all()
    engine.release([0, 1, 2, 3])
    assert engine.free_slots() == 4


def test_nothing_compiles_after_warm_up_across_varied_requests(engine):
    """Prompt lengths across every bucket, cache growth, n, greedy / top-p / top-k / min-p rows, scoring: the
    engine's own count and JAX's backend-compile events both stay put."""
    compiles = []
    listener = lambda event, *args, **kwargs: compiles.append(event) if "backend_compile" in event else None
    jax.monitoring.register_event_duration_secs_listener(listener)
    before = engine.compiles
    try:
        requests = [
            (list(range(3, 8)), SamplingConfig(temperature=0.0, max_new_tokens=5)),
            (list(range(3, 20)), SamplingConfig(temperature=0.7, top_k=5, seed=1, max_new_tokens=30)),
            (list(range(3, 50)), SamplingConfig(temperature=1.0, min_p=0.1, top_p=0.8, seed=2, max_new_tokens=10)),
        ]
        slots = engine.join(requests[0][0], [requests[0][1]] * 2, ["n=2", "n=2"])  # n samples, one prefill
        for ids, config in requests[1:]:
            engine.advance(3)
            slots += engine.join(ids, [config], ["one"])
        engine.score(list(range(3, 58)))
        engine.advance(64)
        engine.release(slots)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert engine.compiles == before and compiles == []


@pytest.mark.heavy
def test_warm_up_on_threads_compiles_what_one_thread_compiles(engine, model, tokenizer):
    """The fixture's engine warmed up on min(CPU count, 4) threads (2 on the CI machine); one thread compiles the
    same programs, and each engine compiled each of its programs once (its count equals its programs, the
    construction's `init` included)."""
    alone = SlotEngine(model, slots=4, context=CONTEXT, stop_ids=tokenizer.stop_ids, pad_id=tokenizer.pad_id,
                       min_cache=32)
    assert alone.warm_up(workers=1) == len(alone._programs) - 1
    assert set(alone._programs) == set(engine._programs) and engine.compiles == len(engine._programs)


def test_sample_rows_picks_each_rows_own_filter():
    """Logits (0, 1, 2, 3) per row; u = 0.5. Row 0 greedy -> 3. Row 1 top-k 1 -> 3 (only the largest survives).
    Row 2 plain at temperature 1: probabilities e^i / (1 + e + e^2 + e^3) = (.032, .087, .237, .644); the
    cumulative mass reaches 0.5 at index 3 -> 3. Row 3 min-p 0.3 keeps p >= 0.3 * .644 = .193: indices 2, 3
    with mass (.237, .644); u * total = 0.44 falls past .237 -> 3. With u = 0.1: row 2 -> cumulative (.032, .119)
    reaches 0.1 at index 1; row 3 -> 0.088 < .237 -> index 2."""
    logits = np.tile(np.arange(4, dtype=np.float32), (4, 1))
    knobs = SlotKnobs(
        temperature=np.ones(4, np.float32), top_p=np.ones(4, np.float32),
        min_p=np.array([0, 0, 0, 0.3], np.float32), top_k=np.array([4, 1, 4, 4], np.int32),
        greedy=np.array([True, False, False, False]), limit=np.ones(4, np.int32), seed=np.zeros(4, np.uint32),
        sample=np.zeros(4, np.int32), stream=np.zeros(4, np.int32), turn=np.zeros(4, np.int32),
        stop_ids=np.full(8, -1, np.int32), pad_id=np.int32(0))
    tokens, _, raw = sample_rows(logits, np.full(4, 0.5, np.float32), knobs)
    assert tokens.tolist() == [3, 3, 3, 3]
    np.testing.assert_allclose(raw, np.log(np.exp(3) / np.exp(np.arange(4)).sum()), rtol=1e-6)
    tokens, _, _ = sample_rows(logits, np.full(4, 0.1, np.float32), knobs)
    assert tokens.tolist() == [3, 3, 1, 2]


def test_loaded_weights_decode_without_compiling(engine, model, tokenizer):
    """`load` swaps in another model of the same structure (an updated policy): the next request gives what that
    model gives alone, and nothing compiles."""
    from tests.generate.conftest import peaked_tiny_model

    other = peaked_tiny_model(seed=1)
    before = engine.compiles
    engine.load(other)
    try:
        assert _run(engine, [(0, GREEDY)])[0] == _alone(other, tokenizer, GREEDY)
        assert engine.compiles == before
    finally:
        engine.load(model)
