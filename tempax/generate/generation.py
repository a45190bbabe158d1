"""The user-facing sampler: prompts in, completions with token ids, masks and log-probs out.

    result = generate(model, tokenizer, ["2 + 2 =", "Name a colour:"], SamplingConfig(n=4, temperature=1.0))
    result.texts[i * 4 + j]         # completion j of prompt i (rows are prompt-major, like KVCache.repeat)
    result.token_ids, result.mask   # [R, max_new_tokens] ids and 1/0 completion mask (stop token included)
    result.logprobs                 # [R, max_new_tokens] log p_tau of each token (0 outside the mask)

`stream` yields the text of one completion piece by piece for interactive chat.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generator, Sequence

import numpy as np

from tempax.errors import GenerationError
from tempax.generate.config import SamplingConfig
from tempax.generate.engine import DecodeRun
from tempax.generate.stops import cut_at_stop, find_stop

Prompt = str | Sequence[int]

# Host checks for stop strings happen every this many tokens: larger wastes up to that many steps on finished
# rows, smaller adds a host round-trip (and a detokenisation) per chunk.
STOP_CHECK_EVERY = 16


@dataclass
class GenerationStats:
    """Timing of one call. compiles: executables compiled by it (0 once its shape buckets are warm)."""

    prefill_s: float
    decode_s: float
    steps: int
    compiles: int


@dataclass
class GenerationResult:
    """Completions of a batch, one row per (prompt i, sample j) at row i * n + j.

    Attributes:
      texts: [R] completion text, cut before the first stop string, without the stop token.
      token_ids: [R, T] int32 completion tokens (T = max_new_tokens), pad id after the end.
      mask: [R, T] int32, 1 on the completion's tokens: everything generated up to and including the stop token
        or the token that completed a stop string.
      logprobs: [R, T] float32 log-probability of each token under the temperature-scaled model distribution,
        log softmax(z / tau) (the raw one when greedy); 0 outside the mask.
      raw_logprobs: [R, T] float32 log softmax(z) at temperature 1; 0 outside the mask.
      lengths: [R] int32, tokens in each completion (= mask.sum(1)).
      finish_reasons: [R] "stop_token", "stop_string" or "length".
      prompt_ids: [P] the prompts' token ids.
      prompt_index: [R] int32, the prompt each row answers.
      n: samples per prompt.
      stats: timing and compile counts.
    """

    texts: list[str]
    token_ids: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray
    raw_logprobs: np.ndarray
    lengths: np.ndarray
    finish_reasons: list[str]
    prompt_ids: list[list[int]]
    prompt_index: np.ndarray
    n: int
    stats: GenerationStats = field(repr=False)

    def grouped(self) -> list[list[str]]:
        """texts as [P][n]: the n completions of each prompt."""
        return [self.texts[i * self.n:(i + 1) * self.n] for i in range(len(self.prompt_ids))]

    def completion(self, row: int) -> dict[str, Any]:
        """Row `row`'s completion as JSON-able data: its text, token ids and log-probs (its tokens only, log-probs
        to 6 places) and why it ended."""
        n_tok = int(self.lengths[row])
        return {"text": self.texts[row], "token_ids": self.token_ids[row, :n_tok].tolist(),
                "logprobs": [round(float(x), 6) for x in self.logprobs[row, :n_tok]],
                "finish_reason": self.finish_reasons[row]}


def _prompt_ids(tokenizer: Any, prompts: Sequence[Prompt]) -> list[list[int]]:
    if isinstance(prompts, str):
        raise GenerationError("prompts must be a list of prompts, not one string: pass [prompt]")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if tokenizer is None:
                raise GenerationError(f"prompt {i} is text but no tokenizer was given: pass one, or token ids")
            out.append(tokenizer.encode(p) if p else [])
        else:
            out.append([int(t) for t in p])
    return out


def _stop_ids(model: Any, tokenizer: Any, config: SamplingConfig) -> tuple[int, ...]:
    if config.ignore_eos:
        return ()
    if config.stop_token_ids is not None:
        return config.stop_token_ids
    if tokenizer is not None:
        return tuple(tokenizer.stop_ids)
    eos = model.config.eos_token_id
    if eos is None:
        return ()
    return (eos,) if isinstance(eos, int) else tuple(eos)


def _pad_id(model: Any, tokenizer: Any) -> int:
    if tokenizer is not None:
        return int(tokenizer.pad_id)
    pad = model.config.pad_token_id
    return int(pad) if pad is not None else 0


def _decoder(tokenizer: Any):
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True)


def start(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    config: SamplingConfig,
    *,
    prompt_offset: int = 0,
    sample_offset: int = 0,
) -> tuple[DecodeRun, list[list[int]]]:
    """Tokenises, validates and prefills; returns the running decode and the prompts' ids."""
    if config.stop and tokenizer is None:
        raise GenerationError("stop strings need a tokenizer to decode text; pass one or drop `stop`")
    ids = _prompt_ids(tokenizer, prompts)
    run = DecodeRun(
        model, ids, config, stop_ids=_stop_ids(model, tokenizer, config), pad_id=_pad_id(model, tokenizer),
        prompt_offset=prompt_offset, sample_offset=sample_offset,
    )
    return run, ids


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    config: SamplingConfig | None = None,
    *,
    prompt_offset: int = 0,
    sample_offset: int = 0,
) -> GenerationResult:
    """Samples `config.n` completions for each prompt.

    Args:
      model: a tempax `Decoder` (plain, LoRA/QLoRA-wrapped or sharded under `use_mesh`).
      tokenizer: a `tempax.models.tokenizer.Tokenizer`; may be None when prompts are token ids and no stop
        strings are used (texts are then empty).
      prompts: texts (encoded with the tokenizer, BOS included as it adds it) or lists of token ids.
      config: sampling knobs; default SamplingConfig().
      prompt_offset, sample_offset: where this call's rows sit in the (prompt, sample) grid of the random
        streams: calling with prompts[a:b] and prompt_offset=a, or with n=1 and sample_offset=j, reproduces
        exactly those rows of the whole request.

    Raises:
      GenerationError: an empty prompt, a prompt that does not fit the context with max_new_tokens, a stop
        string without a tokenizer (bad knobs are rejected by SamplingConfig itself).
    """
    config = config or SamplingConfig()
    run, ids = start(model, tokenizer, prompts, config, prompt_offset=prompt_offset, sample_offset=sample_offset)
    decode = _decoder(tokenizer) if tokenizer is not None else None
    if config.stop:
        while not run.finished:
            run.advance(STOP_CHECK_EVERY)
            hit = _rows_with_stop(run, decode, config.stop)
            if hit.any():
                run.mark_done(hit)
    else:
        run.advance()
    return _result(run, ids, decode, config)


