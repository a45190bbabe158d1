"""Tasksets written for verifiers 0.4 (`import verifiers.v1 as vf`, the `verifiers` extra) played as tempax
environments, in-process (no harness program, interception server, container or network): tempax's engine plays
the turns where verifiers' `null` harness and interception server would, and verifiers' own `Task.score` gives each
reply's reward parts. What is played, scored and refused, and how a recipe names a taskset:
docs/adding-an-environment.md, "Environments written for verifiers".

Only its users import this module (`tempax.envs.registry`, when a recipe names a `verifiers:` environment). It uses
verifiers' own graph builder, scoring and hook helpers, so it follows the 0.4 series (`verifiers>=0.4,<0.5`).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Coroutine, Mapping, Sequence, TypeVar

import pydantic
import verifiers.v1 as vf
from mcp.server.mcpserver import MCPServer
from verifiers.v1 import graph
from verifiers.v1.configs.agent import AgentConfig
from verifiers.v1.mcp.server import _call_state  # the context variable a @vf.tool reads `self.state` from
from verifiers.v1.runtimes import SubprocessConfig
from verifiers.v1.session import call_hook, hook_boundary
from verifiers.v1.state import state_cls
from verifiers.v1.types import Message as VerifiersMessage
from verifiers.v1.types import content_text
from verifiers.v1.utils.decorators import discover_decorated, invoke
from verifiers.v1.utils.generic import concrete_type

from tempax.envs.environment import Message, StepResult, tools_system_text
from tempax.envs.tool_calls import ToolCall, ToolFormat, detect_tool_format, parse_tool_calls, tool_message
from tempax.envs.tools import Tool
from tempax.errors import ConfigError, DataError
from tempax.models.tokenizer import Tokenizer

METRIC_PREFIX = "verifiers_"
MODEL_NAME = "tempax-policy"  # the model a trace records; tempax's policy, not a served model
T = TypeVar("T")


class _LoopThread:
    """An asyncio loop on a daemon thread that runs verifiers' coroutines for tempax's synchronous `reset` and
    `step`. One loop for the process, not `asyncio.run` per call, so what a toolset opens in `setup` stays usable
    on later calls; its own thread, so it works when the caller already runs a loop (a notebook)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="tempax-verifiers", daemon=True).start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()


@functools.cache
def _loop() -> _LoopThread:
    return _LoopThread()


