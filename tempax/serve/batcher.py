"""The request batcher: concurrent requests share decode steps, and a request joins the running decode.

One worker thread owns the model, as a continuously batched `SlotEngine` (`tempax.generate.continuous`): a
fixed number of slots, each with its own KV cache. Between chunks of `chunk` tokens the worker

  * admits waiting requests, oldest first, while free slots hold all of a request's completions (prompts x n):
    each prompt is prefilled alone into its slots, so it joins the rows already decoding without re-padding
    them (an echoed prompt with max_tokens 0 takes no slot: it is only scored);
  * checks each row's own stop strings, sends streamed text, and answers a request when its rows have all
    finished; a finished row frees its slot at once, for the next waiting request. A completion that asks for
    `echo` or top alternatives (`logprobs` N > 0) gets one scoring pass over prompt + completion when it ends.

Rows differ in every sampling knob (temperature, top-p, top-k, min-p, seed, max_tokens): the engine takes them
as traced values per slot, so any mix of requests runs on the programs `warm_up` compiled at start-up.

A request's samples depend only on it (its seed, its prompt), never on what it was batched with or when it
joined: each prompt draws its random stream as prompt 0 of its own request, step by step from its own start.
"""

from __future__ import annotations

import collections
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tempax.generate.continuous import SlotEngine
from tempax.generate.stops import cut_at_stop
from tempax.serve.protocol import APIError, Choice, CompletionRequest, Scores

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

    @property
    def slots(self) -> int:
        """Slots it decodes in (none where it only scores its prompts)."""
        return 0 if self.request.score_only else self.rows


@dataclass
class _Row:
    """One completion of a job inside the running decode."""

    job: Job
    index: int  # the choice index in the response
    prompt: int  # which of the job's prompts it continues
    emitted: int = 0  # characters of text already streamed


def stopping_error() -> APIError:
    """A request the server cannot answer because it is stopping (a signal, or `close()`)."""
    return APIError("the server is stopping; retry against a running server", status=503, type="server_error",
                    code="server_stopping")


