"""The calculator: exact results worked out by hand, refusals with their reasons, none after computing a value
over the bit limit."""

from __future__ import annotations

import fractions
from fractions import Fraction

import pytest

from tempax.envs.calculator import CalculatorLimits, calculator, calculator_tool, evaluate, format_number
from tempax.envs.tool_calls import ToolCall
from tempax.envs.tools import ToolRefusal, call_tool


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("12 * 34", "408"),                   # 12 * 34 = 408
        ("1 + 2 * 3", "7"),                   # * before +: 1 + 6
        ("(1 + 2) * 3", "9"),
        ("7 / 3", "7/3"),                     # not a terminating decimal
        ("1/3 * 3", "1"),                     # exact: (1/3) * 3 = 1
        ("0.1 + 0.2", "0.3"),                 # exact decimals: 1/10 + 2/10 = 3/10
        ("5 / 4", "1.25"),                    # 5/4 = 1.25: denominator 2^2
        ("-2^2", "-4"),                       # the power binds tighter than the sign: -(2^2)
        ("(-2)^2", "4"),
        ("2^3^2", "512"),                     # right-associative: 2^(3^2) = 2^9
        ("2 ** -2", "0.25"),                  # 1 / 2^2
        ("--3 - -3", "6"),                    # 3 - (-3)
        ("-7/2", "-3.5"),
        ("123456789 * 987654321", "121932631112635269"),
        (".5 + 12.", "12.5"),
    ],
)
def test_exact_results(expression, expected):
    assert calculator(expression) == expected


@pytest.mark.parametrize(
    "expression, reason",
    [
        ("1 / 0", "division by zero"),
        ("5 / (2 - 2)", "division by zero"),
        ("0 ^ -1", "division by zero"),
        ("9^9^9", "exponent too large"),                  # 9^9 = 387420489 > 4096
        ("10^4000", "result too large"),                 # ~13288 bits > 4096
        ("2^0.5", "exponent must be an integer"),
        ("1+" * 200 + "1", "expression too long"),
        ("1" * 65, "number too long"),
        ("(" * 40 + "1" + ")" * 40, "nested too deeply"),
        ("-" * 40 + "1", "nested too deeply"),
        ("__import__('os')", "unexpected character '_'"),
        ("2 3", "unexpected '3'"),
        ("(1 + 2", "the expression ends too early"),
        ("1 +", "the expression ends too early"),
        ("", "empty expression"),
        ("*", "expected a number"),
    ],
)
def test_refusals_say_why_and_are_quick(expression, reason, monkeypatch):
    """Quick because nothing large is computed first: every power the evaluation asks for has a result within the
    bit limit, estimated before it is computed (base bits x |exponent|; 9^9^9 computes 9^9 = 387420489, 29 bits,
    then refuses the exponent), so a power tower is refused, not worked out."""
    limit = CalculatorLimits().max_bits
    powers: list[tuple[Fraction, int]] = []
    power = fractions.Fraction.__pow__

    def bounded_power(base, exponent):
        bits = max(base.numerator.bit_length(), base.denominator.bit_length())
        assert (bits - 1) * abs(int(exponent)) <= limit, f"computes {base}^{exponent} before refusing"
        powers.append((base, exponent))
        return power(base, exponent)

    monkeypatch.setattr(fractions.Fraction, "__pow__", bounded_power)
    with pytest.raises(ToolRefusal, match=reason.replace("(", "\\(")):
        evaluate(expression)
    assert powers == ([(9, 9)] if expression == "9^9^9" else [])


def test_the_bit_limit_holds_for_long_products():
    """A chain of multiplications grows one step at a time: each product is checked, so it stops early.
    99999999^20 has 20 * log2(99999999) = 20 * 26.575 = 531.5 -> 532 bits: within the default 4096, refused
    under a 256-bit limit."""
    chain = "*".join(["99999999"] * 20)
    assert evaluate(chain).numerator.bit_length() == 532
    with pytest.raises(ToolRefusal, match="more than 256 bits"):
        evaluate(chain, CalculatorLimits(max_bits=256))


def test_the_time_bound_is_enforced():
    with pytest.raises(ToolRefusal, match="took longer than 0.0 s"):
        evaluate("1 + 1", CalculatorLimits(max_seconds=0.0))


def test_format_number():
    assert format_number(Fraction(-1, 8)) == "-0.125"
    assert format_number(Fraction(22, 7)) == "22/7"
    assert format_number(Fraction(3, 1)) == "3"


def test_as_a_tool_refusals_reach_the_model_as_errors():
    tools = {"calculator": calculator_tool()}
    assert call_tool(tools, ToolCall("calculator", {"expression": "6*7"})).content == "42"
    result = call_tool(tools, ToolCall("calculator", {"expression": "1/0"}))
    assert result.error and result.content == "error: division by zero"
    schema = tools["calculator"].schema["function"]
    assert schema["name"] == "calculator" and schema["parameters"]["required"] == ["expression"]
    small = {"calculator": calculator_tool(CalculatorLimits(max_chars=4))}
    assert call_tool(small, ToolCall("calculator", {"expression": "1+2+3"})).content.startswith(
        "error: expression too long")
