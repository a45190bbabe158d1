"""The request batcher: concurrent requests share decode steps.

One worker thread owns the model. It takes every request waiting when it is free (up to `max_rows` rows, the
requests with the oldest one's n and top_k, which a batch shares) and runs them as one `DecodeRun` whose rows
keep their own temperature, top-p, min-p, seed and max_tokens (`prompt_configs`). The run advances `chunk` tokens
per device call; after each chunk the worker checks each request's own stop strings, sends streamed text, and
answers every request whose rows have all finished, without waiting for the rest of the batch. Requests that
arrive while a batch runs wait for the next one: the engine's rows share one KV-cache write position, so a new
prompt cannot join a batch that is already decoding (docs/serving.md measures what batching gives).

A request's samples depend only on it (its seed, its prompt), never on what it was batched with: each prompt
draws its random stream as prompt 0 of its own request.
"""

from __future__ import annotations

import collections
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tempax.generate.engine import DecodeRun
from tempax.generate.stops import cut_at_stop
from tempax.serve.protocol import APIError, Choice, CompletionRequest

Event = tuple[str, Any]  # ("delta", (choice index, text)) / ("choice", Choice) / ("error", APIError) / ("end", None)


@dataclass
class Job:
    """A request in the batcher; its events arrive in `events` in order, ending with ("end", None)."""

    request: CompletionRequest
    events: "queue.Queue[Event]" = field(default_factory=queue.Queue)
    choices: list[Choice] = field(default_factory=list)
    ended: bool = False  # its "end" event has been sent

    @property
    def rows(self) -> int:
        return len(self.request.prompts) * self.request.sampling.n


@dataclass
class _Row:
    """One completion of a job inside a running batch."""

    job: Job
    index: int  # the choice index in the response
    emitted: int = 0  # characters of text already streamed
    finished: bool = False


def _shared_key(job: Job) -> tuple[int, int, bool | None]:
    """What the rows of one batch must agree on: n, top_k, and whether sampling walks the vocabulary in sorted
    order (top-p without top-k; a sample's token depends on that order). None: greedy, which joins either."""
    c = job.request.sampling
    return c.n, c.top_k, None if c.greedy else (c.top_p < 1.0 and c.top_k == 0)


def _joins(key: tuple[int, int, bool | None], batch_key: tuple[int, int, bool | None]) -> bool:
    return key[:2] == batch_key[:2] and (key[2] is None or batch_key[2] is None or key[2] == batch_key[2])