def _rows_with_stop(run: DecodeRun, decode, stops: Sequence[str]) -> np.ndarray:
    """Rows still running whose text so far contains a stop string."""
    tokens, lengths = run.tokens()
    done = run.done()
    hit = np.zeros(len(lengths), bool)
    for r in np.flatnonzero(~done):
        hit[r] = find_stop(decode(tokens[r, : lengths[r]]), stops) is not None
    return hit


def _result(run: DecodeRun, ids: list[list[int]], decode, config: SamplingConfig) -> GenerationResult:
    out = run.output()
    rows, t = out.tokens.shape
    lengths = out.lengths.copy()
    texts, reasons = [], []
    for r in range(rows):
        n_tok = int(lengths[r])
        stopped_by_token = bool(out.stopped[r]) and n_tok > 0 and _ends_with_stop_id(run, out.tokens[r, n_tok - 1])
        reason = "stop_token" if stopped_by_token else "length"
        text = ""
        if decode is not None:
            body = out.tokens[r, : n_tok - 1 if stopped_by_token else n_tok]
            text, kept, hit = cut_at_stop(body, decode, config.stop)
            if hit:
                lengths[r], reason = kept, "stop_string"
        texts.append(text)
        reasons.append(reason)
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.int32)
    pad = run.pad_id
    return GenerationResult(
        texts=texts,
        token_ids=np.where(mask == 1, out.tokens, pad).astype(np.int32),
        mask=mask,
        logprobs=np.where(mask == 1, out.logprobs, 0.0).astype(np.float32),
        raw_logprobs=np.where(mask == 1, out.raw_logprobs, 0.0).astype(np.float32),
        lengths=lengths.astype(np.int32),
        finish_reasons=reasons,
        prompt_ids=ids,
        prompt_index=np.repeat(np.arange(len(ids)), run.n).astype(np.int32),
        n=run.n,
        stats=GenerationStats(prefill_s=out.prefill_s, decode_s=out.decode_s, steps=out.steps, compiles=out.compiles),
    )


def _ends_with_stop_id(run: DecodeRun, token: int) -> bool:
    return int(token) in run.stop_ids


def stream(
    model: Any,
    tokenizer: Any,
    prompt: Prompt,
    config: SamplingConfig | None = None,
    *,
    chunk_size: int = 4,
) -> Generator[str, None, GenerationResult]:
    """Yields the text of one completion as it is generated; the pieces join to `generate(...).texts[0]`, and
    the generator returns (`StopIteration.value`) that whole `GenerationResult`.

    Decodes `chunk_size` tokens per device call. Text that could be the start of a stop string, or an
    incomplete multi-byte character, is held back until it is resolved.
    """
    config = config or SamplingConfig()
    if config.n != 1:
        raise GenerationError(f"stream produces one completion; got n={config.n}")
    run, prompt_ids = start(model, tokenizer, [prompt], config)
    decode = _decoder(tokenizer)
    hold = max((len(s) for s in config.stop), default=1) - 1
    emitted = 0
    while True:
        tokens, lengths = run.tokens()
        n_tok = int(lengths[0])
        ids = tokens[0, :n_tok]
        if n_tok and int(ids[-1]) in run.stop_ids:
            ids = ids[:-1]
        text, _, hit = cut_at_stop(ids, decode, config.stop)
        if hit or run.finished:
            run.mark_done(np.ones(1, bool))
            if len(text) > emitted:
                yield text[emitted:]
            return _result(run, prompt_ids, decode, config)
        safe = len(text) - hold
        while safe > emitted and text[safe - 1] == "\ufffd":
            safe -= 1
        if safe > emitted:
            yield text[emitted:safe]
            emitted = safe
        run.advance(chunk_size)
