"""An environment written for OpenEnv (`openenv-core`), played by tempax through `env: {name: "openenv:..."}`.

Spell a word backwards: `reset(seed=...)` picks the word, the policy replies, and the environment's rubric scores
the reply (the share of letters in the right place, 1.0 for the exact reversal). A wrong reply gets one more try
with a hint. Nothing here imports tempax: it is a plain OpenEnv `Environment` with its own `Action`,
`Observation` and `State` classes and a `Rubric`, run in-process (docs/adding-an-environment.md, OpenEnv).
"""

from __future__ import annotations

from typing import Any, Optional

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.rubrics import Rubric

WORDS = ("table", "river", "cloud", "pencil", "garden", "window", "orange", "silver")


class ReplyAction(Action):
    message: str


class WordObservation(Observation):
    prompt: str


class LettersInPlace(Rubric):
    """The share of the target's letters that the reply has in the same place (1.0: the exact reversal)."""

    def __init__(self) -> None:
        super().__init__()
        self.target = ""

    def forward(self, action: ReplyAction, observation: WordObservation) -> float:
        reply = action.message.strip().lower()
        if reply == self.target:
            return 1.0
        return sum(a == b for a, b in zip(reply, self.target)) / (2 * len(self.target))


class ReverseWordEnvironment(Environment[ReplyAction, WordObservation, State]):
    def __init__(self, tries: int = 2) -> None:
        super().__init__(rubric=LettersInPlace())
        self.tries = tries
        self._state = State()
        self.word = ""

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> WordObservation:
        self.word = WORDS[(seed or 0) % len(WORDS)]
        self.rubric.target = self.word[::-1]
        self._state = State(episode_id=episode_id, step_count=0)
        return WordObservation(prompt=f"Spell the word '{self.word}' backwards. Reply with the reversed word only.")

    def step(self, action: ReplyAction, timeout_s: Optional[float] = None, **kwargs: Any) -> WordObservation:
        self._state.step_count += 1
        observation = WordObservation(prompt="")
        observation.reward = self._apply_rubric(action, observation)
        observation.done = observation.reward == 1.0 or self._state.step_count >= self.tries
        if not observation.done:
            observation.prompt = f"Not quite: '{self.word}' backwards starts with '{self.word[-1]}'. Try again."
        return observation

    @property
    def state(self) -> State:
        return self._state


def make_env(tries: int = 2) -> ReverseWordEnvironment:
    return ReverseWordEnvironment(tries=tries)
