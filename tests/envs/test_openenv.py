"""OpenEnv environments (openenv-core) as tempax environments: the example environment of examples/ played by
scripted replies, the refusals that name the fix, and 2 GRPO steps on it through its recipe with a tiny model."""

from __future__ import annotations

import os
from typing import Optional

import numpy as np
import pytest
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from tempax.envs.environment import EpisodeLimits, run_episode
from tempax.envs.openenv import OpenEnvEnvironment
from tempax.envs.registry import EnvironmentConfig
from tempax.errors import ConfigError
from tests.algorithms.grpo.test_episodes import two_tiny_steps
from tests.algorithms.grpo.test_objective import model, tok  # noqa: F401 - the shared tiny fixtures

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "recipes", "grpo_openenv_reverse.yaml")
REVERSE = EnvironmentConfig(name="openenv:examples/openenv_reverse_env.py:make_env", max_turns=2)


def test_an_openenv_episode_gives_its_observations_as_messages_and_its_rubric_as_reward(tok, monkeypatch):
    """seed 0 is 'table'. Reply 1 'elbat x': the rubric finds all 5 letters of 'elbat' in place but not the exact
    reversal, 5 / (2 * 5) = 0.5, and the hint comes back as a user message; reply 2 'elbat' is exact, 1.0, done.
    The episode's openenv part is 0.5 + 1.0 = 1.5 over 2 steps."""
    monkeypatch.chdir(ROOT)
    env = REVERSE.build(tok)()
    replies = iter(["elbat x", "elbat"])
    episode = run_episode(env, {"seed": 0}, lambda messages: next(replies), tokenizer=tok,
                          limits=EpisodeLimits(max_turns=3))
    assert episode.messages[0] == {"role": "user", "content": "Spell the word 'table' backwards. Reply with the "
                                                              "reversed word only."}
    assert episode.messages[2] == {"role": "user", "content": "Not quite: 'table' backwards starts with 'e'. "
                                                              "Try again."}
    assert episode.turn_rewards == [{"openenv": 0.5}, {"openenv": 1.0}] and episode.rewards == {"openenv": 1.5}
    assert episode.truncated is None and episode.metrics["openenv_steps"] == 2.0


class TwoTextAction(Action):
    message: str = ""
    note: str = ""


class CodedAction(Action):
    message: str
    code: int


class CountObservation(Observation):
    count: int = 0
    label: str = "x"
    hint: str = ""


class TwoFieldEnvironment(Environment[TwoTextAction, CountObservation, State]):
    """Replies go to `note` when the recipe says so; each step counts up and is done after 2."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None) -> CountObservation:
        self.n = 0
        return CountObservation(count=0)

    def step(self, action: TwoTextAction, timeout_s=None, **kwargs) -> CountObservation:
        self.n += 1
        return CountObservation(count=self.n, label=action.note, done=self.n >= 2, reward=float(len(action.note)))

    @property
    def state(self) -> State:
        return State(step_count=self.n)


def test_the_action_and_observation_fields_can_be_named_and_several_are_refused_until_they_are():
    """Two string action fields: refused, naming env.options.action_field. Named, the reply goes to `note` (its
    length, 3, is the reward); an observation with two string fields and no choice comes back as JSON."""
    with pytest.raises(ConfigError, match=r"2 string fields \['message', 'note'\]; .*env.options.action_field"):
        OpenEnvEnvironment(TwoFieldEnvironment())
    env = OpenEnvEnvironment(TwoFieldEnvironment(), action_field="note")
    assert env.reset({"seed": 1}) == [{"role": "user", "content": '{"count": 0, "label": "x", "hint": ""}'}]
    result = env.step("abc")
    assert result.rewards == {"openenv": 3.0} and not result.done
    assert result.messages[0]["content"] == '{"count": 1, "label": "abc", "hint": ""}'
    with pytest.raises(ConfigError, match="reset takes no \\['colour'\\]"):
        env.reset({"colour": "red"})
    with pytest.raises(ConfigError, match="has no such field"):
        OpenEnvEnvironment(TwoFieldEnvironment(), action_field="nope")


class CodedEnvironment(TwoFieldEnvironment):
    def step(self, action: CodedAction, timeout_s=None, **kwargs) -> CountObservation:
        return CountObservation(done=True)


class ShortAction(Action):
    message: str = Field(max_length=3)


class ShortEnvironment(TwoFieldEnvironment):
    def step(self, action: ShortAction, timeout_s=None, **kwargs) -> CountObservation:
        return CountObservation(done=True, reward=1.0)


def test_an_action_a_reply_cannot_make_is_refused_and_a_reply_it_rejects_is_answered():
    """An action that also needs an int `code` cannot come from text: refused when built. A reply over the
    action's max_length of 3 is answered with an error message and no reward; a short one is played (reward 1)."""
    with pytest.raises(ConfigError, match=r"CodedAction also requires \['code'\]"):
        OpenEnvEnvironment(CodedEnvironment())
    env = OpenEnvEnvironment(ShortEnvironment())
    env.reset({})
    long = env.step("much too long")
    assert not long.done and long.rewards == {"openenv": 0.0}
    assert long.messages[0]["content"].startswith("error: not a valid action:")
    assert env.step("ok").rewards == {"openenv": 1.0}


@pytest.mark.parametrize("spec, message", [
    (EnvironmentConfig(name="openenv:make_env"), "name the function that builds the OpenEnv environment"),
    (EnvironmentConfig(name="openenv:examples/openenv_reverse_env.py:make_env", options={"colour": "red"}),
     "env.options do not fit"),
    (EnvironmentConfig(name="openenv:examples/openenv_reverse_env.py:WORDS"), "a tuple is not a function or class"),
    (EnvironmentConfig(name="openenv:examples/price_tools.py:write_tasks", options={"path": os.devnull}),
     "NoneType is not an OpenEnv environment"),
])
def test_bad_openenv_names_are_refused_with_the_fix(spec, message, tok, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError, match=message):
        spec.build(tok)


@pytest.mark.heavy
def test_the_openenv_recipe_trains_two_grpo_steps(model, tok, tmp_path, monkeypatch):  # noqa: F811
    """recipes/grpo_openenv_reverse.yaml with the tiny model: 2 GRPO steps over episodes of the OpenEnv
    environment; the only reward is the environment's rubric (reward/openenv_mean)."""
    monkeypatch.chdir(ROOT)
    run = two_tiny_steps(RECIPE, model, tok, tmp_path)
    m = run.history[0][1]
    assert "reward/openenv_mean" in m and 1.0 <= m["episode/turns_mean"] <= 2.0
    assert "episode/openenv_steps_mean" in m
    assert np.isfinite(run.losses).all()
