"""The environment protocol of agentic RL, the tool environment, and the one-turn case.

An environment is any object with

    reset(task_row) -> first messages            chat messages ([{role, content}]) the policy answers first
    step(assistant_message) -> StepResult         (new messages, reward parts, done)

What it says back is rendered after the policy's reply and never trained on; the RL layer drives environments,
an environment never samples or trains. `run_episode` is the reference driver (and where the episode limits
live); `SingleTurnEnvironment` makes a one-prompt task one more episode, so there is one rollout path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from tempax.envs.tool_calls import MalformedCall, ToolFormat, detect_tool_format, parse_tool_calls, tool_message
from tempax.envs.tools import Tool, ToolResult, call_tool
from tempax.errors import ConfigError, DataError
from tempax.models.tokenizer import Tokenizer

Message = dict[str, Any]
RewardCall = Callable[..., Any]  # a tempax.rewards.CombinedReward: (prompts, completions, **columns) -> breakdown
PROMPT_COLUMN = "prompt_messages"


@dataclass(frozen=True)
class StepResult:
    """What one `step` returns: the environment's new messages, the reward parts of this turn, and whether the
    episode is over.

    `messages` are what the environment says back (tool results, feedback), rendered through the chat template
    after the policy's reply; they are never the policy's tokens, so a trainer masks them out of the loss.
    `rewards` are reward parts (name -> float) earned on that turn: a final-answer reward comes on the last turn,
    per-turn rewards on any; an episode's reward part is the sum over its turns."""

    messages: tuple[Message, ...] = ()
    rewards: Mapping[str, float] = field(default_factory=dict)
    done: bool = False


class Environment(Protocol):
    """The protocol: `reset` starts an episode from a task row, `step` answers one assistant reply."""

    def reset(self, task_row: Mapping[str, Any]) -> list[Message]: ...

    def step(self, assistant_message: str) -> StepResult: ...


@dataclass(frozen=True)
class EpisodeLimits:
    """Bounds on one episode.

    Attributes:
      max_turns: most assistant replies in an episode.
      max_total_tokens: most tokens in the rendered conversation (prompt, replies and environment messages).
    """

    max_turns: int = 4
    max_total_tokens: int = 2048

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ConfigError(f"max_turns must be at least 1, got {self.max_turns}")
        if self.max_total_tokens < 1:
            raise ConfigError(f"max_total_tokens must be at least 1, got {self.max_total_tokens}")


@dataclass
class Episode:
    """One finished episode.

    Attributes:
      messages: the whole conversation, first messages included.
      rewards: each reward part summed over the turns.
      turn_rewards: the reward parts of each turn, in order.
      turns: assistant replies.
      truncated: None when the environment ended the episode, else the limit that did ("max_turns",
        "max_total_tokens").
      metrics: the environment's counters (`metrics()`, when it has one) plus `turns` and `total_tokens`.
    """

    messages: list[Message]
    rewards: dict[str, float]
    turn_rewards: list[dict[str, float]]
    turns: int
    truncated: str | None
    metrics: dict[str, float]


def conversation_tokens(tokenizer: Tokenizer, messages: Sequence[Message]) -> int:
    """Tokens in the rendered conversation."""
    return len(tokenizer.apply_chat_template(list(messages), tokenize=True))


def run_episode(
    env: Environment,
    task_row: Mapping[str, Any],
    reply: Callable[[list[Message]], str],
    *,
    tokenizer: Tokenizer,
    limits: EpisodeLimits = EpisodeLimits(),
) -> Episode:
    """Plays one episode: `reply(messages) -> assistant text` answers each turn, `env.step` answers the reply.

    The episode ends when the environment says done, after `EpisodeLimits.max_turns` replies, or once the rendered
    conversation reaches `max_total_tokens` (then `Episode.truncated` names the limit). A batched rollout on the
    generation engine must produce the same episodes; the limits live here, not in each environment, so every
    environment gets them."""
    messages = list(env.reset(task_row))
    turn_rewards: list[dict[str, float]] = []
    truncated = None
    while True:
        text = reply(list(messages))
        messages.append({"role": "assistant", "content": text})
        result = env.step(text)
        turn_rewards.append(dict(result.rewards))
        messages.extend(result.messages)
        if result.done:
            break
        if len(turn_rewards) >= limits.max_turns:
            truncated = "max_turns"
            break
        if conversation_tokens(tokenizer, messages) >= limits.max_total_tokens:
            truncated = "max_total_tokens"
            break
    totals: dict[str, float] = {}
    for parts in turn_rewards:
        for name, value in parts.items():
            totals[name] = totals.get(name, 0.0) + float(value)
    metrics = dict(env.metrics()) if callable(getattr(env, "metrics", None)) else {}
    metrics.update(turns=float(len(turn_rewards)), total_tokens=float(conversation_tokens(tokenizer, messages)))
    return Episode(messages, totals, turn_rewards, len(turn_rewards), truncated, metrics)


def _prompt_of(task_row: Mapping[str, Any]) -> list[Message]:
    prompt = task_row.get(PROMPT_COLUMN)
    if not isinstance(prompt, list) or not prompt:
        raise DataError(f"a task row needs a non-empty {PROMPT_COLUMN!r} list of chat messages; "
                        f"this one has the columns {sorted(task_row)}")
    return [dict(m) for m in prompt]


