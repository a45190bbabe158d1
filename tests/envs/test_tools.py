"""Tool schemas from hints and docstrings, argument checks, and `call_tool` failing soft."""

from __future__ import annotations

from typing import Literal

import pytest

from tempax.envs.tool_calls import ToolCall
from tempax.envs.tools import Tool, ToolDefinitionError, ToolRefusal, argument_problems, call_tool, json_schema


def convert(amount: float, unit: Literal["km", "mi"], places: int | None = None, tags: list[str] | None = None) -> str:
    """Converts a distance.

    Longer explanation on a second paragraph.

    Args:
      amount: how far, in the given unit.
      unit: the unit of `amount`.
      places (int): decimal places to round to;
        none keeps every digit.
      tags: labels to echo back.

    Returns:
      the distance in the other unit.
    """
    if places == 99:
        raise ToolRefusal("too many places")
    if places == 98:
        raise RuntimeError("bug inside the tool")
    return f"{amount * (1.609 if unit == 'mi' else 1 / 1.609):.{places or 3}f}"


def test_schema_from_hints_and_docstring():
    assert json_schema(convert) == {
        "type": "function",
        "function": {
            "name": "convert",
            "description": "Converts a distance. Longer explanation on a second paragraph.",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number", "description": "how far, in the given unit."},
                    "unit": {"type": "string", "enum": ["km", "mi"], "description": "the unit of `amount`."},
                    "places": {"type": "integer", "nullable": True,
                               "description": "decimal places to round to; none keeps every digit."},
                    "tags": {"type": "array", "items": {"type": "string"}, "nullable": True,
                             "description": "labels to echo back."},
                },
                "required": ["amount", "unit"],
            },
        },
    }


def test_undescribable_tools_are_refused_when_built():
    def no_hint(x):
        """Does a thing.

        Args:
          x: the thing.
        """

    def no_arg_doc(x: int) -> int:
        """Does a thing."""

    def no_doc(x: int) -> int:
        pass

    with pytest.raises(ToolDefinitionError, match="parameter 'x' has no type hint"):
        json_schema(no_hint)
    with pytest.raises(ToolDefinitionError, match="'x' is not described"):
        json_schema(no_arg_doc)
    with pytest.raises(ToolDefinitionError, match="give the function a docstring"):
        json_schema(no_doc)


def test_argument_problems_name_each_one():
    schema = json_schema(convert)
    assert argument_problems(schema, {"amount": 2, "unit": "km"}) == []  # an integer is a number
    assert argument_problems(schema, {"amount": "2", "unit": "yd", "speed": 1, "tags": ["a", 3]}) == [
        "argument 'amount' must be number, got str '2'",
        "argument 'unit' must be one of ['km', 'mi'], got 'yd'",
        "unknown argument 'speed' (the tool takes ['amount', 'places', 'tags', 'unit'])",
        "argument 'tags'[1] must be string, got int 3",
    ]
    assert argument_problems(schema, {"unit": "km", "places": 2.5}) == [
        "missing argument 'amount'", "argument 'places' must be integer, got float 2.5"]
    assert argument_problems(schema, {"amount": True, "unit": "km"}) == [
        "argument 'amount' must be number, got bool True"]


def test_call_tool_never_raises():
    tools = {"convert": Tool.from_function(convert)}
    ok = call_tool(tools, ToolCall("convert", {"amount": 10, "unit": "mi", "places": 1}))
    assert (ok.content, ok.error) == ("16.1", False) and ok.seconds >= 0
    unknown = call_tool(tools, ToolCall("weather", {}))
    assert unknown.error and unknown.content == "error: unknown tool 'weather'; available tools: ['convert']"
    wrong = call_tool(tools, ToolCall("convert", {"amount": "ten", "unit": "mi"}))
    assert wrong.error and wrong.content == "error: convert: argument 'amount' must be number, got str 'ten'"
    refused = call_tool(tools, ToolCall("convert", {"amount": 1, "unit": "km", "places": 99}))
    assert refused.error and refused.content == "error: too many places"
    crashed = call_tool(tools, ToolCall("convert", {"amount": 1, "unit": "km", "places": 98}))
    assert crashed.error and crashed.content == "error: convert failed: RuntimeError: bug inside the tool"