class Batcher:
    """Runs requests on `model` with continuous batching from a worker thread; `submit` is safe from any thread.

    Args:
      model, tokenizer: what `tempax.models.registry.load` returns.
      max_rows: slots: most completions (prompts x n) decoded together.
      chunk: tokens decoded per device call between host checks (joins, stop strings, streaming, answers).
      context: positions per row, prompt + completion (the largest bucket the engine compiles).
      join_running: False admits requests only when the decode has emptied (static batches: what the server did
        before continuous batching; `bench/serve.py` compares the two).
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_rows: int = 32, chunk: int = 8, context: int = 256,
                 join_running: bool = True):
        self.model, self.tokenizer = model, tokenizer
        self.max_rows, self.chunk, self.join_running = max_rows, chunk, join_running
        self._stop_ids = tuple(tokenizer.stop_ids)
        # Cache buckets from 256 positions: a short row reads a few hundred unused slots a step, and start-up
        # compiles two decode programs fewer than from 64.
        self.engine = SlotEngine(model, slots=max_rows, context=context, stop_ids=self._stop_ids,
                                 pad_id=int(tokenizer.pad_id), min_cache=256)
        # Live rows after each admission: how many requests shared the decode (tests, benchmarks).
        self.live_rows: collections.deque[int] = collections.deque(maxlen=4096)
        self._queue: "queue.Queue[Job | None]" = queue.Queue()
        self._waiting: collections.deque[Job] = collections.deque()
        self._rows: dict[int, _Row] = {}  # slot -> row
        self._thread: threading.Thread | None = None
        self._closing = False

    def warm_up(self) -> int:
        """Compiles every program serving needs (before the server answers); returns how many compiled."""
        return self.engine.warm_up()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name="tempax-batcher", daemon=True)
        self._thread.start()

    def submit(self, request: CompletionRequest) -> Job:
        if self._closing:
            raise stopping_error()
        rows = len(request.prompts) * request.sampling.n
        if rows > self.max_rows:
            raise APIError(f"the request asks for {rows} completions (prompts x n); this "
                           f"server decodes at most {self.max_rows} at once (--max-batch)", param="n")
        job = Job(request)
        self._queue.put(job)
        return job

    def close(self) -> None:
        """Stops the worker. Every request it has not answered, decoding, waiting or still queued, ends with a 503
        error event, so no connection thread is left waiting for an answer that will not come."""
        self._closing = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            if self._thread.is_alive():
                return  # a device call outlived the wait: the worker fails the rest when it sees the None
        self._fail_all()

    def _fail_all(self) -> None:
        """Ends every request not yet answered with the server's stop (the worker's last act, or close's once the
        worker is gone): those running, those waiting and those still queued."""
        error = stopping_error()
        for job in [row.job for row in self._rows.values()] + list(self._waiting):
            self._fail(job, error)
        self._rows.clear()
        self._waiting.clear()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                self._fail(job, error)

    # -- the worker --------------------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            try:
                block = not self._rows and not self._waiting
                while True:  # everything that arrived; wait for one when there is nothing to do
                    job = self._queue.get() if block else self._queue.get_nowait()
                    block = False
                    if job is None:
                        self._fail_all()
                        return
                    self._waiting.append(job)
            except queue.Empty:
                pass
            try:
                self._admit()
                self.engine.advance(self.chunk)
                self._check_rows()
            except Exception as e:  # the server must outlive one failed step; the clients hear why
                error = e if isinstance(e, APIError) else APIError(
                    f"generation failed: {type(e).__name__}: {e}", status=500, type="internal_error")
                for row in self._rows.values():
                    self._fail(row.job, error)
                self._rows.clear()
                self.engine.reset()

    def _admit(self) -> None:
        """Oldest first, waiting requests join the decode while their completions all fit the free slots; the
        first that does not fit holds back the later ones (so a large request is not starved), except those that
        take no slot (echo with max_tokens 0), which are answered at once."""
        admitted, blocked, rest = False, not self.join_running and self.engine.live() > 0, collections.deque()
        for job in self._waiting:
            if job.slots and (blocked or job.slots > self.engine.free_slots()):
                blocked = True
                rest.append(job)
                continue
            try:
                self._start(job)
            except APIError as e:
                self._fail(job, e)
            admitted = admitted or job.slots > 0
        self._waiting = rest
        if admitted:
            self.live_rows.append(self.engine.live())

    def _start(self, job: Job) -> None:
        request = job.request
        config = request.sampling
        n = config.n
        if request.score_only:  # echo with max_tokens 0: score the prompts, generate nothing
            for p, ids in enumerate(request.prompts):
                for j in range(n):
                    self._finish(job, Choice(p * n + j, "", "length", [], [], list(ids), self._score(list(ids))))
            return
        for p, ids in enumerate(request.prompts):
            rows = [_Row(job, p * n + j, p) for j in range(n)]
            for slot, row in zip(self.engine.join(ids, [config] * n, rows), rows):
                self._rows[slot] = row

    def _fail(self, job: Job, error: APIError) -> None:
        if not job.ended:
            job.ended = True
            job.events.put(("error", error))
            job.events.put(("end", None))

    def _decode(self, ids: np.ndarray) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _check_rows(self) -> None:
        """Stop strings, streamed text and finished requests after a chunk; finished rows free their slots."""
        if not self._rows:
            return
        tokens, lengths, done = self.engine.snapshot()
        raw_logprobs = None  # fetched from the device once, when a row that reports log-probs ends
        finished = []
        for slot, row in list(self._rows.items()):
            request = row.job.request
            stops = request.sampling.stop
            n_tok = int(lengths[slot])
            ids = tokens[slot, :n_tok]
            by_token = n_tok > 0 and bool(done[slot]) and int(ids[-1]) in self._stop_ids
            body = ids[:-1] if by_token else ids
            text, kept, hit = cut_at_stop(body, self._decode, stops)
            ended = hit or bool(done[slot]) or n_tok >= request.sampling.max_new_tokens
            if request.stream:
                safe = len(text) if ended else len(text) - (max((len(s) for s in stops), default=1) - 1)
                while not ended and safe > row.emitted and text[safe - 1] == "\ufffd":
                    safe -= 1  # an incomplete multi-byte character: wait for its other bytes
                if safe > row.emitted:
                    row.job.events.put(("delta", (row.index, text[row.emitted:safe])))
                    row.emitted = safe
            if not ended:
                continue
            finished.append(slot)
            del self._rows[slot]
            kept_ids = [int(t) for t in ids[: kept if hit else n_tok]]
            if request.logprobs and raw_logprobs is None:
                raw_logprobs = self.engine.raw_logprobs()
            # log p_1: the model's own distribution at temperature 1 (what vLLM reports by default)
            logprobs = [float(x) for x in raw_logprobs[slot, : len(kept_ids)]] if request.logprobs else []
            prompt_ids = list(request.prompts[row.prompt])
            scores = self._score(prompt_ids + kept_ids) if request.echo or request.top_logprobs else None
            finish = "stop" if (hit or by_token) else "length"
            self._finish(row.job, Choice(row.index, text, finish, kept_ids, logprobs, prompt_ids, scores))
        if finished:
            self.engine.release(finished)

    def _score(self, ids: list[int]) -> Scores:
        return Scores(*self.engine.score(ids))

    def _finish(self, job: Job, choice: Choice) -> None:
        if job.ended:
            return  # its request already failed
        job.choices.append(choice)
        job.events.put(("choice", choice))
        if len(job.choices) == job.rows:
            job.choices.sort(key=lambda c: c.index)
            job.ended = True
            job.events.put(("end", None))