class _ScoredTask:
    """Scores a final reply with the task's reward functions, given the row's other columns (e.g. `answer`).
    Without reward functions it scores nothing: the batched rollout (`tempax.rl.episodes`) then scores every
    episode's final reply in one call instead."""

    def __init__(self, tokenizer: Tokenizer, reward_fn: RewardCall | None) -> None:
        self.tokenizer = tokenizer
        self.reward_fn = reward_fn
        self.prompt_text = ""
        self.columns: dict[str, list[Any]] = {}

    def start(self, task_row: Mapping[str, Any], first: list[Message]) -> None:
        self.prompt_text = str(self.tokenizer.apply_chat_template(first, add_generation_prompt=True))
        self.columns = {k: [v] for k, v in task_row.items() if k != PROMPT_COLUMN}

    def score(self, completion: str) -> dict[str, float]:
        if self.reward_fn is None:
            return {}
        breakdown = self.reward_fn([self.prompt_text], [completion], **self.columns)
        return {name: float(values[0]) for name, values in breakdown.per_function.items()}


class SingleTurnEnvironment:
    """One prompt, one reply, scored by the task's reward functions (None: left to the rollout, which scores
    final replies in one batch): the built-in arithmetic and GSM8K tasks."""

    def __init__(self, tokenizer: Tokenizer, reward_fn: RewardCall | None = None) -> None:
        self.task = _ScoredTask(tokenizer, reward_fn)

    def reset(self, task_row: Mapping[str, Any]) -> list[Message]:
        if self.task.reward_fn is None and PROMPT_COLUMN not in task_row:
            # A prompt given as token ids alone (a benchmark's, or a user's pre-tokenised prompts): one turn renders
            # nothing after the reply and the rollout scores it, so the messages are not needed.
            return []
        first = _prompt_of(task_row)
        self.task.start(task_row, first)
        return first

    def step(self, assistant_message: str) -> StepResult:
        return StepResult(rewards=self.task.score(assistant_message), done=True)


def tools_system_text(tools: Sequence[Tool], tool_format: ToolFormat) -> str:
    """The instructions listing the tools' schemas and how to call them, in the model's own call format."""
    schemas = "\n".join(json.dumps(t.schema) for t in tools)
    if tool_format == "hermes":
        how = ('To call a tool, write <tool_call>{"name": <tool name>, "arguments": <arguments object>}'
               "</tool_call> and stop; the result comes back in the next message.")
    else:
        how = ('To call a tool, reply with only {"name": <tool name>, "parameters": <arguments object>}; '
               "the result comes back in the next message.")
    return f"You may call these tools:\n<tools>\n{schemas}\n</tools>\n{how}"


@dataclass
class ToolMetrics:
    """Counters of one episode: replies, well-formed calls, unreadable calls, calls that answered with an error
    (unknown tool, bad arguments, a refusal), and seconds spent inside tools."""

    turns: int = 0
    tool_calls: int = 0
    malformed_calls: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0


class ToolEnvironment:
    """The policy may call `tools` in its own format until it replies without a call; that reply is scored by
    the task's reward functions (None: left to the rollout). Unreadable calls and failing calls are answered with an error message as the
    tool result (and counted), never raised. The tool list is appended to the task's system message (or given as
    a new first system message), in the call format of the tokenizer's chat template unless one is given."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        reward_fn: RewardCall | None,
        tools: Sequence[Tool],
        *,
        tool_format: ToolFormat | None = None,
    ) -> None:
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ConfigError(f"tool names must be unique, got {names}")
        self.tools = {t.name: t for t in tools}
        self.tool_format: ToolFormat = tool_format or detect_tool_format(getattr(tokenizer.hf, "chat_template", None))
        self.task = _ScoredTask(tokenizer, reward_fn)
        self.counts = ToolMetrics()

    def reset(self, task_row: Mapping[str, Any]) -> list[Message]:
        first = _prompt_of(task_row)
        listing = tools_system_text(list(self.tools.values()), self.tool_format)
        if first[0].get("role") == "system":
            first[0] = {**first[0], "content": f"{first[0]['content']}\n\n{listing}"}
        else:
            first.insert(0, {"role": "system", "content": listing})
        self.task.start(task_row, first)
        self.counts = ToolMetrics()
        return first

    def step(self, assistant_message: str) -> StepResult:
        self.counts.turns += 1
        parsed = parse_tool_calls(assistant_message, self.tool_format)
        if not parsed.has_calls:
            return StepResult(rewards=self.task.score(assistant_message), done=True)
        answers = []
        for call in parsed.order:
            if isinstance(call, MalformedCall):
                self.counts.malformed_calls += 1
                result = ToolResult("unknown", f"error: could not read the tool call: {call.reason}", True)
            else:
                self.counts.tool_calls += 1
                result = call_tool(self.tools, call)
                self.counts.tool_errors += int(result.error)
                self.counts.tool_seconds += result.seconds
            answers.append(tool_message(result.name, result.content))
        return StepResult(messages=tuple(answers))

    def metrics(self) -> dict[str, float]:
        c = self.counts
        return {"tool_calls": float(c.tool_calls), "malformed_calls": float(c.malformed_calls),
                "tool_errors": float(c.tool_errors), "tool_seconds": c.tool_seconds}