def _validation_line(error: pydantic.ValidationError) -> str:
    """A pydantic error on one line: `field.sub: message; ...`."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in error.errors())


def _env_refusal(what: str, name: str) -> ConfigError:
    return ConfigError(
        f"env.name=verifiers:{name}: {what} is a verifiers Env, which plays its own agents through an "
        "OpenAI-compatible endpoint (UserSimEnv's user is a second model); tempax plays one policy in-process: name "
        "the Taskset (its class, or a function returning it) instead")


def build_taskset(builder: Any, name: str, options: Mapping[str, Any]) -> vf.Taskset:
    """The taskset `builder` makes: a `Taskset` class is built from its config class (`Taskset[MyTask, MyConfig]`)
    validated from `options`; a function is called with `options` and must return a `Taskset`."""
    if isinstance(builder, vf.Env) or (isinstance(builder, type) and issubclass(builder, vf.Env)):
        raise _env_refusal(getattr(builder, "__name__", type(builder).__name__), name)
    if isinstance(builder, type) and issubclass(builder, vf.Taskset):
        config_class = concrete_type(builder, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
        try:
            taskset = builder(config_class(**options))
        except pydantic.ValidationError as e:
            raise ConfigError(f"env.options do not fit {name} ({config_class.__name__}): {_validation_line(e)}") \
                from None
    elif callable(builder):
        try:
            taskset = builder(**options)
        except TypeError as e:
            raise ConfigError(f"env.options do not fit {name}: {e}") from None
        except pydantic.ValidationError as e:
            raise ConfigError(f"env.options do not fit {name}: {_validation_line(e)}") from None
    else:
        raise ConfigError(f"env.name=verifiers:{name}: a {type(builder).__name__} is not a Taskset class or a "
                          "function that builds one")
    if isinstance(taskset, vf.Env):
        raise _env_refusal(f"what it returned ({type(taskset).__name__})", name)
    if not isinstance(taskset, vf.Taskset):
        raise ConfigError(f"env.name=verifiers:{name} returned a {type(taskset).__name__}, not a verifiers Taskset")
    return taskset


class TaskIndex:
    """The taskset's tasks by position and by `TaskData.id`, read from `load()` only as far as a row asks (a
    taskset may be infinite)."""

    def __init__(self, taskset: vf.Taskset) -> None:
        self.taskset = taskset
        self._rest = iter(taskset)
        self._tasks: list[vf.Task] = []
        self._exhausted = False

    def _read_to(self, count: int | None) -> None:
        while not self._exhausted and (count is None or len(self._tasks) < count):
            try:
                self._tasks.append(next(self._rest))
            except StopIteration:
                self._exhausted = True

    def first(self) -> vf.Task | None:
        self._read_to(1)
        return self._tasks[0] if self._tasks else None

    def at(self, idx: int) -> vf.Task:
        self._read_to(idx + 1)
        if idx >= len(self._tasks):
            raise DataError(f"task row {{'idx': {idx}}}: {type(self.taskset).__name__} has {len(self._tasks)} tasks "
                            f"(idx 0 to {len(self._tasks) - 1})")
        return self._tasks[idx]

    def with_id(self, task_id: str) -> vf.Task:
        if not self.taskset.bounded:
            raise DataError(f"task row {{'id': {task_id!r}}}: {type(self.taskset).__name__} is infinite, so a task "
                            "cannot be found by id; name it by its position, {'idx': N}")
        self._read_to(None)
        for task in self._tasks:
            if task.data.id == task_id:
                return task
        raise DataError(f"task row {{'id': {task_id!r}}}: no task of {type(self.taskset).__name__} has that "
                        "TaskData.id")

    def for_row(self, row: Mapping[str, Any]) -> vf.Task:
        """The task a row names: `{"idx": N}` or `{"id": "..."}`."""
        idx, task_id = row.get("idx"), row.get("id")
        if isinstance(idx, int) and not isinstance(idx, bool) and idx >= 0 and task_id is None:
            return self.at(idx)
        if isinstance(task_id, str) and idx is None:
            return self.with_id(task_id)
        raise DataError("a task row of a verifiers taskset names one task, by position {\"idx\": N} (N >= 0, the "
                        f"order load() yields them) or by TaskData.id {{\"id\": \"...\"}}; this one is {dict(row)}")


def _requires_runtime(fn: Callable[..., Any]) -> bool:
    """Verifiers' own rule: a hook whose `runtime` parameter has no default cannot run without a sandbox."""
    parameter = inspect.signature(fn).parameters.get("runtime")
    return parameter is not None and parameter.default is inspect.Parameter.empty


def _overrides(task: vf.Task, hook: str) -> bool:
    return getattr(type(task), hook) is not getattr(vf.Task, hook)