class Batcher:
    """Runs requests on `model` in batches from a worker thread; `submit` is safe from any thread.

    Args:
      model, tokenizer: what `tempax.models.registry.load` returns.
      max_rows: most completions (prompts x n) decoded together.
      chunk: tokens decoded per device call between host checks (stop strings, streaming, finished requests).
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_rows: int = 32, chunk: int = 8):
        self.model, self.tokenizer = model, tokenizer
        self.max_rows, self.chunk = max_rows, chunk
        self.batch_rows: collections.deque[int] = collections.deque(maxlen=1024)  # rows of recent batches
        self._queue: "queue.Queue[Job | None]" = queue.Queue()
        self._waiting: list[Job] = []
        self._stop_ids = tuple(tokenizer.stop_ids)
        self._thread = threading.Thread(target=self._work, name="tempax-batcher", daemon=True)
        self._thread.start()

    def submit(self, request: CompletionRequest) -> Job:
        rows = len(request.prompts) * request.sampling.n
        if rows > self.max_rows:
            raise APIError(f"the request asks for {rows} completions (prompts x n); this "
                           f"server decodes at most {self.max_rows} at once (--max-batch)", param="n")
        job = Job(request)
        self._queue.put(job)
        return job

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    # -- the worker --------------------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            if not self._waiting:
                job = self._queue.get()
                if job is None:
                    return
                self._waiting.append(job)
            while True:  # everything that arrived while the last batch ran
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    return
                self._waiting.append(job)
            batch = self._take_batch()
            try:
                self._run(batch)
            except APIError as e:
                for job in batch:
                    self._fail(job, e)
            except Exception as e:  # the server must outlive one failed batch; the clients hear why
                for job in batch:
                    self._fail(job, APIError(f"generation failed: {type(e).__name__}: {e}", status=500,
                                             type="internal_error"))

    def _take_batch(self) -> list[Job]:
        key = _shared_key(self._waiting[0])
        batch, rest, rows = [], [], 0
        for job in self._waiting:
            own = _shared_key(job)
            if _joins(own, key) and rows + job.rows <= self.max_rows:
                batch.append(job)
                rows += job.rows
                key = key if key[2] is not None else own  # the first sampled request fixes the order
            else:
                rest.append(job)
        self._waiting = rest
        return batch

    def _fail(self, job: Job, error: APIError) -> None:
        if not job.ended:
            job.ended = True
            job.events.put(("error", error))
            job.events.put(("end", None))

    def _run(self, batch: list[Job]) -> None:
        prompts, configs, rows = [], [], []
        for job in batch:
            config = job.request.sampling
            for p, ids in enumerate(job.request.prompts):
                prompts.append(ids)
                configs.append(config)
                rows += [_Row(job, p * config.n + j) for j in range(config.n)]
        shared = configs[0].replace(max_new_tokens=max(c.max_new_tokens for c in configs), stop=())
        self.batch_rows.append(len(rows))
        run = DecodeRun(self.model, prompts, shared, stop_ids=self._stop_ids, pad_id=int(self.tokenizer.pad_id),
                        prompt_configs=configs)
        while True:
            self._check_rows(run, rows, final=run.finished)
            if run.finished or all(row.finished for row in rows):
                break
            run.advance(self.chunk)

    def _decode(self, ids: np.ndarray) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _check_rows(self, run: DecodeRun, rows: list[_Row], *, final: bool) -> None:
        """Stop strings, streamed text and finished requests after a chunk (`final`: the run has ended)."""
        tokens, lengths = run.tokens()
        done = run.done()
        stop_now = np.zeros(len(rows), bool)
        raw_logprobs = None  # fetched from the device once, when a row that reports log-probs ends
        for r, row in enumerate(rows):
            if row.finished:
                continue
            request = row.job.request
            stops = request.sampling.stop
            n_tok = int(lengths[r])
            ids = tokens[r, :n_tok]
            by_token = n_tok > 0 and bool(done[r]) and int(ids[-1]) in self._stop_ids
            body = ids[:-1] if by_token else ids
            text, kept, hit = cut_at_stop(body, self._decode, stops)
            ended = hit or bool(done[r]) or final or n_tok >= request.sampling.max_new_tokens
            if hit:
                stop_now[r] = True
            if request.stream:
                safe = len(text) if ended else len(text) - (max((len(s) for s in stops), default=1) - 1)
                while not ended and safe > row.emitted and text[safe - 1] == "\ufffd":
                    safe -= 1  # an incomplete multi-byte character: wait for its other bytes
                if safe > row.emitted:
                    row.job.events.put(("delta", (row.index, text[row.emitted:safe])))
                    row.emitted = safe
            if ended:
                row.finished = True
                kept_ids = [int(t) for t in ids[: kept if hit else n_tok]]
                if request.logprobs and raw_logprobs is None:
                    raw_logprobs = run.output().raw_logprobs
                # log p_1: the model's own distribution at temperature 1 (what vLLM reports by default)
                logprobs = [float(x) for x in raw_logprobs[r, : len(kept_ids)]] if request.logprobs else []
                choice = Choice(row.index, text, "stop" if (hit or by_token) else "length", kept_ids, logprobs)
                row.job.choices.append(choice)
                row.job.events.put(("choice", choice))
                if len(row.job.choices) == row.job.rows:
                    row.job.choices.sort(key=lambda c: c.index)
                    row.job.ended = True
                    row.job.events.put(("end", None))
        if stop_now.any():
            run.mark_done(stop_now)
