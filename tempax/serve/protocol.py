"""The OpenAI wire format: request bodies checked into `CompletionRequest`s, and response / chunk bodies built.

Only what tempax can honour is accepted. A field it cannot honour (tools, penalties, chat's top alternatives of
log-probs...) is refused with a 400 naming it rather than ignored, so a client never gets silently different
sampling. Errors have OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tempax.generate.config import SamplingConfig
from tempax.generate.continuous import TOP_LOGPROBS

# Fields clients send that do not change what is generated.
_IGNORED = {"user", "metadata", "store", "service_tier", "stream_options", "parallel_tool_calls"}
_SAMPLING = {"model", "temperature", "top_p", "top_k", "min_p", "n", "max_tokens", "stop", "seed", "stream",
             "frequency_penalty", "presence_penalty", "logprobs"}
CHAT_FIELDS = _SAMPLING | _IGNORED | {"messages", "max_completion_tokens", "top_logprobs", "response_format"}
COMPLETION_FIELDS = _SAMPLING | _IGNORED | {"prompt", "echo", "suffix", "best_of"}
MAX_STOPS = 4  # OpenAI's limit on stop sequences


class APIError(Exception):
    """A request that cannot be served: HTTP `status` and OpenAI's error fields."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.type, self.param, self.code = status, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for: `context` positions (prompt + completion), `max_n` completions."""

    context: int
    default_max_tokens: int = 256
    max_n: int = 16


