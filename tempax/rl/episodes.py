"""Batched episodes on the decode engine: the one rollout path, for one-turn tasks and multi-turn environments
(a one-turn task is `SingleTurnEnvironment` with `max_turns` 1, no second code path). `play_episodes` plays
P x G episodes sharing each prompt's prefill; the training forward reads exactly the sequence the sampler's
cache held, and the loss mask covers the policy's tokens only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from flax import nnx

from tempax.envs.environment import Environment
from tempax.envs.tool_calls import render_continuation
from tempax.errors import TempaxError
from tempax.generate import SamplingConfig
from tempax.generate.continuous import SlotEngine, slot_bucket
from tempax.generate.engine import DecodeRun, bucket_length

_MARKER = "\u2063TEMPAX-REPLY\u2063"


@dataclass
class Episodes:
    """P x G played episodes as rows r = i * G + j (host arrays).

    Attributes:
      tokens: [R, T] int32 episode tokens after the prompt, pad id after `lengths`.
      mask: [R, T] int32, 1 on the policy's tokens (its replies, stop tokens included).
      logprobs: [R, T] float32 sampling-time log p_tau of the policy's tokens (0 elsewhere).
      turn_of: [R, T] int32, k + 1 on the policy tokens of turn k, 0 elsewhere.
      lengths: [R] int32 episode tokens (policy and environment).
      turns: [R] int32 replies.
      truncated: [R] bool, ended by a limit (max_turns, the episode budget, or a last reply cut at
        max_new_tokens) rather than by the environment.
      final_texts: [R] the last reply's text (what a final-answer reward scores).
      texts: [R] the whole episode's text after the prompt.
      turn_rewards: [R] the environment's reward parts summed over the turns.
      env_metrics: name -> [R] the environments' counters (`metrics()`), when they have one.
      prefilled_tokens: tokens the engine prefilled (prompts once, then only each turn's new tokens).
      reprefill_tokens: tokens a rollout that re-prefilled the whole conversation every turn would prefill.
    """

    tokens: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray
    turn_of: np.ndarray
    lengths: np.ndarray
    turns: np.ndarray
    truncated: np.ndarray
    final_texts: list[str]
    texts: list[str]
    turn_rewards: list[dict[str, float]]
    env_metrics: dict[str, np.ndarray] = field(default_factory=dict)
    prefilled_tokens: int = 0
    reprefill_tokens: int = 0


def turn_end_glue(tokenizer: Any, stop_id: int | None) -> list[int]:
    """Tokens the chat template writes after an assistant reply ended by `stop_id` (None: cut by the token
    limit, so the whole end-of-turn text follows): the template's text after a reply, minus the stop token's."""
    rendered = str(tokenizer.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARKER}]))
    if _MARKER not in rendered:
        raise TempaxError("the chat template does not render an assistant reply's content as written, so a "
                          "multi-turn episode cannot be continued token for token; use a ChatML/Qwen/Llama template")
    suffix = rendered[rendered.rindex(_MARKER) + len(_MARKER):]
    if stop_id is not None:
        stop_text = tokenizer.decode([stop_id], skip_special_tokens=False)
        if stop_text and suffix.startswith(stop_text):
            suffix = suffix[len(stop_text):]
    return tokenizer.encode(suffix, add_special_tokens=False) if suffix else []


class _Book:
    """The episodes' host record while they are played, and what ends a turn (the same for both engines)."""

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[Sequence[int]], rows: Sequence[dict[str, Any]],
                 env_factory: Callable[[], Environment], *, group_size: int, max_new_tokens: int, max_turns: int,
                 episode_tokens: int):
        g, t = group_size, episode_tokens
        self.tokenizer, self.max_new_tokens, self.max_turns, self.t = tokenizer, max_new_tokens, max_turns, t
        self.n_rows = n_rows = len(prompt_ids) * g
        self.envs = [env_factory() for _ in range(n_rows)]
        self.history = [list(self.envs[r].reset(rows[r // g])) for r in range(n_rows)]
        for r in range(n_rows):
            if self.history[r] != self.history[r - r % g]:
                raise TempaxError(f"{type(self.envs[r]).__name__}.reset gave different first messages for the same "
                                  "task row; the episodes of a prompt share its prefill, so reset must depend on the "
                                  "row only")
        self.stop_ids = tuple(int(i) for i in tokenizer.stop_ids)
        self.glue = {sid: turn_end_glue(tokenizer, sid) for sid in (*self.stop_ids, None)} if max_turns > 1 else {}
        pad = int(tokenizer.pad_id)
        self.tokens = np.full((n_rows, t), pad, np.int32)
        self.mask = np.zeros((n_rows, t), np.int32)
        self.logprobs = np.zeros((n_rows, t), np.float32)
        self.turn_of = np.zeros((n_rows, t), np.int32)
        self.used = np.zeros(n_rows, np.int64)
        self.turns = np.zeros(n_rows, np.int32)
        self.truncated = np.zeros(n_rows, bool)
        self.final_texts = [""] * n_rows
        self.rewards: list[dict[str, float]] = [{} for _ in range(n_rows)]
        self.prompt_len = np.repeat([len(p) for p in prompt_ids], g)
        self.reprefill = int(sum(len(p) for p in prompt_ids))

    def end_turn(self, r: int, ids: np.ndarray, logprobs: np.ndarray) -> list[int] | None:
        """Records row r's reply `ids` (with their sampling log-probs) and steps its environment; returns the
        tokens that continue the episode (glue, the environment's messages, the next assistant header), or None
        when the episode is over."""
        n = len(ids)
        start = int(self.used[r])
        self.tokens[r, start:start + n] = ids
        self.mask[r, start:start + n] = 1
        self.logprobs[r, start:start + n] = logprobs
        self.turn_of[r, start:start + n] = self.turns[r] + 1
        self.used[r] += n
        self.turns[r] += 1
        stop = int(ids[-1]) if n and int(ids[-1]) in self.stop_ids else None
        text = self.tokenizer.decode(ids[:-1] if stop is not None else ids, skip_special_tokens=True)
        self.final_texts[r] = text
        self.history[r].append({"role": "assistant", "content": text})
        result = self.envs[r].step(text)
        for name, value in result.rewards.items():
            self.rewards[r][name] = self.rewards[r].get(name, 0.0) + float(value)
        if result.done:
            self.truncated[r] = stop is None
            return None
        env_ids: list[int] = []
        if self.turns[r] < self.max_turns:
            continuation = render_continuation(self.tokenizer, self.history[r], result.messages)
            env_ids = self.glue[stop] + self.tokenizer.encode(continuation, add_special_tokens=False)
        if self.turns[r] >= self.max_turns or self.used[r] + len(env_ids) + self.max_new_tokens > self.t:
            self.truncated[r] = True
            return None
        self.history[r].extend(result.messages)
        self.tokens[r, self.used[r]:self.used[r] + len(env_ids)] = env_ids
        self.used[r] += len(env_ids)
        self.reprefill += int(self.prompt_len[r] + self.used[r])
        return env_ids

    def episodes(self, prefilled_tokens: int) -> Episodes:
        texts = [self.tokenizer.decode(self.tokens[r, :self.used[r]], skip_special_tokens=False)
                 for r in range(self.n_rows)]
        env_metrics: dict[str, list[float]] = {}
        for r, env in enumerate(self.envs):
            if callable(getattr(env, "metrics", None)):
                for name, value in env.metrics().items():
                    env_metrics.setdefault(name, [0.0] * self.n_rows)[r] = float(value)
        return Episodes(
            tokens=self.tokens, mask=self.mask, logprobs=self.logprobs, turn_of=self.turn_of,
            lengths=self.used.astype(np.int32), turns=self.turns, truncated=self.truncated,
            final_texts=self.final_texts, texts=texts, turn_rewards=self.rewards,
            env_metrics={k: np.asarray(v, np.float64) for k, v in env_metrics.items()},
            prefilled_tokens=int(prefilled_tokens), reprefill_tokens=self.reprefill,
        )


def play_episodes(
    model: Any,
    tokenizer: Any,
    prompt_ids: Sequence[Sequence[int]],
    rows: Sequence[dict[str, Any]],
    env_factory: Callable[[], Environment],
    *,
    group_size: int,
    max_new_tokens: int,
    max_turns: int,
    episode_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    seed: int = 0,
    engine: str = "batch",
    slots: int = 0,
    chunk: int = 8,
) -> Episodes:
    """Plays G episodes of each task row (G per prompt, sharing the prompt's prefill):

      1. every row decodes its turn until a stop token (the chat template's end of turn, which also ends a
         tool-call turn) or max_new_tokens;
      2. each row's reply goes to its environment's `step`; a row whose environment says done, that has used
         `max_turns` replies, or whose next turn would not fit in `episode_tokens`, is finished and stays so;
      3. the others get the environment's messages rendered through the chat template (the `tool` role, then the
         next assistant header) and continue with `DecodeRun.continue_with`, which prefills only those tokens.

    One episode's tokens after the prompt form one row of the batch, [episode_tokens] long:

        reply 1 (policy) | end-of-turn glue + env messages + assistant header (env) | reply 2 (policy) | ... | pad

    `mask` is 1 on the policy's tokens only (each reply with its stop token), so the loss never sees what the
    environment wrote. The glue is what the template writes after an assistant message's stop token (ChatML: a
    newline), so the sequence equals the rendered conversation.

    Args:
      model, tokenizer: the policy.
      prompt_ids: [P] each row's first messages (`env.reset(row)`) rendered with the generation prompt.
      rows: [P] the task rows the environments reset from.
      env_factory: a fresh environment per episode.
      group_size: G.
      max_new_tokens: most tokens per reply.
      max_turns: most replies per episode.
      episode_tokens: T, the budget after the prompt; at least max_new_tokens.
      temperature, top_p, seed: sampling (temperature 0: greedy).
      engine: "batch" decodes all P x G rows as one batch, turn by turn (`DecodeRun`); "slots" plays them on
        the continuously batched `SlotEngine`: a group joins as soon as G slots are free, a finished episode frees
        its slot at once, and a row whose turn ended continues (environment step, then its new tokens) while the
        others keep decoding, so neither a long reply nor a tool call holds the batch. Both draw the same random
        streams (a row's stream depends only on its prompt, sample index and turn), so they play the same
        episodes up to float rounding.
      slots: rows decoded together on the slot engine (0: every row, P x G); at least G.
      chunk: tokens decoded between two looks at the slots (the slot engine).
    """
    if episode_tokens < max_new_tokens:
        raise TempaxError(f"episode_tokens={episode_tokens} must be at least max_new_tokens={max_new_tokens}")
    if engine not in ("batch", "slots"):
        raise TempaxError(f"the rollout engine is 'batch' or 'slots', not {engine!r}")
    book = _Book(tokenizer, prompt_ids, rows, env_factory, group_size=group_size, max_new_tokens=max_new_tokens,
                 max_turns=max_turns, episode_tokens=episode_tokens)
    config = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, n=group_size,
                            seed=seed, logprobs=True)
    if engine == "slots":
        return _play_on_slots(model, tokenizer, prompt_ids, book, config, slots=slots or book.n_rows, chunk=chunk)
    g, t = group_size, episode_tokens
    # Each later turn takes one padded slice of new tokens (the last reply token and the environment's, at most
    # T - max_new_tokens: a turn starts only if a whole reply still fits) and one of max_new_tokens.
    reserve = (max_turns - 1) * (bucket_length(max(t - max_new_tokens, 1)) + bucket_length(max_new_tokens))
    run = DecodeRun(model, [list(p) for p in prompt_ids], config, stop_ids=book.stop_ids, pad_id=tokenizer.pad_id,
                    reserve=reserve)
    live = np.ones(book.n_rows, bool)
    for _ in range(max_turns):
        run.advance()
        out = run.output()
        new_ids: list[list[int] | None] = [None] * book.n_rows
        for r in np.flatnonzero(live):
            n = int(out.lengths[r])
            new_ids[r] = book.end_turn(r, out.tokens[r, :n], out.logprobs[r, :n])
            live[r] = new_ids[r] is not None
        if not live.any():
            break
        run.continue_with(new_ids)
    return book.episodes(run.prefilled_tokens)


# Slot engines kept between rollouts (their compiled programs), by the policy's structure and the engine's shape.
_SLOT_ENGINES: dict[tuple, SlotEngine] = {}


def slot_engine_for(model: Any, tokenizer: Any, *, slots: int, context: int) -> SlotEngine:
    """A `SlotEngine` for this policy structure, reused across rollouts (the policy's current weights loaded),
    so a training run compiles its rollout programs once."""
    graphdef = nnx.graphdef(model)
    key = (graphdef, int(slots), slot_bucket(context), tuple(int(i) for i in tokenizer.stop_ids),
           int(tokenizer.pad_id))
    engine = _SLOT_ENGINES.get(key)
    if engine is None:
        _SLOT_ENGINES.clear()  # one policy at a time: an older engine's cache and programs are not kept
        engine = _SLOT_ENGINES[key] = SlotEngine(model, slots=slots, context=slot_bucket(context),
                                                 stop_ids=tokenizer.stop_ids, pad_id=tokenizer.pad_id)
    else:
        engine.load(model)
    return engine


def _play_on_slots(model: Any, tokenizer: Any, prompt_ids: Sequence[Sequence[int]], book: _Book,
                   config: SamplingConfig, *, slots: int, chunk: int) -> Episodes:
    """`play_episodes` on the slot engine: groups join when G slots are free, turns end and continue per row."""
    g = config.n
    if slots < g:
        raise TempaxError(f"the slot engine needs at least group_size={g} slots (a group shares its prompt's "
                          f"prefill), got {slots}")
    # A row's cache holds its prompt, then at most T episode tokens, and a continued turn writes its new tokens
    # padded to a bucket of at most T - max_new_tokens + 1.
    later = slot_bucket(book.t - book.max_new_tokens + 1) if book.max_turns > 1 else 0
    context = max(len(p) for p in prompt_ids) + book.t + later
    engine = slot_engine_for(model, tokenizer, slots=slots, context=context)
    row_configs = [dataclasses.replace(config, n=1) for _ in range(g)]
    waiting = list(range(len(prompt_ids)))
    prefilled = 0
    try:
        while waiting or engine.live():
            while waiting and engine.free_slots() >= g:
                i = waiting.pop(0)
                engine.join(prompt_ids[i], row_configs, [i * g + j for j in range(g)], stream=i,
                            extra=book.t - book.max_new_tokens + later)
                prefilled += len(prompt_ids[i])
            engine.advance(chunk)
            tokens, lengths, done = engine.snapshot()
            ended = [s for s, row in enumerate(engine.rows) if row is not None and done[s]]
            if not ended:
                continue
            logprobs = engine.logprobs()
            finished = []
            for s in ended:
                r, n = engine.rows[s].owner, int(lengths[s])
                new_ids = book.end_turn(r, tokens[s, :n], logprobs[s, :n])
                if new_ids is None:
                    finished.append(s)
                else:
                    engine.extend(s, new_ids)
                    prefilled += 1 + len(new_ids)
            if finished:
                engine.release(finished)
    except BaseException:
        engine.reset()  # a failed step may have consumed the donated state
        raise
    finally:
        engine.unload()
    return book.episodes(prefilled)
