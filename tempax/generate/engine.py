"""The decode engine: one prefill pass, then a jitted `while_loop` over a preallocated KV cache.

A new request rarely compiles anything new (shapes are bucketed, sampling values and the model's arrays are
traced: `DecodeRun` says how), and the decode loop runs entirely on device, with no host round-trip per token.
`DecodeRun` is one request in progress: its callers advance it in chunks (`advance`) and continue it with the
next turn of a multi-turn rollout (`continue_with`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from dataclasses import dataclass
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tempax import ops
from tempax.errors import GenerationError
from tempax.generate.config import SamplingConfig
from tempax.generate.program_store import decode_key, default_store, program_key, single_device
from tempax.generate.sampling import SamplerSpec, row_keys, row_uniforms, sample_from_logits
from tempax.models.cache import KVCache, kv_bytes_per_position, linear_state_bytes
from tempax.models.decoder import Decoder
from tempax.parallel.process import host_array
from tempax.parallel.rules import shard
from tempax.runtime.host_memory import available_memory, release_free_heap

_TRACES: collections.Counter[str] = collections.Counter()
# (prefill, decode) executables this process took from (or put in) the program store, by prefill key.
_STORED: dict[str, tuple[Any, Any]] = {}


def compile_counts() -> dict[str, int]:
    """How many times the prefill and decode functions have been traced (each trace is one compilation), so tests
    and benchmarks can check that a second call compiles nothing."""
    return dict(_TRACES)


def bucket_length(n: int, minimum: int = 16) -> int:
    """Smallest bucket >= n: powers of two up to 512, then multiples of 256 (bounded padding waste)."""
    n = max(int(n), minimum)
    if n <= 512:
        return 1 << (n - 1).bit_length()
    return -(-n // 256) * 256


def bucket_batch(n: int) -> int:
    return 1 << (max(int(n), 1) - 1).bit_length()


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class DecodeState:
    """Everything the decode loop carries; rows are (prompt, sample) pairs, prompt-major.

    Attributes:
      cache: the KV cache of every row.
      last_token: [B] the token to feed next.
      step: int32 scalar, tokens generated so far (shared by all rows).
      done: [B] bool, the row has finished (stop token, stop string, or a padding row).
      lengths: [B] int32, tokens in the row's completion (including its stop token).
      tokens: [B, C] int32 completion tokens, pad id after each row's end.
      logprobs: [B, C] float32 log p_tau of each token; raw_logprobs: [B, C] log p_1.
      keys: [B] typed PRNG keys, one stream per row.
    """

    cache: KVCache
    last_token: jax.Array
    step: jax.Array
    done: jax.Array
    lengths: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    raw_logprobs: jax.Array
    keys: jax.Array


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class _Knobs:
    """Traced sampling values, one per row (changing them never recompiles), so requests with different knobs
    share one batch (`DecodeRun`'s `prompt_configs`, used by `tempax serve`); only the choice of greedy / which
    filters run is static (`SamplerSpec`).

    A row whose filter is off while another row's is on gets a threshold that keeps every token: top_p 2 (no
    prefix mass reaches it), min_p 0.
    """

    temperature: jax.Array  # [B, 1] float32 (1 on greedy rows)
    top_p: jax.Array  # [B, 1] float32
    min_p: jax.Array  # [B, 1] float32
    greedy: jax.Array  # [B] bool, the row takes the argmax (used when spec.greedy_rows)
    limit: jax.Array  # [B] int32, the row's max_new_tokens
    stop_ids: jax.Array  # [K] int32, -1 = unused slot
    pad_id: jax.Array


def _merge(graphdef: Any, params: Any) -> Any:
    """The model rebuilt from its arrays inside a trace, in eval mode: generation never applies dropout (e.g. a
    LoRA adapter's), whatever mode the caller's model is in. The caller's model object is not touched."""
    model = nnx.merge(graphdef, params)
    model.eval()
    return model


def _call_model(model: Any, tokens: jax.Array, segment_ids: jax.Array | None, cache: KVCache, layout: bool = False,
                fresh: bool = False):
    """Next-token logits [B, V] at the last position (a tempax Decoder skips the LM head elsewhere); `layout`: the
    Decoder's `decode_layout` (see `use_decode_layout`); `fresh`: the cache is empty (the Decoder's
    `fresh_cache`)."""
    if isinstance(model, Decoder):
        logits, cache = model(tokens, segment_ids=segment_ids, cache=cache, last_only=True, decode_layout=layout,
                              fresh_cache=fresh)
    else:
        logits, cache = model(tokens, segment_ids=segment_ids, cache=cache)
    return logits[:, -1].astype(jnp.float32), cache


def _shard_cache(cache: KVCache) -> KVCache:
    kv = lambda x: shard(x, (None, "batch", "act_kv_heads", None, None))  # noqa: E731 - [L, B, K, S, H]
    return dataclasses.replace(
        cache,
        k=kv(cache.k),
        v=kv(cache.v),
        segment_ids=shard(cache.segment_ids, ("batch", None)),
    )


def _sample(logits, keys, step, knobs: _Knobs, spec: SamplerSpec):
    u = None if spec.greedy else row_uniforms(keys, step)
    tok, lp, raw = sample_from_logits(
        logits, u, spec, temperature=knobs.temperature, top_p=knobs.top_p, min_p=knobs.min_p
    )
    if spec.greedy_rows:  # greedy rows report log p_1 for both, as an all-greedy batch does
        tok = jnp.where(knobs.greedy, jnp.argmax(logits, axis=-1).astype(jnp.int32), tok)
        if spec.logprobs:
            raw = jnp.where(knobs.greedy, jax.nn.log_softmax(logits, axis=-1)[jnp.arange(tok.shape[0]), tok], raw)
            lp = jnp.where(knobs.greedy, raw, lp)
    return tok, lp, raw


def _is_stop(tokens: jax.Array, stop_ids: jax.Array) -> jax.Array:
    return jnp.any(tokens[:, None] == stop_ids[None, :], axis=-1)


@functools.partial(jax.jit, static_argnames=("graphdef", "spec", "n", "cache_len", "completion_len"))
def _prefill(
    graphdef: Any,
    params: Any,
    tokens: jax.Array,
    segment_ids: jax.Array,
    seed: jax.Array,
    prompt_index: jax.Array,
    sample_index: jax.Array,
    live: jax.Array,
    knobs: _Knobs,
    *,
    spec: SamplerSpec,
    n: int,
    cache_len: int,
    completion_len: int,
) -> DecodeState:
    """Runs the prompts [P, T] once, repeats the cache n times, samples token 0 of every row."""
    _TRACES["prefill"] += 1
    keys = row_keys(seed, prompt_index, sample_index)
    model = _merge(graphdef, params)
    cache = _shard_cache(KVCache.init(model.config, tokens.shape[0], cache_len))
    logits, cache = _call_model(model, tokens, segment_ids, cache, fresh=True)
    if n > 1:
        logits = jnp.repeat(logits, n, axis=0)
        cache = _shard_cache(cache.repeat(n))
    return _first_token_state(cache, logits, keys, live, knobs, spec, completion_len)


def _first_token_state(cache, logits, keys, live, knobs: _Knobs, spec: SamplerSpec, completion_len: int) -> DecodeState:
    """The state after sampling a turn's token 0 from `logits` [B, V]: fresh completion buffers; rows not `live`
    are born done."""
    first, lp, raw = _sample(logits, keys, jnp.int32(0), knobs, spec)
    rows = first.shape[0]
    first = jnp.where(live, first, knobs.pad_id)
    buf = lambda value, dtype: jnp.full((rows, completion_len), value, dtype)
    return DecodeState(
        cache=cache,
        last_token=first,
        step=jnp.int32(1),
        done=~live | _is_stop(first, knobs.stop_ids) | (knobs.limit <= 1),
        lengths=live.astype(jnp.int32),
        tokens=buf(knobs.pad_id, jnp.int32).at[:, 0].set(first),
        logprobs=buf(0.0, jnp.float32).at[:, 0].set(jnp.where(live, lp, 0.0)),
        raw_logprobs=buf(0.0, jnp.float32).at[:, 0].set(jnp.where(live, raw, 0.0)),
        keys=keys,
    )


def use_decode_layout(model: Any, config: SamplingConfig) -> bool:
    """Whether a request's decode steps use the Decoder's `decode_layout`: asked for, or "auto" where the platform
    prefers it (`tempax.ops.table_on_left_in_decode`)."""
    if config.decode_layout == "off" or not isinstance(model, Decoder):
        return False
    return config.decode_layout == "on" or ops.table_on_left_in_decode()


@functools.partial(jax.jit, static_argnames=("graphdef", "spec", "layout"), donate_argnames=("state",))
def _decode(
    graphdef: Any,
    params: Any,
    state: DecodeState,
    until: jax.Array,
    knobs: _Knobs,
    *,
    spec: SamplerSpec,
    layout: bool,
) -> DecodeState:
    """Generates tokens step by step until `step == until` or every row is done."""
    _TRACES["decode"] += 1
    model = _merge(graphdef, params)
    ones = jnp.ones((state.last_token.shape[0], 1), jnp.int32)

    def cond(s: DecodeState) -> jax.Array:
        return (s.step < until) & ~jnp.all(s.done)

    def body(s: DecodeState) -> DecodeState:
        logits, cache = _call_model(model, s.last_token[:, None], ones, s.cache, layout)
        cache = cache.keeping_linear_state(s.cache, s.done)
        tok, lp, raw = _sample(logits, s.keys, s.step, knobs, spec)
        active = ~s.done
        tok = jnp.where(active, tok, knobs.pad_id)
        write = lambda buf, x: jax.lax.dynamic_update_slice(buf, x[:, None].astype(buf.dtype), (0, s.step))
        lengths = s.lengths + active.astype(jnp.int32)
        return DecodeState(
            cache=cache,
            last_token=tok,
            step=s.step + 1,
            done=s.done | (active & (_is_stop(tok, knobs.stop_ids) | (lengths >= knobs.limit))),
            lengths=lengths,
            tokens=write(s.tokens, tok),
            logprobs=write(s.logprobs, jnp.where(active, lp, 0.0)),
            raw_logprobs=write(s.raw_logprobs, jnp.where(active, raw, 0.0)),
            keys=s.keys,
        )

    return jax.lax.while_loop(cond, body, state)


def _check_prompt_configs(config: SamplingConfig, prompt_configs: Sequence[SamplingConfig] | None, prompts: int) -> None:
    if prompt_configs is None:
        return
    if len(prompt_configs) != prompts:
        raise GenerationError(f"prompt_configs has {len(prompt_configs)} configs for {prompts} prompts: give one each")
    for i, c in enumerate(prompt_configs):
        if (c.n, c.top_k) != (config.n, config.top_k) or c.max_new_tokens > config.max_new_tokens:
            raise GenerationError(
                f"prompt_configs[{i}] has n={c.n}, top_k={c.top_k}, max_new_tokens={c.max_new_tokens}; a batch shares "
                f"n={config.n} and top_k={config.top_k} and runs at most max_new_tokens={config.max_new_tokens}"
            )


# `state` is donated: the new turn's tokens are written into the same cache, which would otherwise be held twice
# while the turn's prefill runs (the CHANGELOG has what it saved on a batch of tool episodes).
@functools.partial(jax.jit, static_argnames=("graphdef", "spec"), donate_argnames=("state",))
def _extend(
    graphdef: Any,
    params: Any,
    state: DecodeState,
    cache_segments: jax.Array,
    next_position: jax.Array,
    tokens: jax.Array,
    segment_ids: jax.Array,
    live: jax.Array,
    turn: jax.Array,
    knobs: _Knobs,
    *,
    spec: SamplerSpec,
) -> DecodeState:
    """Starts the next turn of every row: prefills only the new tokens [B, T] (left-padded) into the existing
    cache, whose slots past each row's kept tokens `cache_segments` has already masked out, at positions from
    `next_position`; samples the turn's token 0 from a stream folded with `turn`. Rows not `live` are born done."""
    _TRACES["extend"] += 1
    model = _merge(graphdef, params)
    cache = _shard_cache(dataclasses.replace(state.cache, segment_ids=cache_segments, next_position=next_position))
    logits, cache = _call_model(model, tokens, segment_ids, cache)
    keys = jax.vmap(lambda k: jax.random.fold_in(k, turn))(state.keys)
    return _first_token_state(cache, logits, keys, live, knobs, spec, state.tokens.shape[1])


def model_context(model: Any, config: SamplingConfig) -> int:
    limit = int(model.config.max_position_embeddings)
    return limit if config.max_len is None else min(limit, int(config.max_len))


def check_cache_fits(config: Any, rows: int, positions: int, available: int | None) -> None:
    """Refuses a decode whose KV cache alone (`rows` x (`positions` x `kv_bytes_per_position` + a hybrid model's
    `linear_state_bytes`)) is larger than the `available` bytes (None: unknown, no check). On a CPU the kernel
    would otherwise kill the process part-way through allocating it, losing the run with no word of why; the error
    names the sizes and what to lower."""
    need = rows * (positions * kv_bytes_per_position(config) + linear_state_bytes(config))
    if available is not None and need > available:
        raise GenerationError(
            f"decoding {rows} rows of {positions} positions needs {need / 2**30:.1f} GiB of KV cache, more than the "
            f"{available / 2**30:.1f} GiB of memory free; decode fewer rows at once (an evaluation's batch size, "
            "prompts x completions per GRPO step) or fewer positions (max_new_tokens, the prompt length)")


def check_prompts(prompt_ids: Sequence[Sequence[int]], config: SamplingConfig, context: int, vocab: int,
                  prompt_configs: Sequence[SamplingConfig] | None = None) -> None:
    """Raises GenerationError for requests that cannot be served, naming the prompt and the fix (`prompt_configs`:
    each prompt's own max_new_tokens)."""
    if len(prompt_ids) == 0:
        raise GenerationError("no prompts given: pass at least one prompt")
    for i, ids in enumerate(prompt_ids):
        if prompt_configs is not None:
            config = prompt_configs[i]
        if len(ids) == 0:
            raise GenerationError(f"prompt {i} is empty: it needs at least one token (e.g. the BOS token)")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise GenerationError(
                f"prompt {i} holds token id {bad[0]}, outside the model's vocabulary [0, {vocab}): was it "
                "tokenised with another model's tokenizer?"
            )
        wider = " (or raise max_len)" if config.max_len else ""
        if len(ids) >= context:  # not even one new token fits: a smaller generation budget cannot help
            raise GenerationError(
                f"prompt {i} has {len(ids)} tokens but the context holds {context}, so no token can follow it. "
                f"Shorten the prompt to fewer than {context} tokens{wider}."
            )
        if len(ids) + config.max_new_tokens > context:
            raise GenerationError(
                f"prompt {i} has {len(ids)} tokens; with max_new_tokens={config.max_new_tokens} it needs "
                f"{len(ids) + config.max_new_tokens} positions but the context holds {context}. Shorten the "
                f"prompt or generate at most {context - len(ids)} new tokens (--max-new-tokens, or max_new_tokens "
                f"in the recipe){wider}."
            )


@dataclass
class DecodeOutput:
    """Host copies of a finished run, rows (prompt i, sample j) at i * n + j; buffers cut to max_new_tokens."""

    tokens: np.ndarray  # [R, T] int32
    logprobs: np.ndarray  # [R, T] float32
    raw_logprobs: np.ndarray  # [R, T] float32
    lengths: np.ndarray  # [R] int32
    stopped: np.ndarray  # [R] bool: ended by a stop token (or marked done by the caller)
    steps: int
    prefill_s: float
    decode_s: float
    compiles: int


class DecodeRun:
    """One batched generation request in progress: prefill on construction, then `advance` in chunks.

    Shapes are bucketed so that a new request rarely compiles anything new:

      * prompts are left-padded to `bucket_length(longest prompt)` (segment id 0 marks padding; all rows share the
        cache write index, see `KVCache`);
      * the number of prompts is rounded up to a power of two (`bucket_batch`; the extra rows are born finished);
      * the completion buffer holds `bucket_length(max_new_tokens)` tokens; the real limit is a traced value, so
        any max_new_tokens within a bucket reuses the same executable.

    The model enters the compiled functions as an argument (`nnx.split` into a static graph definition and a
    state of arrays), never as constants, so a LoRA/QLoRA-wrapped model, a sharded model or a freshly updated
    policy all reuse the executable compiled for their structure. Anything with the `Decoder` call signature
    `model(tokens, segment_ids=..., cache=...) -> (logits, cache)` and a `.config` works.

    Multi-turn rollouts continue a run (`continue_with`), so a turn costs its new tokens, not a re-prefill of the
    conversation; `reserve` sizes the cache for the later turns.

    Args:
      model: a tempax `Decoder` (optionally LoRA-wrapped or sharded) or any nnx model with its call signature.
      prompt_ids: token ids of each prompt (not padded).
      config: the sampling config (n, seed, knobs, max_new_tokens).
      stop_ids: token ids that end a row (empty = none).
      pad_id: id written after a row's end.
      prompt_offset, sample_offset: the (prompt, sample) grid position of this call's first row, for the
        random streams (see `SamplingConfig.seed`).
      prompt_configs: one config per prompt, for a batch of separate requests: each prompt's temperature, top_p,
        min_p, seed and max_new_tokens apply to its rows, and each prompt draws its random stream as prompt 0 of
        its own request, so its samples do not depend on what it was batched with. `config` then gives what the
        batch shares: n, top_k, logprobs, decode_layout, and a max_new_tokens at least every prompt's. A sampled
        row with top_p 1 in a run where another row's top_p is below 1 (and top_k is 0) draws from the vocabulary
        in sorted order: the same distribution, but not the stream it draws alone (`tempax serve` batches them
        apart).
      reserve: cache slots kept free for later turns (`continue_with`): the new tokens of every turn after the
        first, padded, plus max_new_tokens per turn. 0 for single-turn requests.
    """

    def __init__(
        self,
        model: Any,
        prompt_ids: Sequence[Sequence[int]],
        config: SamplingConfig,
        *,
        stop_ids: Sequence[int],
        pad_id: int,
        prompt_offset: int = 0,
        sample_offset: int = 0,
        prompt_configs: Sequence[SamplingConfig] | None = None,
        reserve: int = 0,
    ):
        # Long on purpose: the steps run once, in this order, and each sets state the next reads (checks, the
        # padded batch and its per-row knobs, the cache sized for every turn, the prefill); split into helpers they
        # would pass that state back and forth.
        _check_prompt_configs(config, prompt_configs, len(prompt_ids))
        check_prompts(prompt_ids, config, model_context(model, config), int(model.config.vocab_size), prompt_configs)
        self.config = config
        self.stop_ids = tuple(int(i) for i in stop_ids)
        self.pad_id = int(pad_id)
        self.num_prompts = len(prompt_ids)
        self.n = config.n
        self._compiles_before = self._compiles_released = sum(_TRACES.values())
        release_free_heap()  # before the cache and buffers are allocated (see release_free_heap)
        self._graphdef, self._params = nnx.split(model)
        rows_p = bucket_batch(self.num_prompts)
        per_prompt = list(prompt_configs or [config] * self.num_prompts)
        per_prompt += [per_prompt[0]] * (rows_p - self.num_prompts)  # padding rows (born done) copy a real one
        greedy = np.asarray([c.greedy for c in per_prompt])
        top_p_on = any(c.top_p < 1.0 for c in per_prompt)
        self._spec = SamplerSpec(
            greedy=bool(greedy.all()),
            top_k=config.top_k,
            top_p=top_p_on,
            min_p=any(c.min_p > 0.0 for c in per_prompt),
            logprobs=config.logprobs or any(c.logprobs for c in per_prompt),
            greedy_rows=bool(greedy.any() and not greedy.all()),
        )
        stop = np.full((max(8, bucket_batch(len(stop_ids))),), -1, np.int32)
        stop[: len(stop_ids)] = np.asarray(list(stop_ids), np.int32)
        per_row = lambda values, dtype: np.repeat(np.asarray(values, dtype), self.n)
        self._knobs = _Knobs(
            temperature=per_row([1.0 if c.greedy else c.temperature for c in per_prompt], np.float32)[:, None],
            top_p=per_row([2.0 if c.top_p >= 1.0 and top_p_on else c.top_p for c in per_prompt], np.float32)[:, None],
            min_p=per_row([c.min_p for c in per_prompt], np.float32)[:, None],
            greedy=per_row(greedy, bool),
            limit=per_row([c.max_new_tokens for c in per_prompt], np.int32),
            stop_ids=jnp.asarray(stop),
            pad_id=jnp.int32(pad_id),
        )
        prompt_len = bucket_length(max(len(p) for p in prompt_ids))
        completion_len = bucket_length(config.max_new_tokens)
        tokens = np.full((rows_p, prompt_len), pad_id, np.int32)
        segments = np.zeros((rows_p, prompt_len), np.int32)
        for i, ids in enumerate(prompt_ids):
            tokens[i, prompt_len - len(ids):] = ids
            segments[i, prompt_len - len(ids):] = 1
        # Padding rows get one real token so no row attends to nothing; they are born done.
        segments[self.num_prompts:, -1] = 1
        n = self.n
        prompt_index = np.repeat(np.arange(rows_p), n) + prompt_offset
        if prompt_configs is not None:
            prompt_index = np.zeros_like(prompt_index)  # each prompt is prompt 0 of its own request
        sample_index = np.tile(np.arange(n), rows_p) + sample_offset
        live = np.repeat(np.arange(rows_p) < self.num_prompts, n)
        seeds = per_row([c.seed for c in per_prompt], np.uint32)
        start = time.perf_counter()
        self._layout = use_decode_layout(model, config)  # decode steps only: prefill multiplies whole prompts
        args = (self._graphdef, self._params, tokens, segments, seeds,
                prompt_index.astype(np.int32), sample_index.astype(np.int32), live, self._knobs)
        cache_len = prompt_len + completion_len + (bucket_length(reserve) if reserve else 0)
        if jax.default_backend() == "cpu" and jax.process_count() == 1:  # an accelerator raises its own error
            check_cache_fits(model.config, len(live), cache_len, available_memory())
        kwargs = dict(spec=self._spec, n=n, cache_len=cache_len, completion_len=completion_len)
        self._stored = self._compile_ahead(args, kwargs)
        self._state = self._stored[0](*args[1:]) if self._stored else _prefill(*args, **kwargs)
        self._done_host = host_array(self._state.done)  # host reads go through host_array: arrays may span processes
        self._release_after_compiling()
        self.prefill_s = time.perf_counter() - start
        self.decode_s = 0.0
        self._step = 1
        # Multi-turn bookkeeping: the cache slot where this turn's completion starts, each row's real tokens in
        # the cache (= its next rotary position), the turn number, and the real tokens prefilled so far.
        self._turn_start = prompt_len
        self._context = np.zeros(len(live), np.int64)
        self._context[: self.rows] = np.repeat([len(p) for p in prompt_ids], n)
        self.turn = 0
        self.prefilled_tokens = sum(len(p) for p in prompt_ids)

    @property
    def rows(self) -> int:
        return self.num_prompts * self.n

    @property
    def step(self) -> int:
        return self._step

    @property
    def finished(self) -> bool:
        return self._step >= self.config.max_new_tokens or bool(np.all(self._done_host))

    def advance(self, steps: int | None = None) -> None:
        """Decodes up to `steps` more tokens per row (None = to the end), stopping early when all rows are done.

        Callers that need to look at tokens while decoding (stop strings, streaming chat) advance in chunks; each
        chunk reuses the same executable because the step limit is traced."""
        if self.finished:
            return
        until = self.config.max_new_tokens if steps is None else min(self._step + steps, self.config.max_new_tokens)
        start = time.perf_counter()
        if self._stored and self.turn == 0:  # later turns' states come from _extend: the jit path keys them
            self._state = self._stored[1](self._params, self._state, jnp.int32(until), self._knobs)
        else:
            self._state = _decode(
                self._graphdef, self._params, self._state, jnp.int32(until), self._knobs, spec=self._spec,
                layout=self._layout,
            )
        self._step, self._done_host = int(host_array(self._state.step)), host_array(self._state.done)
        self._release_after_compiling()
        self.decode_s += time.perf_counter() - start

    def continue_with(self, new_ids: Sequence[Sequence[int] | None]) -> None:
        """Starts the next turn: row r's conversation goes on with `new_ids[r]` (e.g. a rendered tool result and
        the next assistant header) after what it generated this turn; None ends the row (it stays finished).

        Only new tokens are prefilled, into the existing cache: this turn's last generated token (its stop token,
        which the decode loop samples but never feeds back) followed by `new_ids[r]`. Cache slots a row wrote
        after that token (padding fed while other rows were still decoding) are masked out, and positions go on
        from the row's real length, so the next turn sees exactly prompt + completion + new tokens, as a fresh
        prefill of the whole conversation would. The completion buffers restart for the new turn.
        """
        if len(new_ids) != self.rows:
            raise GenerationError(f"continue_with got {len(new_ids)} rows of new tokens for {self.rows} rows")
        lengths = host_array(self._state.lengths)
        generated = host_array(self._state.tokens)
        cache = self._state.cache
        written = int(host_array(cache.length))  # prefill's slots, then one per decode step
        segments = np.array(host_array(cache.segment_ids))
        rows_all = segments.shape[0]
        inputs: list[list[int]] = []
        live = np.zeros(rows_all, bool)
        for r in range(rows_all):
            ids = new_ids[r] if r < self.rows else None
            if ids is None or lengths[r] == 0:
                inputs.append([self.pad_id])  # one real token, so the row attends to something; born done
                continue
            live[r] = True
            keep_until = self._turn_start + int(lengths[r]) - 1
            segments[r, keep_until:written] = 0
            self._context[r] += int(lengths[r]) - 1
            last = int(generated[r, int(lengths[r]) - 1])
            inputs.append([last, *(int(t) for t in ids)])
        width = bucket_length(max(len(x) for x in inputs))
        if written + width + bucket_length(self.config.max_new_tokens) > cache.max_len:
            raise GenerationError(
                f"the next turn needs {width} new cache slots plus max_new_tokens={self.config.max_new_tokens}, "
                f"but {cache.max_len - written} are free; pass a larger reserve for later turns"
            )
        tokens = np.full((rows_all, width), self.pad_id, np.int32)
        new_segments = np.zeros((rows_all, width), np.int32)
        for r, ids in enumerate(inputs):
            tokens[r, width - len(ids):] = ids
            new_segments[r, width - len(ids):] = 1
        next_position = self._context.astype(np.int32)
        start = time.perf_counter()
        self.turn += 1
        self._state = _extend(
            self._graphdef, self._params, self._state, segments, next_position, tokens, new_segments, live,
            jnp.int32(self.turn), self._knobs, spec=self._spec,
        )
        self._context[live] += np.array([len(ids) for ids, ok in zip(inputs, live) if ok], np.int64)
        self.prefilled_tokens += sum(len(ids) for ids, ok in zip(inputs, live) if ok)
        self._turn_start = written + width
        self._step = 1
        self._done_host = host_array(self._state.done)
        self._release_after_compiling()
        self.prefill_s += time.perf_counter() - start

    def _compile_ahead(self, prefill_args: tuple, prefill_kwargs: dict) -> tuple[Any, Any] | None:
        """Compiles a new request shape's prefill and decode programs before either runs (decode from the
        abstract state prefill will return), handing the free heap back after each. With a program store
        (`tempax.generate.program_store`, on for the `tempax` command) returns the (prefill, decode)
        executables to call, loaded from the store without tracing when an earlier process put them there;
        otherwise None, and jit's caches serve the calls.

        A process's peak memory was otherwise its first request: compiling prefill and then the decode loop (all
        layers in one while body) takes transient host memory on top of the weights, the KV cache and the decode
        state (`docs/measurements/memory.md`, "Decoding"). Compiled here, that transient comes and goes before the
        cache exists; jit's caches then serve the calls themselves (nothing compiles twice: tests check it, on
        one device and on a mesh). A shape an earlier request traced is a cache hit and returns at once.
        """
        store = default_store()
        key = None
        if store is not None and single_device(prefill_args[1:]):
            key = program_key("prefill", {"graphdef": self._graphdef, "layout": self._layout, **prefill_kwargs},
                              prefill_args[1:])
            if key not in _STORED:
                loaded = store.load(key), store.load(decode_key(key))
                if loaded[0] is not None and loaded[1] is not None:
                    _STORED[key] = loaded
            if key in _STORED:
                return _STORED[key]
        traces = dict(_TRACES)
        prefill = _prefill.lower(*prefill_args, **prefill_kwargs)
        if _TRACES == traces and key is None:
            return None
        compiled = prefill.compile()
        # The decode state as the call will bring it: prefill's outputs. jit keys a call on its arrays' shardings
        # where they are committed (placed on purpose, e.g. a model sharded over a mesh: then so is the output)
        # and on none for arrays merely left on the default device; mirror that, or decode compiles twice.
        committed = any(isinstance(x, jax.Array) and x.committed for x in jax.tree.leaves(prefill_args))
        state = jax.tree.map(
            lambda out, sharding: jax.ShapeDtypeStruct(out.shape, out.dtype, sharding=sharding if committed else None),
            prefill.out_info, compiled.output_shardings,
        )
        del prefill
        if key is None:
            del compiled
        release_free_heap()
        until = jnp.int32(0)  # made as `advance` makes it (under a mesh that gives it the mesh's placement)
        decode = _decode.lower(self._graphdef, self._params, state, until, self._knobs, spec=self._spec,
                               layout=self._layout).compile()
        release_free_heap()
        if key is None:
            return None
        store.save(key, compiled)
        store.save(decode_key(key), decode)
        _STORED[key] = compiled, decode
        return _STORED[key]

    def _release_after_compiling(self) -> None:
        """`release_free_heap` once a call has compiled (compilation frees far more than it keeps)."""
        compiles = sum(_TRACES.values())
        if compiles != self._compiles_released:
            release_free_heap()
        self._compiles_released = compiles

    def tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens [R, step], lengths [R]) generated so far for the real rows."""
        # Copy whole buffers and slice on the host: slicing on device would compile a slice per new step.
        r = self.rows
        return host_array(self._state.tokens)[:r, : self._step], host_array(self._state.lengths)[:r]

    def done(self) -> np.ndarray:
        """[R] bool: rows that have finished (stop token, or marked done)."""
        return self._done_host[: self.rows].copy()

    def mark_done(self, rows: np.ndarray) -> None:
        """Stops the rows where `rows` [R] is true (e.g. a stop string appeared); they generate nothing more."""
        done = self._done_host.copy()
        done[: self.rows] |= np.asarray(rows, bool)
        self._done_host = done
        self._state = dataclasses.replace(self._state, done=done)  # NumPy: the same global value in every process

    def output(self) -> DecodeOutput:
        r, t = self.rows, self.config.max_new_tokens
        s = self._state
        return DecodeOutput(
            tokens=host_array(s.tokens)[:r, :t],
            logprobs=host_array(s.logprobs)[:r, :t],
            raw_logprobs=host_array(s.raw_logprobs)[:r, :t],
            lengths=host_array(s.lengths)[:r],
            stopped=self._done_host[:r].copy(),
            steps=self._step,
            prefill_s=self.prefill_s,
            decode_s=self.decode_s,
            compiles=sum(_TRACES.values()) - self._compiles_before,
        )
