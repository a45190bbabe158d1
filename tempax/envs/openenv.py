"""OpenEnv environments (`openenv-core`, the `openenv` extra) played as tempax environments, locally and
in-process (no server, no container): the policy's reply becomes the environment's action, each observation a
message, and the observation's reward the `openenv` reward part. A recipe names the function or class that builds
one, `env: {name: "openenv:FILE.py:make_env"}`, called with `env.options` once per episode. How text maps onto
actions and observations: `OpenEnvEnvironment` and docs/adding-an-environment.md.
"""

from __future__ import annotations

import inspect
import json
import typing
from typing import Any, Callable, Mapping

from tempax.envs.environment import Message, StepResult
from tempax.errors import ConfigError

REWARD_PART = "openenv"
ADAPTER_OPTIONS = ("action_field", "observation_field")
_BASE_OBSERVATION_FIELDS = {"done", "reward", "metadata"}


def _action_class(env: Any) -> type:
    """The pydantic action class of an OpenEnv environment: the type hint of `step`'s action, else the first
    argument of its generic base (`Environment[MyAction, MyObservation, MyState]`)."""
    try:
        hinted = typing.get_type_hints(type(env).step).get("action")
    except Exception:  # hints naming what the module does not define: look at the generic base instead
        hinted = None
    if isinstance(hinted, type) and hasattr(hinted, "model_fields"):
        return hinted
    for base in getattr(type(env), "__orig_bases__", ()):
        args = typing.get_args(base)
        if args and isinstance(args[0], type) and hasattr(args[0], "model_fields"):
            return args[0]
    raise ConfigError(f"{type(env).__name__}: cannot tell its action class; annotate step(self, action: MyAction) "
                      "or subclass Environment[MyAction, MyObservation, MyState]")


def _text_field(model: type, chosen: str | None, what: str, key: str, exclude: set[str]) -> str | None:
    """The string field of a pydantic class that carries text: `chosen`, else its only `str` field."""
    fields = {n: f for n, f in model.model_fields.items() if n not in exclude}
    if chosen is not None:
        if chosen not in fields:
            raise ConfigError(f"env.options.{key}={chosen!r}: {model.__name__} has no such field; it has "
                              f"{sorted(fields)}")
        return chosen
    strings = [n for n, f in fields.items() if f.annotation is str]
    if len(strings) == 1:
        return strings[0]
    if what == "action":
        raise ConfigError(f"{model.__name__} has {len(strings)} string fields {strings}; name the one the reply "
                          f"goes into with env.options.{key}")
    return None


class OpenEnvEnvironment:
    """One OpenEnv environment object as a tempax environment.

    An OpenEnv environment is a Gym-style object whose `reset(seed=None, episode_id=None, **kwargs)` and
    `step(action)` return an `Observation` (a pydantic model with `done`, `reward` and its own fields); its
    rubric, if any, is applied inside `step` and comes back as `observation.reward`. The adapter:

      * the policy's reply becomes the one string field of the action class (besides `metadata`), or the field
        `env.options.action_field` names when there are several (the others need defaults); a reply the action
        class refuses is answered with an `error: ...` message and no reward, never raised;
      * an observation becomes a `user` message: its one string field (besides `done`, `reward`, `metadata`), the
        field `env.options.observation_field` names, or else its own fields as JSON;
      * the reset observation is the first message, after `system_prompt` when the task row has one; the task
        row's other keys go to `reset` as keyword arguments (`seed` among them, so the G episodes of a prompt
        start alike);
      * each step's `observation.reward` is the `openenv` reward part; `observation.done` ends the episode, and
        the environment is closed then."""

    def __init__(self, env: Any, *, action_field: str | None = None, observation_field: str | None = None) -> None:
        if not (callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None))):
            raise ConfigError(f"{type(env).__name__} is not an OpenEnv environment (it needs reset and step)")
        self.env = env
        self.action_class = _action_class(env)
        self.action_field = _text_field(self.action_class, action_field, "action", "action_field", {"metadata"})
        required = [n for n, f in self.action_class.model_fields.items() if f.is_required() and n != self.action_field]
        if required:
            raise ConfigError(f"{self.action_class.__name__} also requires {required}, which a reply cannot fill; "
                              "give them defaults or wrap the environment so that one text field makes an action")
        self.observation_field = observation_field
        self.steps = 0

    def _text(self, observation: Any) -> str:
        field = _text_field(type(observation), self.observation_field, "observation", "observation_field",
                            _BASE_OBSERVATION_FIELDS)
        if field is not None:
            return str(getattr(observation, field))
        data = {k: v for k, v in observation.model_dump().items() if k not in _BASE_OBSERVATION_FIELDS}
        return json.dumps(data, default=str)

    def reset(self, task_row: Mapping[str, Any]) -> list[Message]:
        row = dict(task_row)
        system = row.pop("system_prompt", None)
        accepted = inspect.signature(self.env.reset).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
            unknown = sorted(set(row) - set(accepted))
            if unknown:
                raise ConfigError(f"{type(self.env).__name__}.reset takes no {unknown}; drop those keys from the "
                                  "task rows (they go to reset as keyword arguments)")
        self.steps = 0
        observation = self.env.reset(**row)
        first = [{"role": "user", "content": self._text(observation)}]
        return ([{"role": "system", "content": str(system)}] if system else []) + first

    def step(self, assistant_message: str) -> StepResult:
        self.steps += 1
        try:
            action = self.action_class(**{self.action_field: assistant_message})
        except ValueError as e:  # pydantic's ValidationError: the reply breaks the action's own constraints
            return StepResult(messages=({"role": "user", "content": f"error: not a valid action: {e}"[:500]},),
                              rewards={REWARD_PART: 0.0})
        observation = self.env.step(action)
        rewards = {REWARD_PART: float(observation.reward or 0.0)}
        if observation.done:
            self.env.close()
            return StepResult(rewards=rewards, done=True)
        return StepResult(messages=({"role": "user", "content": self._text(observation)},), rewards=rewards)

    def metrics(self) -> dict[str, float]:
        return {"openenv_steps": float(self.steps)}


def openenv_factory(make_env: Callable[..., Any], name: str, options: Mapping[str, Any]) -> Callable[[], Any]:
    """A fresh `OpenEnvEnvironment` per episode from `make_env(**options)` (the adapter's own options apart);
    one is built and closed now, so a factory that does not fit its options is refused before training."""
    if not callable(make_env):
        raise ConfigError(f"env.name=openenv:{name}: a {type(make_env).__name__} is not a function or class that "
                          "builds an OpenEnv environment")
    adapter = {k: options[k] for k in ADAPTER_OPTIONS if k in options}
    kwargs = {k: v for k, v in options.items() if k not in ADAPTER_OPTIONS}

    def make() -> OpenEnvEnvironment:
        try:
            env = make_env(**kwargs)
        except TypeError as e:
            raise ConfigError(f"env.options do not fit {name}: {e}") from None
        return OpenEnvEnvironment(env, **adapter)

    make().env.close()
    return make
