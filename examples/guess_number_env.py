"""A user-written environment: guess a secret number, told "higher" or "lower" after each guess.

It needs nothing from tempax but the protocol's `StepResult`: `reset` gives the first messages from a task row
(`{"secret": 37, "low": 1, "high": 100}`), `step` reads the last number in the reply and answers. Rewards come per
turn (`turn`: -0.1 for each wrong guess) and at the end (`found`: 1.0), so an episode's return favours finding
the number in fewer guesses. Run it with `tempax.envs.environment.run_episode` (see
docs/adding-an-environment.md).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from tempax.envs.environment import StepResult


class GuessNumberEnvironment:
    def __init__(self, wrong_guess_penalty: float = 0.1) -> None:
        self.wrong_guess_penalty = wrong_guess_penalty
        self.secret = 0

    def reset(self, task_row: Mapping[str, Any]) -> list[dict[str, str]]:
        self.secret = int(task_row["secret"])
        low, high = int(task_row.get("low", 1)), int(task_row.get("high", 100))
        return [{"role": "user", "content": f"I am thinking of a whole number from {low} to {high}. "
                                            "Guess it: reply with one number."}]

    def step(self, assistant_message: str) -> StepResult:
        numbers = re.findall(r"-?\d+", assistant_message)
        if not numbers:
            return StepResult(messages=({"role": "user", "content": "Reply with a number."},),
                              rewards={"turn": -self.wrong_guess_penalty})
        guess = int(numbers[-1])
        if guess == self.secret:
            return StepResult(rewards={"found": 1.0}, done=True)
        hint = "higher" if guess < self.secret else "lower"
        return StepResult(messages=({"role": "user", "content": f"No, {hint}."},),
                          rewards={"turn": -self.wrong_guess_penalty})
