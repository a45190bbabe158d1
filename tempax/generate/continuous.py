"""Continuous batching: a decode that rows join and leave at chunk boundaries, over a KV cache in fixed slots.

`DecodeRun` decodes one batch from start to end: its rows share one cache write index, so a new prompt cannot
join it. `SlotEngine` gives each of its rows a cache of its own, so a request joins as soon as a slot is free and
a finished row frees its slot at once; every program is compiled ahead (`warm_up`), so serving never compiles,
and a row's tokens depend only on its own request (`sample_rows`), never on what else is decoding.

Single-device only (the slot axis is a `vmap` axis, not a mesh axis).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tempax.errors import GenerationError
from tempax.generate.config import SamplingConfig
from tempax.generate.engine import _call_model, _is_stop, _merge, use_decode_layout
from tempax.generate.sampling import inverse_cdf_sample, row_keys
from tempax.models.cache import KVCache, kv_bytes_per_position
from tempax.models.decoder import Decoder
from tempax.parallel.process import host_array

TOP_LOGPROBS = 5  # alternatives `score` returns per position (OpenAI's completions allow at most 5)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class SlotState:
    """The decode state of every slot; the cache's leaves carry a leading slot axis over batch-1 caches.

    Attributes:
      cache: KVCache with k, v [B, L, 1, K, S, H], segment_ids [B, 1, S], length [B], next_position [B, 1].
      last_token: [B] the token each slot feeds next.
      step: [B] int32 tokens the slot's row has generated.
      done: [B] bool: finished, or free.
      tokens: [B, S] completion tokens; logprobs, raw_logprobs: [B, S] log p_tau and log p_1 of each.
    """

    cache: KVCache
    last_token: jax.Array
    step: jax.Array
    done: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    raw_logprobs: jax.Array


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class SlotKnobs:
    """Per-slot sampling values [B], all traced (host NumPy arrays, rewritten when a row joins)."""

    temperature: jax.Array  # float32, 1 on greedy rows
    top_p: jax.Array  # float32, 1 = off
    min_p: jax.Array  # float32, 0 = off
    top_k: jax.Array  # int32, vocabulary size = off
    greedy: jax.Array  # bool
    limit: jax.Array  # int32 max_new_tokens
    seed: jax.Array  # uint32
    sample: jax.Array  # int32 sample index within the request (n)
    stream: jax.Array  # int32 the request's prompt index in a batch of prompts (0 for a served request)
    turn: jax.Array  # int32 turns the row has continued (`extend`): each folds its stream once more
    stop_ids: jax.Array  # [K] int32, -1 = unused
    pad_id: jax.Array  # int32 scalar


def sample_rows(logits_bv: jax.Array, u_b: jax.Array, knobs: SlotKnobs) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One token per row with each row's own filter: argmax, the plain tempered distribution (with min-p), or the
    vocabulary sorted by probability cut by the row's top-k, then top-p (over the top-k mass), then min-p.

    The same draws as `sample_from_logits` with the row's own static spec: inverse CDF with the row's uniform
    `u_b` over the filtered weights, in vocabulary order unless a top-p or top-k filter is on (then in sorted
    order). Returns tokens [B], log p_tau [B] (log p_1 on greedy rows) and log p_1 [B] over the whole vocabulary.

    The knobs are per slot and traced, and so is the choice of filter: a slot's token comes from the plain
    distribution, the sorted-vocabulary path (top-p or top-k) or the argmax, picked per row (the sort runs only in
    steps where some row needs it). With each row's own random stream (`_uniforms`, as `DecodeRun` draws a
    request's: `row_keys(seed, 0, sample)`, folded with the row's step), a row's tokens depend only on its own
    request (prompt, knobs, seed), never on what else is decoding, so a request gives what `generate` gives alone
    (top-k rows: the same distribution; its candidates are cut from the sorted vocabulary rather than by
    `lax.top_k`).
    """
    z = logits_bv.astype(jnp.float32)
    b, v = z.shape
    scaled = z / knobs.temperature[:, None]
    plain = jax.nn.softmax(scaled, axis=-1)
    plain = jnp.where(plain >= knobs.min_p[:, None] * jnp.max(plain, axis=-1, keepdims=True), plain, 0.0)
    tokens = inverse_cdf_sample(plain, u_b)
    needs_sort = ~knobs.greedy & ((knobs.top_p < 1.0) | (knobs.top_k < v))

    def sorted_tokens() -> jax.Array:
        neg, ids = jax.lax.sort_key_val(-scaled, jnp.broadcast_to(jnp.arange(v, dtype=jnp.int32), (b, v)))
        rank = jnp.arange(v)[None, :]
        zs = jnp.where(rank < knobs.top_k[:, None], -neg, -jnp.inf)
        probs = jax.nn.softmax(zs, axis=-1)
        keep = ((jnp.cumsum(probs, axis=-1) - probs) < knobs.top_p[:, None]) | (rank == 0)
        keep &= probs >= knobs.min_p[:, None] * probs[:, :1]
        choice = inverse_cdf_sample(jnp.where(keep, probs, 0.0), u_b)
        return jnp.take_along_axis(ids, choice[:, None], axis=-1)[:, 0]

    tokens = jnp.where(needs_sort, jax.lax.cond(jnp.any(needs_sort), sorted_tokens, lambda: tokens), tokens)
    tokens = jnp.where(knobs.greedy, jnp.argmax(z, axis=-1).astype(jnp.int32), tokens).astype(jnp.int32)
    pick = lambda x: jnp.take_along_axis(x, tokens[:, None], axis=-1)[:, 0] - jax.nn.logsumexp(x, axis=-1)
    raw = pick(z)
    return tokens, jnp.where(knobs.greedy, raw, pick(scaled)), raw


