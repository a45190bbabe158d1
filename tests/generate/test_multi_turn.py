"""Multi-turn decoding on the engine: a second turn prefilled into the existing cache equals a fresh request on
the whole conversation, prefills only the new tokens, and leaves ended rows ended."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from tempax.errors import GenerationError
from tempax.generate import SamplingConfig
from tempax.generate.engine import DecodeRun
from tests.generate.conftest import peaked_tiny_model
from tests.kit.models import random_ids

PROMPTS = [[t + 3 for t in random_ids((n,), vocab=397, seed=n).tolist()] for n in (5, 9, 3)]
GREEDY = SamplingConfig(max_new_tokens=6, temperature=0.0, ignore_eos=True)


def test_a_second_turn_matches_a_fresh_prefill_of_the_whole_conversation():
    """Turn 1 stops rows at different lengths (a stop id taken from row 0's greedy output); turn 2 appends a
    different number of new tokens per row (3, 1, none: row 2 ends). Each live row's turn-2 tokens and log-probs
    equal those of a fresh request on prompt + turn-1 tokens + new tokens, and the run prefilled
    sum(prompts) + (1 + 3) + (1 + 1) tokens: each turn's last token plus the new ones, never the conversation."""
    model = peaked_tiny_model(seed=3)
    probe = DecodeRun(model, PROMPTS, GREEDY, stop_ids=(), pad_id=0)
    probe.advance()
    stop = int(probe.tokens()[0][0, 2])  # row 0 stops at its third token; other rows stop wherever it appears
    run = DecodeRun(model, PROMPTS, GREEDY, stop_ids=(stop,), pad_id=0, reserve=32)
    run.advance()
    first, first_lengths = run.tokens()
    assert first_lengths[0] == 3
    new = [[11, 12, 13], [14], None]
    run.continue_with(new)
    run.advance()
    second = run.output()
    assert run.prefilled_tokens == sum(map(len, PROMPTS)) + 4 + 2
    assert second.lengths[2] == 0 and second.stopped[2]
    for r in (0, 1):
        conversation = PROMPTS[r] + first[r, : first_lengths[r]].tolist() + new[r]
        fresh = DecodeRun(model, [conversation], GREEDY, stop_ids=(stop,), pad_id=0)
        fresh.advance()
        want = fresh.output()
        n = int(want.lengths[0])
        assert second.lengths[r] == n
        assert_array_equal(second.tokens[r, :n], want.tokens[0, :n])
        assert_allclose(second.logprobs[r, :n], want.logprobs[0, :n], atol=2e-5)


def test_a_turn_that_does_not_fit_is_refused():
    model = peaked_tiny_model(seed=3)
    run = DecodeRun(model, PROMPTS, GREEDY, stop_ids=(), pad_id=0)
    run.advance()
    with pytest.raises(GenerationError, match="pass a larger reserve"):
        run.continue_with([[5] * 40, None, None])
    with pytest.raises(GenerationError, match="got 1 rows of new tokens for 3 rows"):
        run.continue_with([[5]])


def test_the_next_turn_is_written_into_the_same_cache():
    """`continue_with` hands the cache to the next turn's prefill (donated), which writes in place: a run never
    holds two caches (without it a large batch of multi-turn episodes held its cache twice)."""
    model = peaked_tiny_model(seed=3)
    run = DecodeRun(model, PROMPTS, GREEDY, stop_ids=(), pad_id=0, reserve=32)
    run.advance()
    before = run._state.cache
    where = [x.unsafe_buffer_pointer() for x in (before.k, before.v)]  # [L, B, K, S, H] each
    run.continue_with([[11, 12], [13], [14]])
    after = run._state.cache
    assert all(x.is_deleted() for x in (before.k, before.v))
    assert [x.unsafe_buffer_pointer() for x in (after.k, after.v)] == where
    run.advance()
    assert run.output().lengths.tolist() == [6, 6, 6]
