"""Which waiting requests the batcher runs together: they share n and top_k, and sampled rows agree on whether
top-p walks the vocabulary in sorted order (a sample's token depends on that order); greedy rows join any batch."""

from __future__ import annotations

from tempax.generate import SamplingConfig
from tempax.serve.batcher import Batcher, Job
from tempax.serve.protocol import CompletionRequest
from tests.kit.tokenizers import tiny_chat_tokenizer


def _job(**knobs) -> Job:
    return Job(CompletionRequest("completion", "tiny", [[5, 6]], SamplingConfig(max_new_tokens=4, **knobs)))


def test_a_batch_takes_the_compatible_waiting_requests_in_order():
    batcher = Batcher(None, tiny_chat_tokenizer(), max_rows=4)  # no job is submitted: the worker stays idle
    try:
        greedy, top_p, plain, other_n, top_p2, big = (
            _job(temperature=0.0), _job(top_p=0.9), _job(temperature=0.7), _job(n=2), _job(top_p=0.5, seed=1),
            _job(n=3))
        batcher._waiting = [greedy, top_p, plain, other_n, top_p2, big]
        assert batcher._take_batch() == [greedy, top_p, top_p2]  # plain samples unsorted; n=2 and n=3 differ
        assert batcher._take_batch() == [plain]
        assert batcher._take_batch() == [other_n]
        assert batcher._take_batch() == [big]
        batcher._waiting = [_job(n=2) for _ in range(3)]  # 6 rows: the third waits for the next batch (max_rows 4)
        assert len(batcher._take_batch()) == 2 and len(batcher._waiting) == 1
    finally:
        batcher.close()
