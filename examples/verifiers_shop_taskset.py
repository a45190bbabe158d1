"""A taskset written for verifiers 0.4 (`import verifiers.v1 as vf`), played by tempax through
`env: {name: "verifiers:examples/verifiers_shop_taskset.py:ShopTaskset"}`.

What does a basket cost? Each task names two or three items; the task's `Shop` toolset offers `price_of(item)`,
the shop's price in cents, and the task's rewards read the final reply: `correct` (its last number is the total,
weight 1.0) and `brief` (at most 24 characters, weight 0.1); the `lookups` metric counts the tool results. The
taskset's config (`baskets`, `seed`) is what a recipe's `env.options` set. Nothing here imports tempax: it is a
plain verifiers taskset (docs/adding-an-environment.md, verifiers).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

import verifiers.v1 as vf

PRICES = {"apple": 45, "bread": 230, "milk": 120, "eggs": 310, "cheese": 540, "rice": 180, "tea": 260, "jam": 390}
SYSTEM_PROMPT = "You work at a shop's till. Answer with the total in cents, a number only."


class ShopData(vf.TaskData):
    items: list[str] = []
    total: int = 0


class Shop(vf.Toolset[vf.ToolsetConfig]):
    @vf.tool
    async def price_of(self, item: str) -> str:
        """The shop's price of one item, in cents."""
        price = PRICES.get(item.strip().lower())
        return str(price) if price is not None else f"we do not sell {item!r}; we sell {', '.join(sorted(PRICES))}"


class ShopTask(vf.Task[ShopData]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [Shop(vf.ToolsetConfig())]

    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        numbers = re.findall(r"\d+", trace.last_reply)
        return float(bool(numbers) and int(numbers[-1]) == self.data.total)

    @vf.reward(weight=0.1)
    async def brief(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply) <= 24)

    @vf.metric
    async def lookups(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class ShopConfig(vf.TasksetConfig):
    baskets: int = 16
    """How many baskets (tasks)."""
    seed: int = 0
    """Which baskets."""


class ShopTaskset(vf.Taskset[ShopTask, ShopConfig]):
    def load(self) -> Iterator[ShopTask]:
        rng = random.Random(self.config.seed)
        for i in range(self.config.baskets):
            items = rng.sample(sorted(PRICES), 2 + i % 2)
            prompt = (f"What do {', '.join(items)} cost together? Look up each price with the shop's price tool, "
                      "then answer with the total in cents.")
            data = ShopData(id=f"basket-{i}", prompt=prompt, system_prompt=SYSTEM_PROMPT, items=items,
                            total=sum(PRICES[item] for item in items))
            yield ShopTask(data, self.config.task)
