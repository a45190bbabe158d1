"""Tools: plain Python callables with a JSON-schema signature built from their type hints and docstring
(`json_schema`, `Tool.from_function`), and `call_tool`, which runs one parsed call and never raises (whatever goes
wrong comes back as the tool's answer; nothing the model wrote is executed).

    def calculator(expression: str) -> str:
        '''Evaluates an arithmetic expression exactly.

        Args:
          expression: the expression, e.g. "12 * (3 + 4)".
        '''
"""

from __future__ import annotations

import inspect
import re
import time
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Sequence

from tempax.envs.tool_calls import ToolCall
from tempax.errors import TempaxError

_JSON_TYPES: dict[type, str] = {int: "integer", float: "number", str: "string", bool: "boolean",
                                list: "array", tuple: "array", dict: "object"}


class ToolDefinitionError(TempaxError):
    """A tool's signature cannot be described to the model (a parameter without a type hint or description)."""


class ToolRefusal(Exception):
    """Raised by a tool to answer the model with a clear refusal ("division by zero") instead of a result."""


def _type_schema(hint: Any, where: str) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and len(args) == 2:
            schema = _type_schema(inner[0], where)
            schema["nullable"] = True
            return schema
        return {"anyOf": [_type_schema(a, where) for a in args]}
    if origin is Literal:
        return {"type": _JSON_TYPES[type(args[0])], "enum": list(args)}
    if origin in (list, tuple, Sequence):
        return {"type": "array", **({"items": _type_schema(args[0], where)} if args else {})}
    if origin in (dict, Mapping):
        return {"type": "object"}
    raise ToolDefinitionError(f"{where}: type {hint!r} has no JSON-schema equivalent; use int, float, str, bool, "
                              "list[...], dict, Literal[...] or X | None")


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) of a Google-style docstring (`Args:` block, `name: text` lines,
    indented continuation lines)."""
    doc = inspect.cleandoc(doc)
    head, _, rest = doc.partition("\nArgs:")
    described: dict[str, str] = {}
    current = None
    for line in rest.splitlines()[1:]:
        if line.strip() and not line.startswith(" "):
            break  # the next section (Returns:, Raises:)
        match = re.match(r"\s+(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)", line)
        if match and (current is None or len(line) - len(line.lstrip()) <= indent):
            current, indent = match.group(1), len(line) - len(line.lstrip())
            described[current] = match.group(2).strip()
        elif current is not None and line.strip():
            described[current] += " " + line.strip()
    return " ".join(head.split()), described


def json_schema(fn: Callable[..., Any], *, name: str | None = None) -> dict[str, Any]:
    """The OpenAI-style function schema of `fn` from its type hints and Google-style docstring."""
    tool_name = name or fn.__name__
    description, described = _docstring_parts(fn.__doc__ or "")
    if not description:
        raise ToolDefinitionError(f"tool {tool_name!r}: give the function a docstring saying what it does")
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        where = f"tool {tool_name!r}, parameter {param.name!r}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(f"{where}: *args / **kwargs cannot be described; name each parameter")
        if param.name not in hints:
            raise ToolDefinitionError(f"{where} has no type hint")
        if param.name not in described:
            raise ToolDefinitionError(f"{where} is not described in the docstring's Args: section")
        properties[param.name] = {**_type_schema(hints[param.name], where), "description": described[param.name]}
        if param.default is param.empty:
            required.append(param.name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": tool_name, "description": description, "parameters": parameters}}


def _type_problem(value: Any, schema: Mapping[str, Any], where: str) -> str | None:
    if value is None:
        return None if schema.get("nullable") else f"{where} must not be null"
    if "anyOf" in schema:
        ok = any(_type_problem(value, s, where) is None for s in schema["anyOf"])
        return None if ok else f"{where} has the wrong type ({type(value).__name__})"
    kind = schema["type"]
    # JSON has no int/float split but a model writing 2.5 for an integer is wrong; bool is not a number in JSON.
    checks = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
              "array": lambda v: isinstance(v, list), "object": lambda v: isinstance(v, dict)}
    if not checks[kind](value):
        return f"{where} must be {kind}, got {type(value).__name__} {value!r}"[:200]
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {schema['enum']}, got {value!r}"
    if kind == "array" and "items" in schema:
        for i, item in enumerate(value):
            problem = _type_problem(item, schema["items"], f"{where}[{i}]")
            if problem:
                return problem
    return None


def argument_problems(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> list[str]:
    """What is wrong with `arguments` for a tool's `schema`: missing required ones, unknown ones, wrong types."""
    params = schema["function"]["parameters"]
    problems = [f"missing argument {n!r}" for n in params["required"] if n not in arguments]
    known = params["properties"]
    for key, value in arguments.items():
        if key not in known:
            problems.append(f"unknown argument {key!r} (the tool takes {sorted(known)})")
        else:
            problem = _type_problem(value, known[key], f"argument {key!r}")
            if problem:
                problems.append(problem)
    return problems


@dataclass(frozen=True)
class Tool:
    """A callable the model may call, with the schema it is shown.

    `Tool.from_function(fn)` gives the OpenAI-style schema a chat template or a system prompt lists
    (`{"type": "function", "function": {"name", "description", "parameters"}}`), in the spirit of `transformers`'
    `get_json_schema`. Types map int -> integer, float -> number, str -> string, bool -> boolean, list[X] -> array,
    dict -> object, Literal[...] -> enum, `X | None` -> nullable; a parameter without a hint or a description is
    refused when the tool is built, since the model would see a signature it cannot follow."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]

    @classmethod
    def from_function(cls, fn: Callable[..., Any], *, name: str | None = None) -> "Tool":
        schema = json_schema(fn, name=name)
        return cls(schema["function"]["name"], fn, schema)


@dataclass(frozen=True)
class ToolResult:
    """One call's outcome: the text the model reads, whether it is an error, and the seconds the tool ran."""

    name: str
    content: str
    error: bool = False
    seconds: float = 0.0


def call_tool(tools: Mapping[str, Tool], call: ToolCall) -> ToolResult:
    """Runs `call` against `tools` (name -> Tool); never raises: an unknown tool, arguments that do not match the
    schema, a tool's own refusal (`ToolRefusal`) or any exception in the tool all come back as an error
    `ToolResult` whose text the model reads as the tool's answer. The arguments are JSON values handed to the
    function."""
    tool = tools.get(call.name)
    if tool is None:
        return ToolResult(call.name, f"error: unknown tool {call.name!r}; available tools: {sorted(tools)}", True)
    problems = argument_problems(tool.schema, call.arguments)
    if problems:
        return ToolResult(call.name, f"error: {call.name}: " + "; ".join(problems), True)
    start = time.perf_counter()
    try:
        out = tool.fn(**call.arguments)
    except ToolRefusal as e:
        return ToolResult(call.name, f"error: {e}", True, time.perf_counter() - start)
    except Exception as e:  # a tool's own bug must not end the rollout; the model sees it as an error answer
        return ToolResult(call.name, f"error: {call.name} failed: {type(e).__name__}: {e}"[:500], True,
                          time.perf_counter() - start)
    return ToolResult(call.name, out if isinstance(out, str) else str(out), False, time.perf_counter() - start)
