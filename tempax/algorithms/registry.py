"""The training commands, one `Algorithm` record each.

Every algorithm package under `tempax/algorithms/` exports `ALGORITHMS`, a tuple of the records of the commands
it provides (most have one; `sft` also gives `pretrain`, `preference` gives `dpo`, `kto` and `reward-model`).
The records name their config class and `main` as strings, and the packages' `__init__` modules import nothing
heavy, so listing the commands (`tempax --help`) imports neither JAX nor an algorithm's modules; `resolve`
imports them when a command runs. `register` adds a record from elsewhere (a plugin or a test).

The record is the algorithm's whole contract with the rest of the project. `tempax <command>` and `tempax --help`
(the CLI, in the records' `listing` order), the recipe checks (`tempax.algorithms.validate`: the model sections,
chat rendering, the algorithm's own checks), the run dir (`start_run` writes the command into config.yaml, and
`tempax.algorithms.run_dirs` reads back where the run keeps its model, `Algorithm.model`), the model card
(`tempax.export.model_card`), the recommendations (`tempax.algorithms.recommend`), `tempax data episodes` and the
tests read it. No module outside the algorithm's folder names an algorithm to branch on or keeps a list of them
(docs/adding-an-algorithm.md; `tests/algorithms/test_registry.py` checks the source for it).
"""

from __future__ import annotations

import glob
import importlib
import os
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

from tempax.configlib import load_config, recipe_command
from tempax.errors import ConfigError

PACKAGE = "tempax.algorithms"


@dataclass(frozen=True)
class RunModel:
    """Where a run of a command keeps the model it trained: what `tempax generate RUN_DIR`, `tempax export`,
    `model.source: RUN_DIR` and the other readers of a run dir load (`tempax.train.run_model`).

    Attributes:
      kept: "checkpoint": its checkpoints hold the trained model (LoRA adapters on the model section's source when
        `lora` is set); "folder": a Hugging Face folder `folder/` it writes when it finishes; "adapters": PEFT
        adapters in `folder/`, written when a LoRA run finishes, on the model section's source (its checkpoints
        hold more than the model); "none": no model to generate with or train.
      folder: the folder under the run dir for "folder" and "adapters".
      note: a clause the one-line messages about a run without its model quote: for "folder", when the folder is
        written; for "adapters", why the checkpoints are not the model; for "none", why there is none and what to
        do instead (`{run_dir}` and `{source}`, the run's model.source, are filled in).
    """

    kept: Literal["checkpoint", "folder", "adapters", "none"] = "checkpoint"
    folder: str = ""
    note: str = ""

    def __post_init__(self) -> None:
        if self.kept in ("folder", "adapters") and not self.folder:
            raise ValueError(f"RunModel(kept={self.kept!r}) names the folder the run writes")


@dataclass(frozen=True)
class Algorithm:
    """One training command.

    Attributes:
      command: the `tempax <command>` name, also the `command:` key of its recipes.
      help: one line for `tempax --help`.
      config: "module:Class" of its frozen config dataclass (with a `train: TrainConfig` field).
      main: "module:function" of `main(config, *, hooks=(), log=None)`, which trains and returns the result.
      on_policy: it generates from the policy while training (GRPO, PPO); off-policy commands only train, and
        their processes are set up for training alone (`tempax.runtime.process.setup_process(job="train")`).
      card: the model card's section on the method: what it optimises and from which signal, with its paper, in
        a sentence or two (the card's "Training" section quotes it under the algorithm's name).
      knobs: the recipe sections that hold the algorithm's own settings (`grpo`, `dpo`, `loss`...): the model
        card lists their values as the run's hyper-parameters.
      renders_chat: its prompts are always rendered with the tokenizer's chat template, so `tempax validate`
        requires a local tokenizer folder to carry one.
      reference_curve: the name of its stored first-steps curve (`tests/reference_curves/<name>.json`), which
        pins its behaviour on a tiny model.
      validate: optional "module:function" of extra checks `tempax validate` runs on a built config
        (`fn(config) -> list[str]` of warnings; a `ConfigError` refuses the recipe).
      recommend: optional "module:object" of its `tempax.algorithms.recommend.Recommender`: for which data
        `tempax recommend` proposes the command, and with which settings (None: it never proposes it).
      models: the recipe sections that name a model (each with `source` and `tokenizer`): `tempax validate`
        resolves each, a section's `source` may name another of them (a distillation's student starts as a copy
        of the `teacher`), and the one-line summary of a run without a recipe names them.
      model: where its runs keep the trained model (`RunModel`; a run dir's config.yaml names its command).
      listing: where `tempax --help` lists it among the training commands (lower first; equal values keep the
        order the packages are found in, by name, and the order of their `ALGORITHMS`).
    """

    command: str
    help: str
    config: str
    main: str
    on_policy: bool = False
    card: str = ""
    knobs: tuple[str, ...] = ()
    renders_chat: bool = False
    reference_curve: str | None = None
    validate: str | None = None
    recommend: str | None = None
    models: tuple[str, ...] = ("model",)
    model: RunModel = RunModel()
    listing: int = 100

    def config_class(self) -> type:
        return _load(self.config, f"{self.command}'s config")

    def main_function(self) -> Callable[..., Any]:
        return _load(self.main, f"{self.command}'s main")

    def validate_function(self) -> Callable[[Any], list[str]] | None:
        return _load(self.validate, f"{self.command}'s validate") if self.validate else None

    def recommender(self) -> Any:
        """Its `Recommender` (None when the record names no `recommend` hook)."""
        return _load(self.recommend, f"{self.command}'s recommend") if self.recommend else None