def _uniforms(knobs: SlotKnobs, steps: jax.Array) -> jax.Array:
    """[B] numbers in (0, 1]: row b's stream `row_keys(seed, stream, sample)`, folded with 1, 2, ..., turn (as
    `DecodeRun.continue_with` folds a row's key once per turn), then with its own step, as `row_uniforms` draws a
    `DecodeRun` row's."""
    keys = row_keys(knobs.seed, knobs.stream, knobs.sample)

    def draw(key: jax.Array, turn: jax.Array, step: jax.Array) -> jax.Array:
        key = jax.lax.fori_loop(1, turn + 1, lambda t, k: jax.random.fold_in(k, t), key)
        return jax.random.uniform(jax.random.fold_in(key, step), (), jnp.float32)

    return 1.0 - jax.vmap(draw)(keys, knobs.turn, steps)


def _stack_rows(cache: KVCache) -> KVCache:
    """A batch-B cache as B batch-1 caches stacked on a leading slot axis."""
    # [L, B, ...] -> [B, L, 1, ...]
    slot_major = lambda x: None if x is None else jnp.moveaxis(x, 1, 0)[:, :, None]  # noqa: E731
    return KVCache(k=slot_major(cache.k), v=slot_major(cache.v),
                   segment_ids=cache.segment_ids[:, None], length=jnp.broadcast_to(cache.length, cache.batch_size),
                   next_position=cache.next_position[:, None], conv=slot_major(cache.conv),
                   state=slot_major(cache.state))


def _init(config: Any, slots: int, cache_len: int, pad_id: jax.Array) -> SlotState:
    """Every slot free (done), its cache empty."""
    cache = _stack_rows(KVCache.init(config, slots, cache_len))
    zeros = lambda dtype: jnp.zeros((slots, cache_len), dtype)
    return SlotState(cache=cache, last_token=jnp.full((slots,), pad_id, jnp.int32),
                     step=jnp.zeros((slots,), jnp.int32), done=jnp.ones((slots,), bool),
                     tokens=jnp.full((slots, cache_len), pad_id, jnp.int32), logprobs=zeros(jnp.float32),
                     raw_logprobs=zeros(jnp.float32))


