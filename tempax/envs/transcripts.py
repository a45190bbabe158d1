"""Tool-calling transcripts from played episodes, in the common (OpenAI / Hugging Face) layout, for an SFT
warm-start: `tempax data episodes` writes them, `tempax sft` trains on them (`tempax.data.formats`).

An episode is played by `run_episode` with a policy `reply(messages, task_row)` that returns the assistant's
reply either as text in the model's own format (a sampling policy) or as a message in the common layout,
`{"content": ..., "tool_calls": [{"name": ..., "arguments": {...}}]}` (a scripted policy, which then need not know
the model's call format: the calls are written in the environment's format before `step` reads them). The
transcript gives each reply's calls back as `tool_calls` (parsed in the environment's format) and each tool
result as a `tool` message with the id of its call, so the file is the same whatever model wrote it.

Each written row is `{"messages": [...], "rewards": {part: value}, "reward": total}`: the environment's reward
parts plus the task's reward functions on the final reply, so a caller can keep only correct episodes
(`min_reward`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

from tempax.envs.environment import PROMPT_COLUMN, Episode, EpisodeLimits, Message, run_episode
from tempax.envs.tool_calls import parse_tool_calls
from tempax.errors import ConfigError
from tempax.models.tokenizer import Tokenizer
from tempax.models.tool_format import ToolFormat, assistant_text, detect_tool_format

Policy = Callable[[list[Message], Mapping[str, Any]], "str | Mapping[str, Any]"]


def episode_tool_format(env: Any, tokenizer: Tokenizer) -> ToolFormat:
    """The call format an environment reads: a tool environment's own, else the chat template's."""
    return getattr(env, "tool_format", None) or detect_tool_format(getattr(tokenizer.hf, "chat_template", None))


def reply_as_text(reply: str | Mapping[str, Any], tool_format: ToolFormat) -> str:
    """A policy's reply as the text the model would write: text as it is, a message in the common layout with
    its calls written in `tool_format`."""
    if isinstance(reply, str):
        return reply
    if not isinstance(reply, Mapping):
        raise ConfigError(f"a policy must return text or a message with content / tool_calls, got "
                          f"{type(reply).__name__}")
    try:
        return assistant_text(reply.get("content"), list(reply.get("tool_calls") or []), tool_format)
    except ValueError as e:
        raise ConfigError(f"the policy returned a tool call tempax cannot write: {e}") from None


def transcript_messages(messages: Sequence[Message], tool_format: ToolFormat) -> list[Message]:
    """An episode's conversation in the common layout: an assistant reply whose calls all parse becomes its prose
    plus `tool_calls` (ids call_0, call_1, ... over the episode), and the `tool` messages that follow take those
    ids in order; a reply with an unreadable call stays as written."""
    out: list[Message] = []
    pending: list[str] = []
    count = 0
    for m in messages:
        if m["role"] == "assistant":
            parsed = parse_tool_calls(m["content"], tool_format)
            if parsed.has_calls and not parsed.malformed:
                ids = [f"call_{count + k}" for k in range(len(parsed.calls))]
                count += len(ids)
                pending = list(ids)
                out.append({"role": "assistant", "content": parsed.content, "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for i, c in zip(ids, parsed.calls)]})
                continue
            pending = []
        elif m["role"] == "tool" and pending:
            out.append({**m, "tool_call_id": pending.pop(0)})
            continue
        out.append(dict(m))
    return out


@dataclass(frozen=True)
class Transcript:
    """One played episode as a training row, with what it earned."""

    messages: list[Message]
    rewards: dict[str, float]
    episode: Episode

    @property
    def reward(self) -> float:
        return float(sum(self.rewards.values()))

    def row(self) -> dict[str, Any]:
        return {"messages": self.messages, "rewards": self.rewards, "reward": self.reward}


def play_transcript(
    env: Any,
    task_row: Mapping[str, Any],
    policy: Policy,
    *,
    tokenizer: Tokenizer,
    limits: EpisodeLimits,
    reward_fn: Callable[..., Any] | None = None,
) -> Transcript:
    """Plays one episode with `policy` and scores its final reply with `reward_fn` (the task's reward functions,
    a `CombinedReward`; None: the environment's rewards only)."""
    tool_format = episode_tool_format(env, tokenizer)
    episode = run_episode(env, task_row, lambda messages: reply_as_text(policy(messages, task_row), tool_format),
                          tokenizer=tokenizer, limits=limits)
    rewards = dict(episode.rewards)
    if reward_fn is not None:
        first = episode.messages[:_first_reply(episode.messages)]
        prompt = str(tokenizer.apply_chat_template(first, add_generation_prompt=True))
        final = next(m["content"] for m in reversed(episode.messages) if m["role"] == "assistant")
        columns = {k: [v] for k, v in task_row.items() if k != PROMPT_COLUMN}
        breakdown = reward_fn([prompt], [final], **columns)
        rewards.update({name: float(values[0]) for name, values in breakdown.per_function.items()})
    return Transcript(transcript_messages(episode.messages, tool_format), rewards, episode)


def _first_reply(messages: Sequence[Message]) -> int:
    return next(i for i, m in enumerate(messages) if m["role"] == "assistant")


def write_transcripts(
    path: str,
    transcripts: Iterable[Transcript],
    *,
    min_reward: float | None = None,
) -> tuple[int, int]:
    """Writes each transcript whose total reward is at least `min_reward` (None: all) as one JSON line; returns
    (written, played)."""
    written = played = 0
    with open(path, "w") as f:
        for t in transcripts:
            played += 1
            if min_reward is None or t.reward >= min_reward:
                f.write(json.dumps(t.row()) + "\n")
                written += 1
    return written, played


class RecordedTranscripts(NamedTuple):
    """What `record_transcripts` wrote: episodes written and played; the most tokens one assistant reply of a
    written episode took in the model's own format (its end-of-turn token included), which an RL recipe's
    per-turn token limit must hold; and the latest point after the prompt at which a written episode's last reply
    starts (`last_reply_start`), which with that limit is what the recipe's episode budget must hold."""

    written: int
    played: int
    longest_reply_tokens: int
    latest_reply_start: int


def reply_tokens(episode: Episode, tokenizer: Tokenizer) -> int:
    """The most tokens one of the episode's assistant replies takes as the model writes it, plus its end of turn."""
    return max((len(tokenizer.encode(m["content"], add_special_tokens=False)) + 1
                for m in episode.messages if m["role"] == "assistant"), default=0)


def last_reply_start(episode: Episode, tokenizer: Tokenizer) -> int:
    """Tokens the episode holds after its prompt when its last assistant reply starts: the earlier replies, the
    environment's messages and the chat template's turn headers, as the conversation renders."""
    messages = episode.messages
    starts = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not starts:
        return 0
    rendered = lambda upto: len(tokenizer.apply_chat_template(list(messages[:upto]), add_generation_prompt=True,
                                                             tokenize=True))
    return rendered(starts[-1]) - rendered(starts[0])


def record_transcripts(
    path: str,
    env_factory: Callable[[], Any],
    rows: Sequence[Mapping[str, Any]],
    policy: Policy,
    *,
    tokenizer: Tokenizer,
    max_turns: int,
    attempts: int = 1,
    reward_fn: Callable[..., Any] | None = None,
    min_reward: float | None = None,
) -> RecordedTranscripts:
    """Plays `attempts` episodes of a fresh environment per task row with `policy` and writes their transcripts to
    `path` (`write_transcripts`). An episode ends when the environment says so or after `max_turns` replies: no
    token budget is imposed, since what trains on the transcripts (SFT's train.seq_len) bounds the length of what
    is trained; the longest written reply is measured instead (`RecordedTranscripts`)."""
    limits = EpisodeLimits(max_turns=max_turns, max_total_tokens=1 << 30)
    longest = latest = 0

    def played() -> Iterator[Transcript]:
        nonlocal longest, latest
        for row in rows:
            for _ in range(attempts):
                t = play_transcript(env_factory(), row, policy, tokenizer=tokenizer, limits=limits,
                                    reward_fn=reward_fn)
                if min_reward is None or t.reward >= min_reward:
                    longest = max(longest, reply_tokens(t.episode, tokenizer))
                    latest = max(latest, last_reply_start(t.episode, tokenizer))
                yield t

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    written, count = write_transcripts(path, played(), min_reward=min_reward)
    return RecordedTranscripts(written, count, longest, latest)