def _load(ref: str, what: str) -> Any:
    module_name, _, name = ref.partition(":")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{what} {ref!r} cannot be imported ({e})") from None


_REGISTERED: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> Algorithm:
    """Adds (or replaces) a command from outside `tempax.algorithms` (a plugin or a test)."""
    _REGISTERED[algorithm.command] = algorithm
    return algorithm


def unregister(command: str) -> None:
    _REGISTERED.pop(command, None)


def _packaged() -> dict[str, Algorithm]:
    package = importlib.import_module(PACKAGE)
    found = [algorithm for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name) if info.ispkg
             for algorithm in getattr(importlib.import_module(f"{PACKAGE}.{info.name}"), "ALGORITHMS", ())]
    return {a.command: a for a in sorted(found, key=lambda a: a.listing)}  # a stable sort: ties keep their order


_PACKAGED: dict[str, Algorithm] | None = None


def algorithms() -> dict[str, Algorithm]:
    """command -> record of every training command: the packaged ones, then the registered ones."""
    global _PACKAGED
    if _PACKAGED is None:
        _PACKAGED = _packaged()
    return {**_PACKAGED, **_REGISTERED}


def get(command: str) -> Algorithm:
    known = algorithms()
    if command not in known:
        raise ConfigError(f"'{command}' is not a training command here; available: {', '.join(sorted(known))}")
    return known[command]


def command_of(config: Any) -> str:
    """The command whose record names `config`'s class (what `start_run` writes into the run dir's config.yaml).

    Raises:
      ConfigError: no record names the class (register one for a config class of your own).
    """
    cls = type(config)
    name = f"{cls.__module__}:{cls.__qualname__}"
    for command, algorithm in algorithms().items():
        if algorithm.config == name:
            return command
    raise ConfigError(f"no training command's record names the config class {name}; register an Algorithm whose "
                      f"config is {name!r} (tempax.algorithms.registry.register)")


def resolve(command: str) -> tuple[type, Callable[..., Any]]:
    """(config class, main function) of a training command."""
    algorithm = get(command)
    return algorithm.config_class(), algorithm.main_function()


def load_recipe(command: str, recipe: str | None = None, overrides: Sequence[str] = ()) -> Any:
    """The typed config of `command` from a recipe file (None: the defaults) plus `a.b=value` overrides, checked
    as the command line checks them (a recipe whose `command:` key names another command is refused)."""
    return load_config(get(command).config_class(), recipe, list(overrides), command=command)


# The clone's root, where the shipped recipes are (`recipes/`).
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def recipes_for(command: str) -> list[str]:
    """The shipped recipes whose `command:` key is `command` (paths relative to the clone, sorted): what a user
    without a recipe is pointed to, and what every packaged algorithm must have one of."""
    paths = sorted(glob.glob(os.path.join(REPOSITORY, "recipes", "**", "*.yaml"), recursive=True))
    return [os.path.relpath(p, REPOSITORY) for p in paths if recipe_command(p) == command]


def train(command: str, recipe: str | None = None, overrides: Sequence[str] = (), **main_options: Any) -> Any:
    """Runs `tempax COMMAND --config RECIPE KEY=VALUE ...` from Python and returns what its `main` returns.

    `overrides` are the command line's `a.b=value` strings, checked like the CLI's; `main_options` go to the
    algorithm's `main` (`hooks=`, `log=`, and for GRPO / RFT an already built `model=` / `tokenizer=`). A reward
    function defined in the running script is named `__main__:function` in `rewards.functions`.
    """
    return get(command).main_function()(load_recipe(command, recipe, overrides), **main_options)