def check_task(task: vf.Task) -> None:
    """Refuses, in one line naming the hook, a task whose scoring or set-up needs what in-process play does not
    have (docs/adding-an-environment.md lists them)."""
    kind = type(task).__name__
    if type(task).NEEDS_CONTAINER:
        raise ConfigError(f"{kind}.NEEDS_CONTAINER is set: the task runs in a container, which tempax's in-process "
                          "play of verifiers tasks does not start")
    if task.config.judges:
        raise ConfigError(f"{kind} has judges {[judge.id for judge in task.config.judges]}: a judge scores by calling "
                          "a model through a client, which in-process play does not have; score with @vf.reward "
                          "methods instead")
    intercepts = [fn.__name__ for fn in discover_decorated(task, "intercept")]
    if intercepts:
        raise ConfigError(f"{kind} has @vf.intercept hooks {intercepts}: they rewrite requests at verifiers' "
                          "interception server, which in-process play does not run")
    for hook in ("finalize", "stage_verifier"):
        if _overrides(task, hook):
            raise ConfigError(f"{kind} overrides {hook}, a once-per-rollout hook of a sandboxed run; tempax scores "
                              "the conversation after every reply (an episode may be cut at any turn): move its "
                              "work into the @vf.reward methods")
    if _overrides(task, "setup") and _requires_runtime(task.setup):
        raise ConfigError(f"{kind}.setup takes a runtime (a sandbox), which in-process play does not have; give it "
                          "a default (runtime=None) if it can run without one")
    for kind_of_hook in ("reward", "metric"):
        for fn in task.hooks(kind_of_hook):
            where = f"{kind} @vf.{kind_of_hook} {fn.__name__!r}"
            if _requires_runtime(fn):
                raise ConfigError(f"{where} takes a runtime (a sandbox), which in-process play does not have; give "
                                  "it a default (runtime=None) if it can score without one")
            if not inspect.iscoroutinefunction(inspect.unwrap(fn)):
                raise ConfigError(f"{where} is not `async def`: verifiers 0.4 awaits every reward and metric")
    for fn in task.hooks("stop"):
        try:
            hook_boundary(fn, allow_trace=True)
        except TypeError as e:
            raise ConfigError(f"{kind} @vf.stop {fn.__name__!r}: {e}") from None


def check_toolset(toolset: Any) -> None:
    """Refuses a toolset in-process play cannot call: one served elsewhere, or one that must run in a box."""
    config, kind = getattr(toolset, "config", None), type(toolset).__name__
    if getattr(config, "url", None):
        raise ConfigError(f"toolset {kind} is served from {config.url}: in-process play calls a toolset's @vf.tool "
                          "methods itself and reaches no tool server")
    if getattr(config, "colocated", False):
        raise ConfigError(f"toolset {kind} is colocated in the agent's box, which in-process play does not start")
    runtime = getattr(config, "runtime", None)
    if runtime is not None and not isinstance(runtime, SubprocessConfig):
        raise ConfigError(f"toolset {kind} runs in a {getattr(runtime, 'type', type(runtime).__name__)} runtime; "
                          "in-process play calls its tools in this process (the subprocess runtime's place)")


@dataclass
class _Counts:
    """One episode's counters (its `verifiers_*` metrics): tool calls run, calls that could not be read, calls
    answered with an error, scorings that failed, and whether a `@vf.stop` ended it."""

    tool_calls: int = 0
    malformed_calls: int = 0
    tool_errors: int = 0
    scoring_errors: int = 0
    stopped: int = 0


