"""The batcher's admission: waiting requests join the running decode oldest first as soon as free slots hold all
of a request's completions, a finished row frees its slot at once, and an echo-only request takes no slot."""

from __future__ import annotations

from tempax.generate import SamplingConfig
from tempax.serve.batcher import Batcher, Job
from tempax.serve.protocol import CompletionRequest
from tests.generate.conftest import peaked_tiny_model
from tests.kit.tokenizers import tiny_chat_tokenizer


def _job(max_tokens: int, n: int = 1, **fields) -> Job:
    config = SamplingConfig(temperature=0.0, max_new_tokens=max_tokens, n=n)
    return Job(CompletionRequest("completion", "tiny", [[5, 6, 7]], config, **fields))


def test_requests_join_when_slots_free_oldest_first():
    """3 slots. A (1 row, 12 tokens) and B (2 rows, 2 tokens) fill them; C (2 rows) and D (1 row) wait: C is
    older and needs 2. B's rows end after its 2 tokens and free 2 slots: C joins at once, D still waits for A.
    An echo-only request (max_tokens 0) is answered without a slot while all are taken."""
    batcher = Batcher(peaked_tiny_model(), tiny_chat_tokenizer(), max_rows=3, chunk=2, context=32)
    a, b, c, d = _job(12), _job(2, n=2), _job(4, n=2), _job(4)
    score = _job(1, echo=True, score_only=True)
    batcher._waiting.extend([a, b, c, d])
    batcher._admit()
    assert [row.job for row in batcher._rows.values()].count(b) == 2 and list(batcher._waiting) == [c, d]
    batcher.engine.advance(batcher.chunk)
    batcher._check_rows()
    assert b.ended and [ch.token_ids for ch in b.choices][0] == [ch.token_ids for ch in b.choices][1]
    batcher._waiting.append(score)
    batcher._admit()
    assert list(batcher._waiting) == [d] and score.ended and score.choices[0].token_ids == []
    jobs = [row.job for row in batcher._rows.values()]
    assert jobs.count(a) == 1 and jobs.count(c) == 2 and batcher.engine.free_slots() == 0
    assert batcher.live_rows[-1] == 3