@dataclass
class CompletionRequest:
    """One checked request: its prompts as token ids and the sampling the client asked for (OpenAI's max_tokens
    is `sampling.max_new_tokens`)."""

    kind: str  # "chat" or "completion"
    model: str
    prompts: list[list[int]]
    sampling: SamplingConfig
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    echo: bool = False  # completions: the prompt comes back before the completion, with its tokens' log-probs
    top_logprobs: int = 0  # completions: the most likely alternatives reported per token (OpenAI's logprobs=N)
    score_only: bool = False  # echo with max_tokens 0: the prompt's log-probs, nothing generated
    id: str = field(default_factory=lambda: secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def object_name(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    @property
    def response_id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat" else "cmpl-") + self.id


def _number(body: dict, name: str, default: float, lo: float, hi: float, *, lo_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise APIError(f"{name} must be a number, got {value!r}", param=name)
    if value > hi or value < lo or (lo_open and value == lo):
        low = f"({lo}" if lo_open else f"[{lo}"
        raise APIError(f"{name} must lie in {low}, {hi}], got {value}", param=name)
    return float(value)


def _integer(body: dict, name: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(f"{name} must be an integer, got {value!r}", param=name)
    if value < lo or (hi is not None and value > hi):
        raise APIError(f"{name} must be an integer in [{lo}, {hi if hi is not None else 'inf'}], got {value}",
                       param=name)
    return value


def _check_fields(body: Any, allowed: set[str]) -> None:
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise APIError(f"unrecognised request argument: {unknown[0]} (tempax serve accepts: "
                       f"{', '.join(sorted(allowed))})", param=unknown[0], code="unsupported_parameter")
    for name in ("frequency_penalty", "presence_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise APIError(f"{name} is not supported by tempax serve; leave it out or set it to 0", param=name,
                           code="unsupported_parameter")


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or any(not isinstance(s, str) or not s for s in stops):
        raise APIError(f"stop must be a non-empty string or a list of them, got {stop!r}", param="stop")
    if len(stops) > MAX_STOPS:
        raise APIError(f"stop holds {len(stops)} sequences; at most {MAX_STOPS} are allowed", param="stop")
    return tuple(stops)


def _sampling(body: dict, kind: str, model: str, prompts: list[list[int]], limits: Limits,
              prompt_param: str, logprobs: bool, *, echo: bool = False, top_logprobs: int = 0) -> CompletionRequest:
    n = _integer(body, "n", 1, 1, limits.max_n)
    longest = max(len(p) for p in prompts)
    room = limits.context - longest
    if room < 1:
        raise APIError(
            f"the prompt has {longest} tokens but the model's context holds {limits.context} (prompt + completion); "
            "shorten the prompt", param=prompt_param, code="context_length_exceeded")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    # max_tokens 0 scores an echoed prompt without generating (what evaluation harnesses send)
    max_tokens = _integer(body, name, None, 0 if echo else 1)
    if max_tokens is None:
        max_tokens = min(limits.default_max_tokens, room)
    elif max_tokens > room:
        raise APIError(
            f"{name}={max_tokens} with a {longest}-token prompt needs {longest + max_tokens} positions but the "
            f"model's context holds {limits.context}; ask for at most {room} tokens or shorten the prompt",
            param=name, code="context_length_exceeded")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise APIError(f"stream must be true or false, got {stream!r}", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise APIError("stream_options must be an object like {\"include_usage\": true}", param="stream_options")
    seed = _integer(body, "seed", None, -(2**63), 2**63 - 1)
    sampling = SamplingConfig(
        max_new_tokens=max(max_tokens, 1),
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=_integer(body, "top_k", 0, -1) if body.get("top_k") != -1 else 0,  # vLLM's -1 means off
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        n=n, stop=_stops(body),
        seed=secrets.randbits(32) if seed is None else seed % 2**32,  # no seed: a fresh stream per request
    )
    return CompletionRequest(
        kind=kind, model=model, prompts=prompts, sampling=sampling, stream=stream, include_usage=bool(options.get("include_usage", False)), logprobs=logprobs,
        echo=echo, top_logprobs=top_logprobs, score_only=max_tokens == 0,
    )


def _check_model(body: dict, served: str) -> str:
    model = body.get("model")
    if model is None:
        return served
    if model != served:
        raise APIError(f"the model {model!r} does not exist here; this server serves {served!r}", status=404,
                       param="model", code="model_not_found")
    return model


def _message_text(message: Any, i: int) -> dict[str, str]:
    if not isinstance(message, dict) or "role" not in message:
        raise APIError(f"messages[{i}] must be an object with a role and a content", param=f"messages[{i}]")
    role, content = message["role"], message.get("content")
    if role not in ("system", "developer", "user", "assistant"):
        raise APIError(f"messages[{i}].role {role!r} is not supported; use system, developer, user or assistant",
                       param=f"messages[{i}].role")
    if isinstance(content, list):  # content parts: only text can be given to a text model
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(f"messages[{i}].content holds a part that is not text; this model reads text only",
                               param=f"messages[{i}].content")
            parts.append(part["text"])
        content = "".join(parts)
    if not isinstance(content, str):
        raise APIError(f"messages[{i}].content must be a string or a list of text parts", param=f"messages[{i}].content")
    return {"role": "system" if role == "developer" else role, "content": content}


def parse_chat(body: Any, tokenizer: Any, served: str, limits: Limits) -> CompletionRequest:
    """A checked /v1/chat/completions request: the messages rendered with the model's chat template."""
    _check_fields(body, CHAT_FIELDS)
    model = _check_model(body, served)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("messages must be a non-empty list of {role, content} objects", param="messages")
    turns = [_message_text(m, i) for i, m in enumerate(messages)]
    if body.get("response_format") not in (None, {"type": "text"}):
        raise APIError("response_format other than {\"type\": \"text\"} is not supported", param="response_format")
    logprobs = body.get("logprobs", False)
    if not isinstance(logprobs, bool):
        raise APIError(f"logprobs must be true or false, got {logprobs!r}", param="logprobs")
    if _integer(body, "top_logprobs", 0, 0, 20):
        raise APIError("top_logprobs above 0 is not supported; logprobs=true returns the chosen tokens' "
                       "log-probabilities", param="top_logprobs", code="unsupported_parameter")
    ids = list(tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True))
    return _sampling(body, "chat", model, [ids], limits, "messages", logprobs)


def parse_completion(body: Any, tokenizer: Any, served: str, limits: Limits) -> CompletionRequest:
    """A checked /v1/completions request: `prompt` is a string, a list of strings, token ids or lists of them."""
    _check_fields(body, COMPLETION_FIELDS)
    model = _check_model(body, served)
    for name, off in (("suffix", None), ("best_of", 1)):
        if body.get(name) not in (None, off):
            raise APIError(f"{name} is not supported by tempax serve; leave it out", param=name,
                           code="unsupported_parameter")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise APIError(f"echo must be true or false, got {echo!r}", param="echo")
    logprobs = _integer(body, "logprobs", None, 0, TOP_LOGPROBS)
    prompts = _prompt_ids(body.get("prompt"), tokenizer, int(tokenizer.vocab_size))
    request = _sampling(body, "completion", model, prompts, limits, "prompt", logprobs is not None, echo=echo,
                        top_logprobs=logprobs or 0)
    if request.stream and (echo or request.top_logprobs):
        raise APIError("echo and logprobs above 0 are answered whole; leave out stream", param="stream",
                       code="unsupported_parameter")
    return request


def _prompt_ids(prompt: Any, tokenizer: Any, vocab: int) -> list[list[int]]:
    def is_ids(x: Any) -> bool:
        return isinstance(x, list) and bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

    if isinstance(prompt, str):
        items: Sequence[Any] = [prompt]
    elif is_ids(prompt):
        items = [prompt]
    elif isinstance(prompt, list) and prompt:
        items = prompt
    else:
        raise APIError("prompt must be a string, a list of strings, a list of token ids or a list of such lists",
                       param="prompt")
    out = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            ids = tokenizer.encode(item) if item else []
        elif is_ids(item):
            ids = list(item)
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise APIError(f"prompt {i} holds token id {bad[0]}, outside the vocabulary [0, {vocab})",
                               param="prompt")
        else:
            raise APIError(f"prompt {i} must be a string or a list of token ids, got {item!r}", param="prompt")
        if not ids:
            raise APIError(f"prompt {i} is empty: give it some text", param="prompt")
        out.append(ids)
    return out


@dataclass(frozen=True)
class Scores:
    """A scoring pass over prompt + completion: entry t is about token t given the tokens before it.

    Attributes:
      token_logprobs: [T] log p(token t | tokens < t); entry 0 (nothing before it) is unused.
      top_ids, top_logprobs: [T, TOP_LOGPROBS] the most likely tokens at each position and their log-probs.
    """

    token_logprobs: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray


@dataclass
class Choice:
    """One finished completion: its text, why it ended ("stop" or "length"), its tokens and their log-probs;
    `prompt_ids` and `scores` where the request asked for echo or top alternatives."""

    index: int
    text: str
    finish_reason: str
    token_ids: list[int]
    logprobs: list[float]
    prompt_ids: list[int] = field(default_factory=list)
    scores: Scores | None = None


def usage(request: CompletionRequest, choices: Sequence[Choice]) -> dict[str, int]:
    prompt = sum(len(p) for p in request.prompts)
    completion = sum(len(c.token_ids) for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _logprobs_body(request: CompletionRequest, choice: Choice, tokenizer: Any) -> dict[str, Any] | None:
    if not request.logprobs:
        return None
    pieces = [tokenizer.decode([t], skip_special_tokens=False) for t in choice.token_ids]
    if request.kind == "chat":
        return {"content": [{"token": p, "logprob": lp, "bytes": list(p.encode("utf-8")), "top_logprobs": []}
                            for p, lp in zip(pieces, choice.logprobs)], "refusal": None}
    token_logprobs: list[float | None] = list(choice.logprobs)
    if request.echo:
        # The prompt's tokens first; its first token follows nothing, so it has no log-prob (OpenAI's None).
        prompt = [None] + [float(x) for x in choice.scores.token_logprobs[1:len(choice.prompt_ids)]]
        pieces = [tokenizer.decode([t], skip_special_tokens=False) for t in choice.prompt_ids] + pieces
        token_logprobs = prompt + token_logprobs
    top = None
    if request.top_logprobs:
        s, start = choice.scores, 0 if request.echo else len(choice.prompt_ids)
        top = []
        for t in range(start, start + len(pieces)):
            if t == 0:
                top.append(None)
                continue
            alternatives: dict[str, float] = {}
            for i, lp in zip(s.top_ids[t, : request.top_logprobs], s.top_logprobs[t, : request.top_logprobs]):
                alternatives.setdefault(tokenizer.decode([int(i)], skip_special_tokens=False), float(lp))
            top.append(alternatives)
    offsets, at = [], 0
    for p in pieces:
        offsets.append(at)
        at += len(p)
    return {"tokens": pieces, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def response_body(request: CompletionRequest, choices: Sequence[Choice], tokenizer: Any) -> dict[str, Any]:
    """The whole (non-streamed) response."""
    if request.kind == "chat":
        out = [{"index": c.index, "message": {"role": "assistant", "content": c.text, "refusal": None},
                "logprobs": _logprobs_body(request, c, tokenizer), "finish_reason": c.finish_reason}
               for c in choices]
    else:
        echoed = lambda c: tokenizer.decode(c.prompt_ids, skip_special_tokens=False) if request.echo else ""
        out = [{"index": c.index, "text": echoed(c) + c.text, "logprobs": _logprobs_body(request, c, tokenizer),
                "finish_reason": c.finish_reason} for c in choices]
    return {"id": request.response_id, "object": request.object_name, "created": request.created,
            "model": request.model, "choices": out, "usage": usage(request, choices)}


def chunk_body(request: CompletionRequest, index: int, text: str | None, finish_reason: str | None = None,
               *, first: bool = False) -> dict[str, Any]:
    """One streamed chunk: a piece of choice `index`'s text, or its end (`finish_reason`)."""
    if request.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        if text:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        name = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        name = "text_completion"
    return {"id": request.response_id, "object": name, "created": request.created, "model": request.model,
            "choices": [choice]}


def usage_chunk(request: CompletionRequest, choices: Sequence[Choice]) -> dict[str, Any]:
    """The last chunk of a stream with `stream_options.include_usage`: no choices, the token counts."""
    name = "chat.completion.chunk" if request.kind == "chat" else "text_completion"
    return {"id": request.response_id, "object": name, "created": request.created, "model": request.model,
            "choices": [], "usage": usage(request, choices)}
