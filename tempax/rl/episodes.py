"""Batched episodes on the decode engine: the one rollout path, for one-turn tasks and multi-turn environments.

`play_episodes` plays P x G episodes (G per prompt, sharing the prompt's prefill) of an environment
(`tempax.envs.environment`):

  1. every row decodes its turn until a stop token (the chat template's end of turn, which also ends a tool-call
     turn) or max_new_tokens;
  2. each row's reply goes to its environment's `step`; a row whose environment says done, that has used
     `max_turns` replies, or whose next turn would not fit in `episode_tokens`, is finished and stays finished;
  3. the others get the environment's messages rendered through the chat template (the `tool` role, then the
     next assistant header) and continue with `DecodeRun.continue_with`, which prefills only those new tokens.

One episode's tokens after the prompt form one row of the batch, [episode_tokens] long:

    reply 1 (policy) | end-of-turn glue + env messages + assistant header (env) | reply 2 (policy) | ... | pad

`mask` is 1 on the policy's tokens only (each reply with its stop token), so the loss never sees what the
environment wrote; the training forward reads exactly the sequence the sampler's cache held. The glue is what the
template writes after an assistant message's stop token (ChatML: a newline), so the sequence equals the rendered
conversation.

A one-turn task is the same path with `SingleTurnEnvironment` and `max_turns` 1 (no second code path).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from tempax.envs.environment import Environment
from tempax.envs.tool_calls import render_continuation
from tempax.errors import TempaxError
from tempax.generate import SamplingConfig
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
) -> Episodes:
    """Plays G episodes of each task row (see the module docstring).

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
    """
    if episode_tokens < max_new_tokens:
        raise TempaxError(f"episode_tokens={episode_tokens} must be at least max_new_tokens={max_new_tokens}")
    g, t = group_size, episode_tokens
    n_rows = len(prompt_ids) * g
    envs = [env_factory() for _ in range(n_rows)]
    history = [list(envs[r].reset(rows[r // g])) for r in range(n_rows)]
    for r in range(n_rows):
        if history[r] != history[r - r % g]:
            raise TempaxError(f"{type(envs[r]).__name__}.reset gave different first messages for the same task row; "
                              "the episodes of a prompt share its prefill, so reset must depend on the row only")
    config = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, n=g, seed=seed,
                            logprobs=True)
    # Each later turn takes one padded slice of new tokens (the last reply token and the environment's, at most
    # T - max_new_tokens: a turn starts only if a whole reply still fits) and one of max_new_tokens.
    reserve = (max_turns - 1) * (bucket_length(max(t - max_new_tokens, 1)) + bucket_length(max_new_tokens))
    stop_ids = tuple(int(i) for i in tokenizer.stop_ids)
    run = DecodeRun(model, [list(p) for p in prompt_ids], config, stop_ids=stop_ids, pad_id=tokenizer.pad_id,
                    reserve=reserve)
    glue = {sid: turn_end_glue(tokenizer, sid) for sid in (*stop_ids, None)} if max_turns > 1 else {}
    pad = int(tokenizer.pad_id)
    tokens = np.full((n_rows, t), pad, np.int32)
    mask = np.zeros((n_rows, t), np.int32)
    logprobs = np.zeros((n_rows, t), np.float32)
    turn_of = np.zeros((n_rows, t), np.int32)
    used = np.zeros(n_rows, np.int64)
    turns = np.zeros(n_rows, np.int32)
    truncated = np.zeros(n_rows, bool)
    live = np.ones(n_rows, bool)
    final_texts = [""] * n_rows
    rewards: list[dict[str, float]] = [{} for _ in range(n_rows)]
    prompt_len = np.repeat([len(p) for p in prompt_ids], g)
    reprefill = int(sum(len(p) for p in prompt_ids))
    for turn in range(max_turns):
        run.advance()
        out = run.output()
        new_ids: list[list[int] | None] = [None] * n_rows
        for r in np.flatnonzero(live):
            n = int(out.lengths[r])
            ids = out.tokens[r, :n]
            start = int(used[r])
            tokens[r, start:start + n] = ids
            mask[r, start:start + n] = 1
            logprobs[r, start:start + n] = out.logprobs[r, :n]
            turn_of[r, start:start + n] = turn + 1
            used[r] += n
            turns[r] += 1
            stop = int(ids[-1]) if n and int(ids[-1]) in stop_ids else None
            text = tokenizer.decode(ids[:-1] if stop is not None else ids, skip_special_tokens=True)
            final_texts[r] = text
            history[r].append({"role": "assistant", "content": text})
            result = envs[r].step(text)
            for name, value in result.rewards.items():
                rewards[r][name] = rewards[r].get(name, 0.0) + float(value)
            if result.done:
                live[r] = False
                truncated[r] = stop is None
                continue
            env_ids: list[int] = []
            if turns[r] < max_turns:
                continuation = render_continuation(tokenizer, history[r], result.messages)
                env_ids = glue[stop] + tokenizer.encode(continuation, add_special_tokens=False)
            if turns[r] >= max_turns or used[r] + len(env_ids) + max_new_tokens > t:
                live[r], truncated[r] = False, True
                continue
            history[r].extend(result.messages)
            tokens[r, used[r]:used[r] + len(env_ids)] = env_ids
            used[r] += len(env_ids)
            new_ids[r] = env_ids
            reprefill += int(prompt_len[r] + used[r])
        if not live.any():
            break
        run.continue_with(new_ids)
    texts = [tokenizer.decode(tokens[r, :used[r]], skip_special_tokens=False) for r in range(n_rows)]
    env_metrics: dict[str, list[float]] = {}
    for r, env in enumerate(envs):
        if callable(getattr(env, "metrics", None)):
            for name, value in env.metrics().items():
                env_metrics.setdefault(name, [0.0] * n_rows)[r] = float(value)
    return Episodes(
        tokens=tokens, mask=mask, logprobs=logprobs, turn_of=turn_of, lengths=used.astype(np.int32), turns=turns,
        truncated=truncated, final_texts=final_texts, texts=texts, turn_rewards=rewards,
        env_metrics={k: np.asarray(v, np.float64) for k, v in env_metrics.items()},
        prefilled_tokens=int(run.prefilled_tokens), reprefill_tokens=reprefill,
    )
