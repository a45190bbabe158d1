"""A user-written tool and the scripted policy that writes its warm-start transcripts: a shop's price list.

`price_of(item)` answers a price from the shop's table; task rows (`examples/price_tasks.jsonl`) ask what a
basket costs, with the reference total in `answer`. Nothing here imports more of tempax than `ToolRefusal`: the
tool is a plain typed function with a docstring, which `env: {name: tools, tools: [...]}` turns into a tool (its
schema from the hints and the docstring), and `scripted_reply` is the policy `tempax data episodes` plays to
write correct tool-calling transcripts for an SFT warm-start (docs/adding-an-environment.md).
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from tempax.envs.tools import ToolRefusal

PRICES_CENTS = {"apple": 45, "banana": 30, "bread": 240, "butter": 315, "cheese": 560, "eggs": 289, "milk": 119,
                "orange": 55, "pear": 60, "rice": 175, "tea": 410, "tomato": 38}


def price_of(item: str) -> str:
    """The shop's price of one unit of an item, in cents.

    Args:
      item: the item's name, e.g. "apple".
    """
    key = item.strip().lower()
    if key not in PRICES_CENTS and key.removesuffix("s") in PRICES_CENTS:  # "apples" is "apple"
        key = key.removesuffix("s")
    if key not in PRICES_CENTS:
        close = difflib.get_close_matches(key, PRICES_CENTS, n=3)
        raise ToolRefusal(f"no item {item!r}" + (f"; did you mean {', '.join(close)}?" if close else ""))
    return str(PRICES_CENTS[key])


def scripted_reply(messages: list[dict[str, Any]], task_row: dict[str, Any]) -> dict[str, Any] | str:
    """A correct episode, one reply per call: the prices of the basket's items first, then the calculator on
    the total, then the answer. It reads the results so far from the conversation's `tool` messages, and returns
    each reply in the common layout (`tool_calls` with names and arguments); tempax writes the calls in the
    model's own format."""
    results = [m["content"] for m in messages if m["role"] == "tool"]
    items = task_row["items"]  # [[name, count], ...]
    if not results:
        return {"content": "", "tool_calls": [{"name": "price_of", "arguments": {"item": name}} for name, _ in items]}
    if len(results) == len(items):
        expression = " + ".join(f"{count} * {price}" for (_, count), price in zip(items, results))
        return {"content": "", "tool_calls": [{"name": "calculator", "arguments": {"expression": expression}}]}
    return f"<answer>\n{results[-1]}\n</answer>"


def basket_row(items: list[list[Any]]) -> dict[str, Any]:
    """The task row asking what a basket ([[name, count], ...]) costs, with its reference total in `answer`."""
    basket = " and ".join(f"{n} {name}" for name, n in items)
    question = (f"At the shop, what do {basket} cost together, in cents? Look up each price with price_of and add "
                "them up with the calculator; then give only the total between <answer> and </answer>.")
    return {"prompt_messages": [{"role": "user", "content": question}], "items": items,
            "answer": str(sum(n * PRICES_CENTS[name] for name, n in items))}


def write_tasks(path: str, count: int = 48) -> None:
    """Writes `count` basket questions of two or three items (deterministic: the same file every time)."""
    names = sorted(PRICES_CENTS)
    with open(path, "w") as f:
        for i in range(count):
            picked = [names[(i * 5 + k * 7) % len(names)] for k in range(2 + i % 2)]
            items = [[name, 1 + (i + k) % 4] for k, name in enumerate(picked)]
            f.write(json.dumps(basket_row(items)) + "\n")


if __name__ == "__main__":
    write_tasks("examples/price_tasks.jsonl")