def _decode(graphdef: Any, params: Any, state: SlotState, steps: jax.Array, knobs: SlotKnobs, *,
            layout: bool) -> SlotState:
    """Up to `steps` tokens for every live slot, stopping early when all slots are done."""
    model = _merge(graphdef, params)
    rows = jnp.arange(state.step.shape[0])
    width = state.tokens.shape[1]

    def one_slot(token: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        logits, cache = _call_model(model, token.reshape(1, 1), jnp.ones((1, 1), jnp.int32), cache, layout)
        return logits[0], cache

    def cond(carry: tuple[jax.Array, SlotState]) -> jax.Array:
        i, s = carry
        return (i < steps) & ~jnp.all(s.done)

    def body(carry: tuple[jax.Array, SlotState]) -> tuple[jax.Array, SlotState]:
        i, s = carry
        logits, cache = jax.vmap(one_slot)(s.last_token, s.cache)
        cache = cache.keeping_linear_state(s.cache, s.done, axis=0)  # slot-major: [B, L, 1, ...]
        tok, lp, raw = sample_rows(logits, _uniforms(knobs, s.step), knobs)
        active = ~s.done
        tok = jnp.where(active, tok, knobs.pad_id)
        column = jnp.where(active, s.step, width)  # done rows write nothing (an out-of-range column is dropped)
        write = lambda buf, x: buf.at[rows, column].set(x.astype(buf.dtype), mode="drop")
        step = s.step + active.astype(jnp.int32)
        stopped = active & (_is_stop(tok, knobs.stop_ids) | (step >= knobs.limit) | (step >= width))
        return i + 1, SlotState(cache=cache, last_token=tok, step=step, done=s.done | stopped,
                                tokens=write(s.tokens, tok), logprobs=write(s.logprobs, lp),
                                raw_logprobs=write(s.raw_logprobs, raw))

    return jax.lax.while_loop(cond, body, (jnp.int32(0), state))[1]


def _prefill(graphdef: Any, params: Any, tokens: jax.Array, segment_ids: jax.Array, score: jax.Array):
    """One prompt [1, P] (left-padded) into a fresh batch-1 cache of P slots, with its next-token logits [1, V].

    Where `score` is true it also scores the prompt itself (one program serves both, so serving compiles the
    decoder once per prompt bucket; the head over every position runs only then): entry t of the [P] log-probs
    is log p(token t | tokens < t) (entry 0 is 0: nothing precedes it), with the TOP_LOGPROBS most likely
    tokens at each position and their log-probs.
    """
    model = _merge(graphdef, params)
    hidden, cache = model.hidden_states(tokens, segment_ids=segment_ids,
                                        cache=KVCache.init(model.config, 1, tokens.shape[1]))
    logits = model.logits(hidden[:, -1:])[:, -1].astype(jnp.float32)
    p = tokens.shape[1]

    def scores() -> tuple[jax.Array, jax.Array, jax.Array]:
        logp = jax.nn.log_softmax(model.logits(hidden)[0].astype(jnp.float32), axis=-1)  # row t predicts t + 1
        chosen = jnp.take_along_axis(logp[:-1], tokens[0, 1:, None], axis=-1)[:, 0]
        top_lp, top_ids = jax.lax.top_k(logp[:-1], TOP_LOGPROBS)
        pad = lambda x: jnp.concatenate([jnp.zeros_like(x[:1]), x])
        return pad(chosen), pad(top_ids.astype(jnp.int32)), pad(top_lp)

    nothing = lambda: (jnp.zeros((p,), jnp.float32), jnp.zeros((p, TOP_LOGPROBS), jnp.int32),
                       jnp.zeros((p, TOP_LOGPROBS), jnp.float32))
    return cache, logits, jax.lax.cond(score, scores, nothing)


def _first(logits: jax.Array, knobs: SlotKnobs) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Token 0 of every slot from a prompt's logits [1, V], each with its own knobs (`_insert` keeps the
    joining rows')."""
    slots = knobs.seed.shape[0]
    return sample_rows(jnp.broadcast_to(logits, (slots, logits.shape[-1])),
                       _uniforms(knobs, jnp.zeros((slots,), jnp.int32)), knobs)


def _insert(state: SlotState, row: KVCache, first: jax.Array, lp: jax.Array, raw: jax.Array, prompt_len: jax.Array,
            targets: jax.Array, knobs: SlotKnobs) -> SlotState:
    """Copies a prefilled row into every slot where `targets` [B] is true, each starting its completion with its
    own token 0. The prompt's `prompt_len` real tokens (right-aligned in the prefill's P slots) move to the
    slot's first positions and its next write goes right after them, so a row takes prompt + completion slots
    whatever its prompt's bucket; the rest of the slot is masked out (segment 0)."""
    width = state.tokens.shape[1]
    shift = row.max_len - prompt_len
    left = lambda x: jnp.roll(x, -shift, axis=-2)  # noqa: E731 - [L, 1, K, P, H]: the real tokens first
    k, v = left(row.k), left(row.v)
    segments = jnp.zeros((1, width), jnp.int32).at[:, : row.max_len].set(jnp.roll(row.segment_ids, -shift, axis=-1))
    order = jnp.argsort(~targets)  # the target slots first

    def put(i: jax.Array, cache: KVCache) -> KVCache:
        b = order[i]
        into = lambda buf, x: (None if buf is None  # noqa: E731
                               else jax.lax.dynamic_update_slice(buf, x[None].astype(buf.dtype), (b,) + (0,) * x.ndim))
        # a linear-attention state is the prompt's whatever its slots: it moves as it is
        return KVCache(k=into(cache.k, k), v=into(cache.v, v),
                       segment_ids=into(cache.segment_ids, segments), length=cache.length.at[b].set(prompt_len),
                       next_position=cache.next_position.at[b].set(row.next_position),
                       conv=into(cache.conv, row.conv), state=into(cache.state, row.state))

    cache = jax.lax.fori_loop(0, jnp.sum(targets), put, state.cache)
    fresh = lambda buf, x, empty: jnp.where(targets[:, None], jnp.full_like(buf, empty).at[:, 0].set(x), buf)
    done = _is_stop(first, knobs.stop_ids) | (knobs.limit <= 1)
    return SlotState(cache=cache, last_token=jnp.where(targets, first, state.last_token),
                     step=jnp.where(targets, 1, state.step), done=jnp.where(targets, done, state.done),
                     tokens=fresh(state.tokens, first, knobs.pad_id), logprobs=fresh(state.logprobs, lp, 0.0),
                     raw_logprobs=fresh(state.raw_logprobs, raw, 0.0))


def _extend(graphdef: Any, params: Any, state: SlotState, slot: jax.Array, tokens: jax.Array, count: jax.Array,
            keep: jax.Array, knobs: SlotKnobs) -> SlotState:
    """The next turn of the row in `slot`: its cache keeps its first `keep` positions (what the row has fed so far;
    positions a finished row was fed padding in since are masked out), then takes the `count` new tokens of
    `tokens` [1, W] (right-padded) at positions keep, keep + 1, ...; the row's next token is sampled from the last
    new token's logits with its own knobs (its `turn` already counted), and its completion buffers restart.

    Positions equal cache indices in a slot (`_insert` puts the prompt first), so the row sees exactly its
    conversation so far, as a prefill of the whole conversation would. The padding after the new tokens is
    written with segment 0 and overwritten by the next decode steps (the write index goes on from keep + count).
    """
    model = _merge(graphdef, params)
    cache = state.cache
    take = lambda x: None if x is None else jax.lax.dynamic_index_in_dim(x, slot, axis=0, keepdims=False)
    segments = take(cache.segment_ids)
    row = KVCache(k=take(cache.k), v=take(cache.v),
                  segment_ids=jnp.where(jnp.arange(segments.shape[-1])[None] < keep, segments, 0),
                  length=keep, next_position=jnp.full((1,), keep, jnp.int32), conv=take(cache.conv),
                  state=take(cache.state))
    width = tokens.shape[1]
    new_segments = (jnp.arange(width)[None] < count).astype(jnp.int32)
    hidden, row = model.hidden_states(tokens, segment_ids=new_segments, cache=row)
    last = jax.lax.dynamic_slice_in_dim(hidden, count - 1, 1, axis=1)
    logits = model.logits(last)[:, -1].astype(jnp.float32)
    first, lp, raw = _first(logits, knobs)
    put = lambda buf, x: None if buf is None else jax.lax.dynamic_update_index_in_dim(buf, x.astype(buf.dtype), slot,
                                                                                       axis=0)
    cache = KVCache(k=put(cache.k, row.k), v=put(cache.v, row.v),
                    segment_ids=put(cache.segment_ids, row.segment_ids), length=cache.length.at[slot].set(keep + count),
                    next_position=put(cache.next_position, row.next_position), conv=put(cache.conv, row.conv),
                    state=put(cache.state, row.state))
    width_out = state.tokens.shape[1]
    fresh = lambda buf, x, empty: put(buf, jnp.full((width_out,), empty, buf.dtype).at[0].set(x[slot].astype(buf.dtype)))
    done = _is_stop(first[slot][None], knobs.stop_ids)[0] | (knobs.limit[slot] <= 1)
    return SlotState(cache=cache, last_token=state.last_token.at[slot].set(first[slot]),
                     step=state.step.at[slot].set(1), done=state.done.at[slot].set(done),
                     tokens=fresh(state.tokens, first, knobs.pad_id), logprobs=fresh(state.logprobs, lp, 0.0),
                     raw_logprobs=fresh(state.raw_logprobs, raw, 0.0))


def _grow(state: SlotState, *, cache_len: int) -> SlotState:
    """The same slots in a longer cache (positions appended, masked out)."""
    extra = cache_len - state.tokens.shape[1]
    pad = lambda x, axis, value=0: jnp.pad(x, [(0, extra if a == axis else 0) for a in range(x.ndim)],
                                           constant_values=value)
    cache = state.cache
    cache = dataclasses.replace(cache, k=pad(cache.k, 4), v=pad(cache.v, 4),  # [B, L, 1, K, S, H]
                                segment_ids=pad(cache.segment_ids, 2))
    return dataclasses.replace(state, cache=cache, tokens=pad(state.tokens, 1), logprobs=pad(state.logprobs, 1),
                               raw_logprobs=pad(state.raw_logprobs, 1))


# warm_up's threads at most: each holds a program's compilation in memory, and past a few the threads wait on
# Python's lock (tracing and lowering) more than they compile.
WARM_UP_WORKERS = 4


@dataclass
class SlotRow:
    """What the host knows of one occupied slot."""

    owner: Any  # whatever the caller joined it with (the serve batcher's row record)
    prompt_len: int


class SlotEngine:
    """A continuously batched decode over `slots` rows.

    Each slot has its *own* cache (write index, rotary position, length): the one decoder is applied to every slot
    with `jax.vmap`, so slot b reads and writes only its own [1, K, S, H] buffers. A request joins as soon as a
    slot is free (`join`): its prompt is prefilled alone (batch 1, left-padded to a length bucket) and copied into
    the first slots of the free row's cache; nothing else is re-padded or moved. A row that finishes frees its
    slot at once.

    Args:
      model: a Decoder (or anything with its call signature and a `.config`).
      slots: rows decoded together.
      context: positions per row, prompt + completion; sets the largest cache and prompt buckets.
      stop_ids, pad_id: the tokenizer's.
      decode_layout: as `SamplingConfig.decode_layout`.
      min_cache: the smallest cache bucket (a longer one is grown to when a row needs it).
    """

    def __init__(self, model: Any, *, slots: int, context: int, stop_ids: Sequence[int], pad_id: int,
                 decode_layout: str = "auto", min_cache: int = 64):
        if slots < 1:
            raise GenerationError(f"a slot engine needs at least one slot, got {slots}")
        if not isinstance(model, Decoder):
            raise GenerationError(f"continuous batching runs a tempax Decoder, not a {type(model).__name__}")
        self.model, self.slots, self.context = model, int(slots), int(context)
        self.vocab = int(model.config.vocab_size)
        self._graphdef, self._params = nnx.split(model)
        self._layout = use_decode_layout(model, SamplingConfig(decode_layout=decode_layout))
        self.prompt_buckets = _buckets(context)
        self.cache_buckets = _cache_buckets(min(min_cache, self.prompt_buckets[-1]), self.prompt_buckets[-1])
        stop = np.full((max(8, 1 << (max(len(stop_ids), 1) - 1).bit_length()),), -1, np.int32)
        stop[: len(stop_ids)] = list(stop_ids)
        self.stop_ids = tuple(int(i) for i in stop_ids)
        self.pad_id = int(pad_id)
        b = self.slots
        self._knobs = SlotKnobs(
            temperature=np.ones(b, np.float32), top_p=np.ones(b, np.float32), min_p=np.zeros(b, np.float32),
            top_k=np.full(b, self.vocab, np.int32), greedy=np.ones(b, bool), limit=np.ones(b, np.int32),
            seed=np.zeros(b, np.uint32), sample=np.zeros(b, np.int32), stream=np.zeros(b, np.int32),
            turn=np.zeros(b, np.int32), stop_ids=stop, pad_id=np.int32(pad_id))
        self._programs: dict[tuple, Any] = {}
        self._programs_lock = threading.Lock()  # warm_up's threads record programs, counts and seconds
        self.compiles = 0
        self.compile_s: dict[str, float] = {}  # seconds spent compiling, by program kind
        self.reset()

    # -- programs -------------------------------------------------------------------------------------------------
    def _init_fn(self, cache_len: int):
        return functools.partial(_init, self.model.config, self.slots, cache_len)

    def _compile(self, key: tuple, fn: Any, *args: Any, donate: tuple[int, ...] = ()) -> Any:
        """The program `key`, compiled for these argument shapes (arrays or ShapeDtypeStructs) on first use."""
        program = self._programs.get(key)
        if program is None:
            start = time.perf_counter()
            program = jax.jit(fn, donate_argnums=donate).lower(*args).compile()
            with self._programs_lock:
                self._programs[key] = program
                self.compiles += 1
                self.compile_s[key[0]] = self.compile_s.get(key[0], 0.0) + time.perf_counter() - start
        return program

    def _run(self, key: tuple, fn: Any, *args: Any, donate: tuple[int, ...] = ()) -> Any:
        """Calls the program `key` (compiling it on first use: `warm_up` compiles them all ahead)."""
        return self._compile(key, fn, *args, donate=donate)(*args)

    def _decode_call(self, steps: int) -> None:
        fn = functools.partial(_decode, self._graphdef, layout=self._layout)
        self._state = self._run(("decode", self.cache_len), fn, self._params, self._state, np.int32(steps),
                                self._knobs, donate=(1,))

    def warm_up(self, workers: int | None = None) -> int:
        """Compiles every program serving can call, for all buckets, from shapes alone (nothing runs); returns
        how many compiled. `workers`: programs compiled at once, each on its own thread (default: the CPU count,
        at most `WARM_UP_WORKERS`); 1 compiles them one after another.

        The programs, for the engine's buckets (prompt lengths, cache lengths): the decode step for each cache
        length, the prefill for each prompt length, the copy of a prefilled row into a slot for each pair, and
        growing the cache to a longer bucket; prompt scoring (`score`: prompt-token log-probs) runs inside the
        prefill program, under `lax.cond`. `compiles` counts what this engine compiled. Threads help because XLA
        compiles each program on one core and lets go of Python's lock while it does, so a server's start-up
        waits for the slowest thread rather than the sum (the figures: docs/measurements/continuous-batching.md).
        """
        before = self.compiles
        knobs = self._knobs
        prompt = lambda p: jax.ShapeDtypeStruct((1, p), jnp.int32)
        rows = {}
        programs: list[tuple[tuple, Any, tuple, tuple[int, ...]]] = []  # (key, fn, argument shapes, donated)
        for p in self.prompt_buckets:
            fn = functools.partial(_prefill, self._graphdef)
            rows[p] = jax.eval_shape(fn, self._params, prompt(p), prompt(p), np.bool_(False))
            programs.append((("prefill", p), fn, (self._params, prompt(p), prompt(p), np.bool_(False)), ()))
        first = jax.eval_shape(_first, rows[self.prompt_buckets[0]][1], knobs)
        programs.append((("first",), _first, (rows[self.prompt_buckets[0]][1], knobs), ()))
        targets = jax.ShapeDtypeStruct((self.slots,), jnp.bool_)
        decode = functools.partial(_decode, self._graphdef, layout=self._layout)
        for i, s in enumerate(self.cache_buckets):
            state = jax.eval_shape(self._init_fn(s), knobs.pad_id)
            # The slowest (the decode steps) first, so the threads do not end on one of them.
            programs.insert(0, (("decode", s), decode, (self._params, state, np.int32(0), knobs), (1,)))
            programs.append((("init", s), self._init_fn(s), (knobs.pad_id,), ()))
            for p in self.prompt_buckets:
                if p <= s:
                    programs.append((("insert", s, p), _insert,
                                     (state, rows[p][0], *first, np.int32(1), targets, knobs), (0,)))
            for bigger in self.cache_buckets[i + 1:]:
                programs.append((("grow", s, bigger), functools.partial(_grow, cache_len=bigger), (state,), ()))
        compile_one = lambda program: self._compile(program[0], program[1], *program[2], donate=program[3])
        workers = workers or min(os.cpu_count() or 1, WARM_UP_WORKERS)
        if workers == 1:
            for program in programs:
                compile_one(program)
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="tempax-compile") as pool:
                list(pool.map(compile_one, programs))  # list(): a failed compile raises here
        return self.compiles - before

    def _prefill_call(self, tokens: np.ndarray, segments: np.ndarray, score: bool):
        return self._run(("prefill", tokens.shape[1]), functools.partial(_prefill, self._graphdef), self._params,
                         tokens, segments, np.bool_(score))

    # -- rows -----------------------------------------------------------------------------------------------------
    def free_slots(self) -> int:
        return sum(r is None for r in self.rows)

    def live(self) -> int:
        return self.slots - self.free_slots()

    def need(self, prompt_len: int, max_new_tokens: int) -> int:
        """Cache positions a row takes: its prompt's bucket while it is prefilled, then prompt + completion."""
        return max(slot_bucket(prompt_len), prompt_len + max_new_tokens)

    def fits(self, prompt_len: int, max_new_tokens: int) -> bool:
        """Whether a row can ever run here (its need within the largest cache bucket)."""
        return self.need(prompt_len, max_new_tokens) <= self.cache_buckets[-1]

    def join(self, prompt_ids: Sequence[int], configs: Sequence[SamplingConfig], owners: Sequence[Any], *,
             stream: int = 0, extra: int = 0) -> list[int]:
        """Starts one row per config (`n` samples of one prompt: config j draws as sample j) in free slots, from
        one prefill of the prompt; returns their slots. The caller checks there are enough free slots.

        `stream`: the prompt's index in a batch of prompts, so that its rows draw what `DecodeRun` draws for that
        prompt. `extra`: cache positions the rows will take beyond prompt + completion (later turns, `extend`)."""
        free = [i for i, r in enumerate(self.rows) if r is None][: len(configs)]
        longest = max(c.max_new_tokens for c in configs) + extra
        if len(free) < len(configs) or not self.fits(len(prompt_ids), longest):
            raise GenerationError(f"{len(configs)} rows of a {len(prompt_ids)}-token prompt do not fit the free slots")
        need = self.need(len(prompt_ids), longest)
        if need > self.cache_len:
            self._resize(next(s for s in self.cache_buckets if s >= need))
        k = self._knobs
        for j, (slot, c) in enumerate(zip(free, configs)):
            k.temperature[slot] = 1.0 if c.greedy else c.temperature
            k.top_p[slot], k.min_p[slot] = c.top_p, c.min_p
            k.top_k[slot] = c.top_k if 0 < c.top_k < self.vocab else self.vocab
            k.greedy[slot], k.limit[slot] = c.greedy, c.max_new_tokens
            k.seed[slot], k.sample[slot] = np.uint32(c.seed), j
            k.stream[slot], k.turn[slot] = stream, 0
        p = slot_bucket(len(prompt_ids))
        tokens, segments = np.full((1, p), self.pad_id, np.int32), np.zeros((1, p), np.int32)
        tokens[0, p - len(prompt_ids):], segments[0, p - len(prompt_ids):] = prompt_ids, 1
        row, logits, _ = self._prefill_call(tokens, segments, score=False)
        first, lp, raw = self._run(("first",), _first, logits, self._knobs)
        targets = np.zeros(self.slots, bool)
        targets[free] = True
        self._state = self._run(("insert", self.cache_len, p), _insert, self._state, row, first, lp, raw,
                                np.int32(len(prompt_ids)), targets, self._knobs, donate=(0,))
        for slot, owner in zip(free, owners):
            self.rows[slot] = SlotRow(owner, len(prompt_ids))
            self._fed[slot] = len(prompt_ids)
        self._done = host_array(self._state.done)
        return free

    def extend(self, slot: int, new_ids: Sequence[int]) -> None:
        """Continues the finished row in `slot` with a next turn: its reply's last token (sampled, never fed) and
        `new_ids` (e.g. a tool result and the next assistant header) are prefilled into the slot's cache, and the
        row decodes its next reply from there with the same knobs (its random stream folded once more, as
        `DecodeRun.continue_with` folds it). Only this row's new tokens are computed; other rows keep decoding.
        """
        if self.rows[slot] is None:
            raise GenerationError(f"slot {slot} holds no row to continue")
        steps = int(host_array(self._state.step)[slot])
        if steps < 1 or not self._done[slot]:
            raise GenerationError(f"slot {slot}'s row has not finished its turn")
        last = int(host_array(self._state.tokens)[slot, steps - 1])
        inputs = [last, *(int(t) for t in new_ids)]
        keep = self._fed[slot] + steps - 1  # the prompt and every fed token; the last sampled one is fed now
        width = slot_bucket(len(inputs))
        need = keep + max(width, len(inputs) + int(self._knobs.limit[slot]))
        if need > self.cache_buckets[-1]:
            raise GenerationError(f"the next turn needs {need} cache positions but the engine holds "
                                  f"{self.cache_buckets[-1]}; build it with a longer context")
        if need > self.cache_len:
            self._resize(next(s for s in self.cache_buckets if s >= need))
        tokens = np.full((1, width), self.pad_id, np.int32)
        tokens[0, : len(inputs)] = inputs
        self._knobs.turn[slot] += 1
        fn = functools.partial(_extend, self._graphdef)
        self._state = self._run(("extend", self.cache_len, width), fn, self._params, self._state, np.int32(slot),
                                tokens, np.int32(len(inputs)), np.int32(keep), self._knobs, donate=(1,))
        self._fed[slot] = keep + len(inputs)
        self._done = host_array(self._state.done)

    def load(self, model: Any) -> None:
        """Decodes with `model`'s weights from now on (an updated policy of the same structure reuses every
        compiled program; another structure starts a fresh program table)."""
        graphdef, params = nnx.split(model)
        if graphdef != self._graphdef:
            self._programs.clear()
            self._graphdef = graphdef
        self.model, self._params = model, params

    def unload(self) -> None:
        """Lets go of the weights (a rollout engine kept between training steps must not keep an old policy's
        arrays alive); `load` gives it the next ones."""
        self.model = self._params = None

    def _resize(self, cache_len: int) -> None:
        if self.live() == 0:  # nothing to keep: start over at the size asked for
            self._state = self._run(("init", cache_len), self._init_fn(cache_len), self._knobs.pad_id)
        else:
            self._state = self._run(("grow", self.cache_len, cache_len), functools.partial(_grow, cache_len=cache_len),
                                    self._state)
        self.cache_len = cache_len

    def reset(self) -> None:
        """Every slot free and the cache back to its smallest bucket (after a failed step: a donated state may be
        gone)."""
        self.rows: list[SlotRow | None] = [None] * self.slots
        self._fed = [0] * self.slots  # cache positions each row has fed (prompt, tokens, continued turns)
        self.cache_len = self.cache_buckets[0]
        self._state = self._run(("init", self.cache_len), self._init_fn(self.cache_len), self._knobs.pad_id)
        self._done = np.ones(self.slots, bool)

    def release(self, slots: Sequence[int]) -> None:
        """Frees the slots (their rows ended or were cut at a stop string); they decode nothing more. An empty
        engine shrinks back to its smallest cache."""
        for s in slots:
            self.rows[s] = None
        done = self._done.copy()
        done[list(slots)] = True
        self._done = done
        self._state = dataclasses.replace(self._state, done=done)
        if self.live() == 0 and self.cache_len != self.cache_buckets[0]:
            self._resize(self.cache_buckets[0])

    def advance(self, steps: int) -> None:
        """Decodes up to `steps` tokens in every live slot (fewer when all are done)."""
        if self.live() and not self._done.all():
            self._decode_call(steps)
            self._done = host_array(self._state.done)

    def snapshot(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Host copies of (tokens [B, S], lengths [B], done [B])."""
        return host_array(self._state.tokens), host_array(self._state.step), self._done.copy()

    def raw_logprobs(self) -> np.ndarray:
        return host_array(self._state.raw_logprobs)

    def logprobs(self) -> np.ndarray:
        """[B, S] the sampling-time log p_tau of each slot's tokens this turn (log p_1 on greedy rows)."""
        return host_array(self._state.logprobs)

    def score(self, prompt_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(log p of each prompt token given those before [T] (entry 0 is 0), top ids [T, 5], their log-probs
        [T, 5]) for one prompt, from one forward pass."""
        p = slot_bucket(len(prompt_ids))
        if p > self.prompt_buckets[-1]:
            raise GenerationError(f"a {len(prompt_ids)}-token prompt exceeds the context of {self.context}")
        tokens, segments = np.full((1, p), self.pad_id, np.int32), np.zeros((1, p), np.int32)
        tokens[0, p - len(prompt_ids):], segments[0, p - len(prompt_ids):] = prompt_ids, 1
        chosen, ids, lps = (host_array(x)[p - len(prompt_ids):] for x in self._prefill_call(tokens, segments, True)[2])
        chosen = chosen.copy()
        chosen[0] = 0.0
        return chosen, ids, lps


def slot_bucket(n: int, minimum: int = 16) -> int:
    """Prompt lengths here are powers of two (>= 16): fewer programs to compile ahead than `bucket_length`'s finer
    steps above 512, at most twice the positions. Cache lengths add the steps between (`cache_bucket`)."""
    return 1 << (max(int(n), minimum) - 1).bit_length()


def cache_bucket(n: int, minimum: int = 16) -> int:
    """The cache length a row of `n` positions decodes in: the next power of two or the step half-way to it (16,
    24, 32, 48, 64, 96, ...). A decode step reads every position of its cache bucket, and at many rows the cache,
    not the weights, is most of what a step reads, so a row of 342 positions (a GSM8K prompt and a 192-token
    reply) reads 384 rather than 512; the buckets are twice as many as powers of two alone, so twice the decode
    programs to compile ahead, at most 1.5 times the positions needed."""
    power = slot_bucket(n, minimum)
    middle = 3 * power // 4
    return middle if minimum <= middle and n <= middle else power


def _cache_buckets(smallest: int, largest: int) -> list[int]:
    """Every `cache_bucket` value from the one holding `smallest` to `largest` (a power of two)."""
    out = [cache_bucket(smallest)]
    while out[-1] < largest:
        out.append(cache_bucket(out[-1] + 1))
    return out


def _buckets(limit: int) -> list[int]:
    """Every `slot_bucket` value up to the one holding `limit`."""
    out = [slot_bucket(1)]
    while out[-1] < limit:
        out.append(out[-1] * 2)
    return out
