"""A calculator tool: exact integer and rational arithmetic by its own tokenizer and parser, never `eval`.

Grammar (precedence low to high; `^` and `**` are powers, right-associative and binding tighter than a unary
sign, so -2^2 = -4 and 2^-1 = 1/2 as in written mathematics):

    expr   := term (("+" | "-") term)*
    term   := unary (("*" | "/") unary)*
    unary  := ("+" | "-") unary | power
    power  := atom (("^" | "**") unary)?
    atom   := NUMBER | "(" expr ")"          NUMBER: digits with an optional decimal part, e.g. 12, 0.5, .25

Values are `fractions.Fraction`s, so 1/3 * 3 is exactly 1 and 0.1 + 0.2 is exactly 0.3. A result prints as an
integer, as an exact decimal when its denominator divides a power of ten, else as a fraction ("7/3").

Limits keep a model's input from costing the trainer time or memory; each is refused with a message saying so:
input length, number length, nesting depth, the size in bits of every intermediate value (checked before a power
is computed, from the operands' sizes), exponents that are not integers or are too large, and a wall-clock bound.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from fractions import Fraction

from tempax.envs.tools import Tool, ToolRefusal

_TOKEN = re.compile(r"\s*(?:(\d+\.?\d*|\.\d+)|(\*\*|[-+*/^()]))")


@dataclass(frozen=True)
class CalculatorLimits:
    """Bounds on one evaluation.

    Attributes:
      max_chars: longest expression accepted.
      max_digits: longest number literal.
      max_depth: deepest nesting of parentheses and unary signs.
      max_bits: largest numerator or denominator of any intermediate value, in bits (4096 bits ~ 1233 digits).
      max_exponent: largest absolute exponent.
      max_seconds: wall-clock bound on one evaluation.
    """

    max_chars: int = 256
    max_digits: int = 64
    max_depth: int = 32
    max_bits: int = 4096
    max_exponent: int = 4096
    max_seconds: float = 0.25


class _Parser:
    def __init__(self, text: str, limits: CalculatorLimits) -> None:
        self.limits = limits
        self.deadline = time.perf_counter() + limits.max_seconds
        self.tokens = self._tokenize(text)
        self.pos = 0
        self.depth = 0

    def _tokenize(self, text: str) -> list[str]:
        tokens, pos = [], 0
        stripped = text.rstrip()
        while pos < len(stripped):
            match = _TOKEN.match(stripped, pos)
            if not match:
                raise ToolRefusal(f"unexpected character {stripped[pos:].lstrip()[0]!r} at position {pos}; "
                                  "use numbers, + - * / ^ and parentheses")
            number, op = match.groups()
            if number is not None and len(number.replace(".", "")) > self.limits.max_digits:
                raise ToolRefusal(f"number too long (more than {self.limits.max_digits} digits)")
            tokens.append(number if number is not None else op)
            pos = match.end()
        if not tokens:
            raise ToolRefusal("empty expression")
        return tokens

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise ToolRefusal("the expression ends too early")
        self.pos += 1
        return token

    def _check(self, value: Fraction) -> Fraction:
        if time.perf_counter() > self.deadline:
            raise ToolRefusal(f"took longer than {self.limits.max_seconds} s")
        if max(value.numerator.bit_length(), value.denominator.bit_length()) > self.limits.max_bits:
            raise ToolRefusal(f"result too large (more than {self.limits.max_bits} bits)")
        return value

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > self.limits.max_depth:
            raise ToolRefusal(f"nested too deeply (more than {self.limits.max_depth} levels)")

    def parse(self) -> Fraction:
        value = self.expr()
        if self._peek() is not None:
            raise ToolRefusal(f"unexpected {self._peek()!r} after a complete expression")
        return value

    def expr(self) -> Fraction:
        value = self.term()
        while self._peek() in ("+", "-"):
            op, right = self._take(), self.term()
            value = self._check(value + right if op == "+" else value - right)
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self._peek() in ("*", "/"):
            op, right = self._take(), self.unary()
            if op == "/" and right == 0:
                raise ToolRefusal("division by zero")
            value = self._check(value * right if op == "*" else value / right)
        return value

    def unary(self) -> Fraction:
        if self._peek() in ("+", "-"):
            op = self._take()
            self._enter()
            value = self.unary()
            self.depth -= 1
            return -value if op == "-" else value
        return self.power()

    def power(self) -> Fraction:
        base = self.atom()
        if self._peek() not in ("^", "**"):
            return base
        self._take()
        self._enter()
        exponent = self.unary()
        self.depth -= 1
        if exponent.denominator != 1:
            raise ToolRefusal("exponent must be an integer")
        n = exponent.numerator
        if abs(n) > self.limits.max_exponent:
            raise ToolRefusal(f"exponent too large (|exponent| over {self.limits.max_exponent})")
        if base == 0 and n < 0:
            raise ToolRefusal("division by zero (zero to a negative power)")
        # The result has about |n| times the operand's bits: refuse before computing it.
        bits = max(base.numerator.bit_length(), base.denominator.bit_length())
        if bits > 1 and (bits - 1) * abs(n) > self.limits.max_bits:
            raise ToolRefusal(f"result too large (more than {self.limits.max_bits} bits)")
        return self._check(base ** n)

    def atom(self) -> Fraction:
        token = self._take()
        if token == "(":
            self._enter()
            value = self.expr()
            self.depth -= 1
            if self._take() != ")":
                raise ToolRefusal("missing closing parenthesis")
            return value
        if token[0].isdigit() or token[0] == ".":
            return Fraction(token)
        raise ToolRefusal(f"expected a number or '(', got {token!r}")


def evaluate(expression: str, limits: CalculatorLimits = CalculatorLimits()) -> Fraction:
    """The exact value of `expression`; raises `ToolRefusal` with the reason when it cannot or may not."""
    if len(expression) > limits.max_chars:
        raise ToolRefusal(f"expression too long ({len(expression)} characters, at most {limits.max_chars})")
    return _Parser(expression, limits).parse()


def format_number(value: Fraction) -> str:
    """An integer as itself, a terminating fraction as an exact decimal (2.5), any other as n/d (7/3)."""
    if value.denominator == 1:
        return str(value.numerator)
    d, twos, fives = value.denominator, 0, 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    if d != 1:
        return f"{value.numerator}/{value.denominator}"
    places = max(twos, fives)
    scaled = abs(value.numerator) * 10 ** places // value.denominator
    sign = "-" if value < 0 else ""
    whole, frac = divmod(scaled, 10 ** places)
    return f"{sign}{whole}.{frac:0{places}d}"


def calculator(expression: str) -> str:
    """Evaluates an arithmetic expression exactly with + - * / ^ and parentheses.

    Args:
      expression: the expression to evaluate, e.g. "12 * (3 + 4) / 5".
    """
    return format_number(evaluate(expression))


def calculator_tool(limits: CalculatorLimits | None = None) -> Tool:
    """The calculator as a `Tool`, with its own limits if given."""
    if limits is None:
        return Tool.from_function(calculator)

    def bounded(expression: str) -> str:
        return format_number(evaluate(expression, limits))

    bounded.__doc__ = calculator.__doc__
    return Tool.from_function(bounded, name="calculator")