class ToolBox:
    """The `@vf.tool` methods of some toolsets, under the names the model sees (`<server>_<tool>`, bare when the
    server's `TOOL_PREFIX` is None), registered on an in-process MCP server object for their schemas and
    argument checks. Each call reads and writes the rollout's `trace.state` through the toolset's state class,
    as verifiers' state channel does between a tool server and the trace."""

    def __init__(self) -> None:
        self.server = MCPServer("tempax")
        self.names: set[str] = set()
        self.own: list[Any] = []  # the rollout's own toolsets (a Task's), closed with the episode
        self.schemas: list[vf.Tool] = []
        self.trace: vf.Trace | None = None

    def add(self, toolset: Any, *, own: bool) -> None:
        check_toolset(toolset)
        if own:
            self.own.append(toolset)
        prefix = toolset.server_name
        for fn in discover_decorated(toolset, "tool"):
            raw = getattr(fn, "tool_name", None) or fn.__name__
            full = f"{prefix}_{raw}" if prefix else raw
            if full in self.names:
                raise ConfigError(f"two toolsets offer a tool named {full!r}; keep their server names apart")
            self.names.add(full)
            self.server.add_tool(self._with_trace_state(toolset, fn), name=full,
                                 description=(fn.__doc__ or "").strip() or None)

    def _with_trace_state(self, toolset: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
        toolset_state = state_cls(type(toolset))

        async def call(*args: Any, **kwargs: Any) -> Any:
            trace = self.trace
            assert trace is not None, "a tool ran outside an episode"
            # Base State has no fields of its own, so only a toolset with a State subclass shares it (verifiers'
            # rule); the copy in and out is the JSON round trip of its state channel.
            shared = toolset_state is not vf.State
            state = toolset_state.model_validate_json(trace.state.model_dump_json()) if shared else toolset_state()
            token = _call_state.set(state)
            try:
                result = fn(*args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
            finally:
                _call_state.reset(token)
            if shared:
                trace.state = type(trace.state).model_validate_json(state.model_dump_json())
            return result

        call.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]  # MCP reads the parameters here
        call.__name__ = fn.__name__
        return call

    async def describe(self) -> None:
        self.schemas = [vf.Tool(name=t.name, description=t.description or "", parameters=dict(t.input_schema))
                        for t in await self.server.list_tools()]

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """(the answer the model reads, whether it is an error), as the chat loop passes an MCP result on."""
        if name not in self.names:
            return f"error: unknown tool {name!r}", True  # the words of verifiers' chat loop
        try:
            result = await self.server.call_tool(name, arguments)
        except Exception as e:  # MCP's ToolError (bad arguments, the tool raised): what an MCP server answers
            return str(e), True
        texts = [block.text if getattr(block, "type", None) == "text" else str(block) for block in result.content]
        return "\n".join(texts), bool(result.is_error)

    async def close(self) -> None:
        for toolset in self.own:
            await toolset._exit_stack.aclose()  # what its setup entered (verifiers' server exits the same stack)


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if any(not isinstance(part, vf.TextContentPart) for part in content or []):
        raise ConfigError(f"{where} has image content; tempax plays verifiers tasks as text")
    return content_text(content)


def first_messages(task: vf.Task) -> list[VerifiersMessage]:
    """The conversation the null harness opens with: the system prompt, then the prompt (a string is one user
    message)."""
    data, kind = task.data, type(task).__name__
    if data.prompt is None:
        raise ConfigError(f"{kind} (idx {data.idx}) has no prompt: the user opens the conversation, which needs "
                          "verifiers' user agent (UserSimEnv), a second model tempax does not run")
    prompt = [vf.UserMessage(content=data.prompt)] if isinstance(data.prompt, str) else list(data.prompt)
    return ([vf.SystemMessage(content=data.system_prompt)] if data.system_prompt is not None else []) + prompt


def as_chat(message: VerifiersMessage, where: str) -> Message:
    """A verifiers message as the chat message tempax renders."""
    if isinstance(message, vf.AssistantMessage) and message.tool_calls:
        raise ConfigError(f"{where}: a prompt message with tool calls is not supported; give the prompt as text")
    out: Message = {"role": message.role, "content": _text(message.content, where) if message.content else ""}
    if isinstance(message, vf.ToolMessage) and message.name:
        out["name"] = message.name
    return out


class VerifiersEnvironment:
    """One episode of a verifiers task (docs/adding-an-environment.md, "Environments written for verifiers").
    Built by `verifiers_factory`, which holds what the episodes share: the task index, the loop, the taskset's
    shared toolsets and the call format."""

    def __init__(self, shared: "_Shared") -> None:
        self.shared = shared
        self.task: vf.Task | None = None
        self.trace: vf.Trace | None = None
        self.messages: list[VerifiersMessage] = []  # the conversation as verifiers holds it (no tool listing)
        self.tools = ToolBox()
        self.scored: dict[str, float] = {}
        self.counts = _Counts()

    def reset(self, task_row: Mapping[str, Any]) -> list[Message]:
        task = self.shared.index.for_row(task_row)
        return self.shared.loop.run(self._reset(task))

    async def _reset(self, task: vf.Task) -> list[Message]:
        self.task, self.counts, self.scored = task, _Counts(), {}
        self.messages = first_messages(task)
        self.trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key,
                                                 hash=task.hash),
                              state=state_cls(type(task))(), agent=vf.AgentInfo(config=self.shared.agent))
        self.tools = ToolBox()
        for toolset in self.shared.toolsets:
            self.tools.add(toolset, own=False)
        for toolset in type(task).toolsets(task.config):  # a rollout's own servers: set up for this task
            self.tools.add(toolset, own=True)
            await toolset.setup()
            await toolset.setup_task(task.data)
        await self.tools.describe()
        self.tools.trace = self.trace
        if _overrides(task, "setup"):
            await invoke(task.setup, {"trace": self.trace})
        chat = [as_chat(m, f"{type(task).__name__} (idx {task.data.idx}) prompt") for m in self.messages]
        if self.tools.schemas:
            listing = tools_system_text([_listed(t) for t in self.tools.schemas], self.shared.tool_format)
            if chat[0]["role"] == "system":
                chat[0] = {**chat[0], "content": f"{chat[0]['content']}\n\n{listing}"}
            else:
                chat.insert(0, {"role": "system", "content": listing})
        return chat

    def step(self, assistant_message: str) -> StepResult:
        return self.shared.loop.run(self._step(assistant_message))

    async def _step(self, reply: str) -> StepResult:
        trace = self.trace
        assert trace is not None and self.task is not None, "step before reset"
        calls: list[ToolCall] = []
        content = reply
        if self.tools.schemas:
            parsed = parse_tool_calls(reply, self.shared.tool_format)
            calls = list(parsed.calls)
            self.counts.malformed_calls += len(parsed.malformed)
            if calls:
                content = parsed.content
        turn = len(trace.assistant_messages) + 1
        tool_calls = [vf.ToolCall(id=f"call_{turn}_{i}", name=c.name, arguments=json.dumps(c.arguments))
                      for i, c in enumerate(calls)]
        response = vf.Response(id=f"{trace.id}-{turn}", created=0, model=MODEL_NAME,
                               message=vf.AssistantMessage(content=content, tool_calls=tool_calls or None),
                               finish_reason="tool_calls" if tool_calls else "stop")
        node = graph.prepare_turn(trace, self.messages, self.tools.schemas).commit(response)
        trace.calls.append(vf.ModelCall(node=node, model=MODEL_NAME, finish_reason=response.finish_reason))
        self.messages.append(response.message)
        stopped = await self._stopped(self.shared.response_stops, {vf.Response: response, vf.Trace: trace})
        if stopped is None and tool_calls:  # the gate: request stops see each proposed call before it runs
            for call in tool_calls:
                probe = vf.ToolMessage(tool_call_id=call.id, content="", name=call.name)
                stopped = stopped or await self._request_stopped([*self.messages, probe])
        if stopped is not None or not tool_calls:
            return await self._finish(stopped)
        answers = []
        for call, parsed_call in zip(tool_calls, calls):
            text, error = await self.tools.call(call.name, parsed_call.arguments)
            self.counts.tool_calls += 1
            self.counts.tool_errors += int(error)
            self.messages.append(vf.ToolMessage(tool_call_id=call.id, content=text, name=call.name))
            answers.append(tool_message(call.name, text))
        # Before the next model call: Trace stops refuse it with nothing committed; Request stops see the tool
        # results, which are then committed as the prompt that ended the trace (the interception server's order).
        stopped = await self._stopped(self.shared.trace_stops, {vf.Trace: trace})
        if stopped is None:
            stopped = await self._request_stopped(self.messages)
            if stopped is not None:
                graph.prepare_turn(trace, self.messages, self.tools.schemas).commit_prompt()
        if stopped is not None:
            return await self._finish(stopped)
        return StepResult(messages=tuple(answers), rewards=await self._score())

    async def _stopped(self, stops: Sequence[Callable[..., Any]], available: dict[type, Any]) -> str | None:
        for stop in stops:
            # Requests and responses go in as copies (a predicate must not edit them), the trace as it is.
            result = await call_hook(stop, {kind: value if kind is vf.Trace else value.model_copy(deep=True)
                                            for kind, value in available.items()})
            if not isinstance(result, bool):
                raise ConfigError(f"@vf.stop {stop.__name__!r} returned {type(result).__name__}; it must return bool")
            if result:
                return stop.__name__
        return None

    async def _request_stopped(self, messages: list[VerifiersMessage]) -> str | None:
        if not self.shared.request_stops:
            return None
        request = vf.Request(messages=list(messages), tools=self.tools.schemas or None)
        return await self._stopped(self.shared.request_stops, {vf.Request: request, vf.Trace: self.trace})

    async def _finish(self, stopped: str | None) -> StepResult:
        if stopped is not None:
            assert self.trace is not None
            self.trace.stop(stopped)
            self.counts.stopped = 1
        rewards = await self._score()
        await self.tools.close()
        return StepResult(rewards=rewards, done=True)

    async def _score(self) -> dict[str, float]:
        """Each reward's weighted value minus what the earlier replies were given, so an episode's parts add up to
        verifiers' score of the conversation as far as it went."""
        assert self.trace is not None and self.task is not None
        try:
            await self.task.score(self.trace)
            values = {n: (r.value if r is not None else 0.0) for n, r in self.trace.rewards.items()}
        except vf.TaskError as e:  # a reward raised on this conversation: verifiers fails the rollout, unscored
            self.counts.scoring_errors += 1
            self.shared.warn_once(f"verifiers scoring of {type(self.task).__name__} failed, scored 0: {e}")
            values = {n: 0.0 for n in (*self.scored, *self.trace.rewards)}
        parts = {n: values.get(n, 0.0) - self.scored.get(n, 0.0) for n in (*self.scored, *values)}
        self.scored = values
        return parts

    def metrics(self) -> dict[str, float]:
        c = self.counts
        out = {f"{METRIC_PREFIX}{k}": float(v) for k, v in vars(c).items()}
        if self.trace is not None:
            out.update({f"{METRIC_PREFIX}{k}": float(v) for k, v in self.trace.metrics.items() if v is not None})
        return out


