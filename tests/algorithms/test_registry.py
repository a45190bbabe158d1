"""The algorithm registry: every packaged record resolves and keeps the contract it states, listing the commands
imports no JAX, and a toy algorithm is registered from this test module (tests/cli/test_train_cmds.py sees it in
`tempax --help`, has `tempax validate` accept its recipe and trains it two steps through `tempax toy --config
RECIPE`).

The toy is what docs/adding-an-algorithm.md walks through, in one file: a config, a loss (mean next-token
negative log-likelihood over the supervised tokens), a `main` that calls the shared steps in order, and a record.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import pytest

from tempax.algorithms import registry
from tempax.algorithms.common import ModelSourceConfig, build_model
from tempax.algorithms.registry import Algorithm
from tempax.algorithms.run import RunResult, make_trainer, start_run, write_run_files
from tempax.configlib import help_field
from tempax.data.sft import SFTDataConfig, build_data, read_data_rows
from tempax.models.logprobs import masked_mean, token_logprobs
from tempax.models.lora import LoraConfig
from tempax.train.config import TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class ToyConfig:
    """A toy algorithm: maximum likelihood on chat rows, written from the shared pieces."""

    model: ModelSourceConfig = help_field("The model to train.", default_factory=ModelSourceConfig)
    lora: LoraConfig | None = help_field("LoRA adapters; null: full fine-tuning.", None)
    data: SFTDataConfig = help_field("The data.", default_factory=SFTDataConfig)
    train: TrainConfig = help_field("The training loop.", default_factory=TrainConfig)


def toy_loss(model: Any, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """L = -sum_t m_t log p(y_t) / sum_t m_t over the batch's supervised tokens (`loss_mask`)."""
    logits, _ = model(batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"])
    mask = batch["loss_mask"]
    loss = -masked_mean(token_logprobs(logits, batch["targets"]), mask)
    return loss, {"loss_weight": jnp.sum(mask.astype(jnp.float32))}


def main(cfg: ToyConfig, *, hooks: tuple = (), log: Callable[[str], None] | None = None) -> RunResult:
    run = start_run(cfg, log=log)
    rows = read_data_rows(cfg.data)
    model, tokenizer, trainable = build_model(cfg, run.mesh)
    t = cfg.train
    data = build_data(cfg.data, tokenizer, batch_size=t.batch_size, seq_len=t.seq_len, seed=t.seed, rows=rows)
    write_run_files(run, data, tokenizer)
    trainer = make_trainer(cfg, model, toy_loss, algorithm="toy", trainable=trainable, mesh=run.mesh, log=run.say)
    del model  # the trainer holds the weights now
    return run.train(trainer, data.train, hooks=hooks)


TOY = Algorithm("toy", "a toy algorithm registered by a test", config=f"{__name__}:ToyConfig", main=f"{__name__}:main")


@pytest.fixture
def toy():
    registry.register(TOY)
    yield TOY
    registry.unregister(TOY.command)


def test_every_packaged_record_resolves_to_a_config_and_a_main():
    """Each record's config class and main import; the record is the one its config class leads back to
    (`command_of`, what `start_run` writes into config.yaml); and every main returns the one result type,
    `RunResult` (the CLI's last line and exit status read it)."""
    import typing

    from tempax.algorithms.run import RunResult

    for command, algorithm in registry.algorithms().items():
        cls, main_fn = registry.resolve(command)
        assert dataclasses.is_dataclass(cls) and "train" in {f.name for f in dataclasses.fields(cls)}, command
        assert callable(main_fn) and algorithm.help, command
        assert registry.command_of(cls()) == command
        assert typing.get_type_hints(main_fn)["return"] is RunResult, command


def test_a_config_class_no_record_names_is_refused_with_the_way_to_register_it():
    from tempax.errors import ConfigError

    with pytest.raises(ConfigError, match=r"no training command's record names the config class "
                                          rf"{__name__}:ToyConfig; register an Algorithm"):
        registry.command_of(ToyConfig())


def test_the_listing_follows_the_records_listing_values(toy):
    """`tempax --help` lists the training commands by their records' `listing` (stable: a package's records in
    their order), and a registered command after the packaged ones."""
    records = list(registry.algorithms().values())
    packaged = [a for a in records if a is not toy]
    assert [a.listing for a in packaged] == sorted(a.listing for a in packaged)
    assert records[-1] is toy


def test_an_unknown_command_names_the_known_ones():
    from tempax.errors import ConfigError

    with pytest.raises(ConfigError, match="'sfft' is not a training command here; available: .*sft"):
        registry.resolve("sfft")


def test_listing_the_commands_imports_neither_jax_nor_an_algorithm():
    code = ("import sys; from tempax.algorithms import registry; print(sorted(registry.algorithms())); "
            "print(sorted(m for m in sys.modules if m == 'jax' or m.endswith(('.trainer', '.losses', '.config'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT}).stdout.splitlines()
    assert "'sft'" in out[0] and "'grpo'" in out[0]
    assert out[1] == "[]", out[1]


def packaged_records() -> list[Algorithm]:
    """Every record of every package under tempax/algorithms, read from the packages themselves (not through the
    registry, so a package the registry failed to find would still be checked)."""
    import importlib
    import pkgutil

    import tempax.algorithms as package

    return [record for info in pkgutil.iter_modules(package.__path__) if info.ispkg
            for record in getattr(importlib.import_module(f"tempax.algorithms.{info.name}"), "ALGORITHMS", ())]


def test_every_packaged_algorithm_keeps_the_contract_its_record_states():
    """The record is the one place an algorithm states what the rest of the project reads: each packaged
    command has a shipped recipe, a stored reference curve that the curve test runs, a model-card section (the
    method in words, and knobs sections that its config has, whose values the card lists), model sections its
    config has (each a model source with its tokenizer), a run-model layout its config can produce (adapters only
    from a config with `lora`), and a `recommend` hook, where it has one, for its own command. Nothing outside the
    algorithm's folder names algorithms (the test below), so this is all docs/adding-an-algorithm.md asks."""
    from tempax.algorithms.recommend import Recommender
    from tests import reference_curves as rc

    records = packaged_records()
    assert {a.command for a in records} == set(registry.algorithms())
    for algorithm in records:
        command = algorithm.command
        assert registry.recipes_for(command), f"{command}: no recipe in recipes/ names `command: {command}`"
        assert algorithm.reference_curve in rc.NAMES, f"{command}: no reference curve run ({algorithm.reference_curve})"
        assert os.path.exists(rc.path_of(algorithm.reference_curve)), f"{command}: curve not stored"
        assert len(algorithm.card.split()) >= 8 and algorithm.card.endswith("."), f"{command}: no model-card section"
        assert algorithm.knobs, f"{command}: its record names no knobs section"
        cls = algorithm.config_class()
        fields = {f.name for f in dataclasses.fields(cls)}
        assert set(algorithm.knobs) <= fields, f"{command}: knobs {algorithm.knobs} not all in its config {fields}"
        blocks = recipe_blocks(cls)
        for section in algorithm.models:
            assert {"source", "tokenizer"} <= {f.name for f in dataclasses.fields(blocks[section])}, (command, section)
        assert algorithm.model.kept != "adapters" or "lora" in fields, f"{command}: adapters without a lora section"
        assert algorithm.model.kept == "checkpoint" or algorithm.model.note, f"{command}: its layout says no why"
        hook = algorithm.recommender()
        assert hook is None or (isinstance(hook, Recommender) and hook.command == command), command
        check = algorithm.validate_function()
        assert check is None or callable(check), command
    assert {a.reference_curve for a in records} == set(rc.NAMES)


# Names that meant "completions sampled per prompt" before `group_size` became the one name, and the names other
# libraries give it (the OpenAI API's and vLLM's `n` stays on `tempax generate` and the server, outside recipes).
OTHER_NAMES_OF_GROUP_SIZE = {"samples_per_prompt", "samples_per_problem", "num_samples", "n", "num_generations",
                             "num_return_sequences", "num_completions"}


def recipe_blocks(cls: type, path: str = "") -> dict[str, type]:
    """Dotted key -> class of every block of the recipe `cls` describes: the dataclasses its fields reach."""
    from tempax.configlib.fields import dataclass_arm, field_types

    blocks = {}
    for f in dataclasses.fields(cls):
        sub = dataclass_arm(field_types(cls)[f.name])
        if sub is not None:
            key = f"{path}{f.name}"
            blocks[key] = sub
            blocks.update(recipe_blocks(sub, key + "."))
    return blocks


def test_every_packaged_algorithm_follows_the_config_scheme():
    """docs/CONTRIBUTING.md's rule for config classes and the one recipe schema, for every packaged command: each
    block of its recipe is a `...Config` (one class per name across the commands), its own section (named after
    the command) is `<Command>KnobsConfig` beside `<Command>Config`; the sections are `model` (or a distillation's
    `teacher` and `student`), `lora`, `data` or `task`, its knobs, `train`, and an `eval` whose `before` evaluates
    the starting model; `group_size` is the one recipe key for completions per prompt; the renamed keys a block
    declares lead to keys it has; and no shipped recipe uses an old name."""
    from tempax.configlib import read_recipe, renamed_keys, upgrade_keys
    from tempax.configlib.fields import all_keys

    by_name: dict[str, type] = {}
    for algorithm in packaged_records():
        command, top = algorithm.command, algorithm.config_class()
        blocks = recipe_blocks(top)
        assert top.__name__.endswith("Config"), command
        assert not [f"{k}: {c.__name__}" for k, c in blocks.items() if not c.__name__.endswith("Config")], command
        for cls in (top, *blocks.values()):
            assert by_name.setdefault(cls.__name__, cls) is cls, f"two config classes named {cls.__name__}"
        own = [s for s in algorithm.knobs if s in blocks and command.startswith(s)]
        knobs_class = top.__name__.removesuffix("Config") + "KnobsConfig"
        for section in own:
            assert blocks[section].__name__ == knobs_class, (command, section)
        assert own or knobs_class not in {c.__name__ for c in blocks.values()}, f"{command}: {knobs_class} unnamed"

        sections = {f.name for f in dataclasses.fields(top)}
        assert "train" in sections and set(algorithm.knobs) <= sections, command
        assert set(algorithm.models) <= sections, command
        assert ("data" in sections) != ("task" in sections), f"{command}: one of data or task, got {sections}"
        assert "eval" not in blocks or "before" in {f.name for f in dataclasses.fields(blocks["eval"])}, command

        keys = all_keys(top)
        assert not [k for k in keys if k.rsplit(".", 1)[-1] in OTHER_NAMES_OF_GROUP_SIZE], command
        for prefix, cls in [("", top), *((k + ".", c) for k, c in blocks.items())]:
            for old, new in renamed_keys(cls).items():
                assert prefix + new in keys and prefix + old not in keys, f"{command}: {cls.__name__} {old} -> {new}"
        for recipe in registry.recipes_for(command):
            data = {k: v for k, v in read_recipe(os.path.join(ROOT, recipe)).items() if k != "command"}
            assert upgrade_keys(top, data)[1] == [], f"{recipe} uses an old key name"


# -- no module outside an algorithm's folder names an algorithm ----------------------------------------------

# Where naming an algorithm is the module's job, with the reason. A path ending in "/" is a folder.
NAMING_ALLOWED: dict[tuple[str, str], str] = {
    ("tempax/experiments/", "*"): "the demos are pipelines of named algorithms (SFT, then GRPO or RFT): they "
                                  "import those algorithms' mains and label their stages and clocks with them",
    ("tempax/rl/advantages.py", "grpo"): "the group-normalised advantage estimator GRPO's paper introduced, an "
                                         "option value (`grpo.advantage: grpo`) beside dr_grpo and rloo",
}


def algorithm_names() -> tuple[set[str], set[str]]:
    """(the registered commands, the config sections that name one algorithm: a command's own section, named
    after it, and the model sections other than `model`, a distillation's `teacher` and `student`)."""
    records = registry.algorithms()
    own = {s for command, a in records.items() for s in a.knobs if command.startswith(s)}
    models = {s for a in records.values() for s in a.models if s != "model"}
    return set(records), own | models


def _strings(node: Any) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def names_in(source: str, commands: set[str], sections: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every place the source branches on an algorithm or keeps a table or list of them: a
    command or a section of one in a comparison (`==`, `in`), a subscript or a `get` / `getattr` / `hasattr` /
    `pop`; a command as a dict key (a table keyed by algorithm); two or more commands in one tuple, list or set
    (a list of algorithms). Prose (docstrings, messages) and a value passed on are not branching."""
    names = commands | sections
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        values: list[str] = []
        if isinstance(node, ast.Compare):
            values = [v for side in (node.left, *node.comparators) for v in _strings(side) if v in names]
        elif isinstance(node, ast.Subscript):
            values = [v for v in _strings(node.slice) if v in names]
        elif isinstance(node, ast.Dict):
            values = [k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in commands]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("get", "getattr", "hasattr", "pop"):
                values = [v for arg in node.args[:2] for v in _strings(arg) if v in names]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            listed = [v for v in _strings(node) if v in commands]
            values += listed if len(listed) > 1 else []
        found += [(node.lineno, v) for v in values]
    return found


def test_the_name_check_finds_branches_tables_and_lists_of_algorithms():
    """What the check below looks for, in a source written to have each kind once, and nothing in prose."""
    source = '''"""Mentions sft and grpo in prose, and a message naming `tempax grpo` is no branch."""
COMMAND_OF_SECTION = {"grpo": "grpo", "student": "distill"}
ORDER = ("sft", "ppo")
def f(raw, name):
    say(f"tempax grpo {name}")
    if "student" in raw or name == "ppo":
        return raw["grpo"], raw.get("teacher"), getattr(raw, "rft", None)
'''
    commands, sections = {"sft", "grpo", "ppo", "rft", "distill"}, {"student", "teacher", "grpo"}
    assert sorted(names_in(source, commands, sections)) == [
        (2, "grpo"), (3, "ppo"), (3, "sft"), (6, "ppo"), (6, "student"), (7, "grpo"), (7, "rft"), (7, "teacher")]


def test_no_module_outside_an_algorithms_folder_names_an_algorithm():
    """docs/adding-an-algorithm.md: adding an algorithm is one folder; nothing else in `tempax/` branches on an
    algorithm or keeps a list of them (the registry finds the packages; the CLI, the run dirs, the recipe checks
    and the model card read the records). `NAMING_ALLOWED` says where naming one is the module's job."""
    commands, sections = algorithm_names()
    wrong = []
    for folder, _, files in os.walk(os.path.join(ROOT, "tempax")):
        rel_folder = os.path.relpath(folder, ROOT).replace(os.sep, "/")
        parts = rel_folder.split("/")
        if len(parts) >= 3 and parts[1] == "algorithms":
            continue  # inside an algorithm's own folder
        for name in sorted(f for f in files if f.endswith(".py")):
            path = f"{rel_folder}/{name}"
            with open(os.path.join(ROOT, path)) as f:
                source = f.read()
            for line, found in names_in(source, commands, sections):
                allowed = [reason for (where, what), reason in NAMING_ALLOWED.items()
                           if (path == where or (where.endswith("/") and path.startswith(where)))
                           and what in ("*", found)]
                if not allowed:
                    wrong.append(f"{path}:{line} names {found!r}")
    assert not wrong, ("modules outside tempax/algorithms/<name>/ that branch on an algorithm or list them (ask "
                       "the record instead: tempax.algorithms.registry.Algorithm):\n" + "\n".join(wrong))