def _listed(schema: vf.Tool) -> Tool:
    """A verifiers tool schema in the shape `tools_system_text` lists (the OpenAI function layout)."""
    function = {"name": schema.name, "description": schema.description, "parameters": schema.parameters}
    return Tool(schema.name, lambda **_: "", {"type": "function", "function": function})


@dataclass
class _Shared:
    """What every episode of one run shares."""

    index: TaskIndex
    loop: _LoopThread
    toolsets: list[Any]
    tool_format: ToolFormat
    agent: AgentConfig
    trace_stops: list[Callable[..., Any]]
    request_stops: list[Callable[..., Any]]
    response_stops: list[Callable[..., Any]]
    warned: bool = False

    def warn_once(self, message: str) -> None:
        if not self.warned:
            self.warned = True
            warnings.warn(message, RuntimeWarning, stacklevel=2)


def verifiers_factory(builder: Any, name: str, options: Mapping[str, Any],
                      tokenizer: Tokenizer) -> Callable[[], VerifiersEnvironment]:
    """A fresh `VerifiersEnvironment` per episode over the taskset `builder` makes from `options`. The first task
    is checked and reset now, so a taskset in-process play cannot run is refused before training."""
    taskset = build_taskset(builder, name, options)
    index = TaskIndex(taskset)
    first = index.first()
    if first is None:
        raise ConfigError(f"env.name=verifiers:{name}: the taskset yields no tasks")
    check_task(first)
    stops: dict[type, list[Callable[..., Any]]] = {vf.Trace: [], vf.Request: [], vf.Response: []}
    for stop in first.hooks("stop"):
        stops[hook_boundary(stop, allow_trace=True)].append(stop)
    loop = _loop()
    shared_toolsets = list(type(taskset).toolsets(taskset.config))
    for toolset in shared_toolsets:
        check_toolset(toolset)
        loop.run(toolset.setup())  # a taskset's toolsets serve every rollout: set up once, never per task
    shared = _Shared(index=index, loop=loop, toolsets=shared_toolsets,
                     tool_format=detect_tool_format(getattr(tokenizer.hf, "chat_template", None)),
                     agent=AgentConfig(harness={"id": "null"}, model=MODEL_NAME), trace_stops=stops[vf.Trace],
                     request_stops=stops[vf.Request], response_stops=stops[vf.Response])

    def make() -> VerifiersEnvironment:
        return VerifiersEnvironment(shared)

    make().reset({"idx": 0})
    return make
