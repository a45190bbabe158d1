"""Checks a recipe as a run would before its first step, training nothing (`tempax validate RECIPE` prints the
result).

The training command is read from the recipe's `command:` key (`tempax.configlib.recipe_command`), or given.
Checks: the YAML parses; every key exists and has the right type (unknown keys name their nearest neighbours);
cross-field rules; the optimizer builds; the run dir is a folder (or can be one); the dataset path exists and its
first rows parse; the reward functions resolve (built-in names, `model:RUN_DIR` folders, importable
`module:function`s); the task's data is there; each model section the record names (`Algorithm.models`) resolves
and a local tokenizer folder has its files and, where the run renders chats (the record's `renders_chat`), a chat
template; then the algorithm's own checks (its record's `validate`: SFT's, that its rows are in a format it trains
on and chat rows meet a chat template). Everything a run would refuse, found without downloading or loading a
model.
"""

from __future__ import annotations

import os
from typing import Any

from tempax.algorithms.registry import algorithms, get, load_recipe
from tempax.configlib import COMMAND_KEY, read_recipe, recipe_command
from tempax.errors import ConfigError, TempaxError
from tempax.data.sources import DATA_PATH_REQUIRED, iter_rows
from tempax.data.tasks.gsm8k import load_gsm8k
from tempax.models.registry import inspect_model, is_run_dir, resolve_source

# The training layer (JAX) is imported only to check a run dir named as a model: `tempax validate` stays light.


def check_recipe(path: str, overrides: list[str] | None = None, command: str | None = None) -> tuple[str, Any, list[str]]:
    """(command, config, warnings). Raises `TempaxError` for problems that stop a run."""
    read_recipe(path)  # missing (with the nearest names) or not valid YAML (its line): as `tempax sft --config` says
    command = command or recipe_command(path)
    if command is None:
        raise ConfigError(
            f"{path}: cannot tell which command runs this recipe; name it in a top-level key like "
            f"'{COMMAND_KEY}: sft' or pass --command ({', '.join(sorted(algorithms()))})"
        )
    cfg = load_recipe(command, path, list(overrides or []))
    algorithm = get(command)
    warnings: list[str] = []
    train = getattr(cfg, "train", None)
    if train is not None:
        train.optimizer.build(train.steps)
        warnings += train.warnings()
    data = getattr(cfg, "data", None)
    data_path = getattr(data, "path", None)
    if data is not None and hasattr(data, "path") and data_path is None:
        raise ConfigError(DATA_PATH_REQUIRED)
    if isinstance(data_path, str) and not os.path.exists(os.path.expanduser(data_path)):
        looks_local = data_path.startswith((".", "/", "~")) or data_path.count("/") > 1 or data_path.endswith(
            (".jsonl", ".json", ".parquet", ".gz"))
        if looks_local:
            raise ConfigError(f"data.path: dataset file not found: {data_path} (relative to {os.getcwd()})")
        warnings.append(f"data.path {data_path!r} is not local; it will be read from the Hugging Face Hub")
    check_run_dir(cfg)
    first_rows(cfg)
    check_rewards(cfg)
    check_task(cfg)
    for section in algorithm.models:
        model = getattr(cfg, section, None)
        for key in ("source", "tokenizer"):
            source = getattr(model, key, None)
            if not isinstance(source, str) or source in algorithm.models:  # a copy of another section's model
                continue
            if key == "source" and is_run_dir(os.path.expanduser(source)):
                from tempax.algorithms.run_dirs import shape_source  # the training layer, for run dirs only

                try:  # a training run as the model: its chain of runs is sound (config files only)
                    shape_source(os.path.expanduser(source))
                except TempaxError as e:
                    raise ConfigError(f"{section}.{key}: {e}") from None
                continue
            try:
                resolved = resolve_source(source)
            except TempaxError as e:
                raise ConfigError(f"{section}.{key}: {e}") from None
            if key == "source" and resolved.kind in ("hf_folder", "gguf"):
                try:  # its config.json or GGUF header, read as `tempax model-info` reads it (no weights)
                    inspect_model(source)
                except TempaxError as e:
                    raise ConfigError(f"{section}.{key}: {e}") from None
            if resolved.kind == "hub":
                warnings.append(f"{section}.{key} {source!r} is a Hub repo; it needs network on first use")
        found = tokenizer_folder(section, model, others=algorithm.models)
        if found is not None:
            check_tokenizer_folder(*found, chat=algorithm.renders_chat)
    extra_checks = algorithm.validate_function()
    if extra_checks is not None:
        warnings += extra_checks(cfg)
    return command, cfg, warnings


_FIRST_ROWS = 5  # how many rows of a dataset `check_data_rows` reads


def check_run_dir(cfg: Any) -> None:
    """train.run_dir must be a folder or not exist yet (a run refuses a file there)."""
    run_dir = getattr(getattr(cfg, "train", None), "run_dir", None)
    if isinstance(run_dir, str) and os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise ConfigError(f"train.run_dir={run_dir} is an existing file, not a folder; set train.run_dir to a "
                          "folder (a new one starts a new run)")


def first_rows(cfg: Any) -> list[Any]:
    """The first rows of a local `data.path` that parse, read as the run reads them (none: no local file); raises
    `ConfigError` when none of them parses. An algorithm's own checks (its record's `validate`) ask it again for
    the format its rows must have."""
    data = getattr(cfg, "data", None)
    path = getattr(data, "path", None)
    if not isinstance(path, str) or not os.path.exists(os.path.expanduser(path)):
        return []
    rows = []
    try:
        for row in iter_rows(path, split=getattr(data, "split", None)):
            rows.append(row)
            if len(rows) >= _FIRST_ROWS:
                break
    except TempaxError as e:
        raise ConfigError(f"data.path: {e}") from None
    if not rows:
        raise ConfigError(f"data.path: {path} holds no rows")
    good = [r for r in rows if r.data is not None]
    if not good:
        raise ConfigError(f"data.path: none of the first {len(rows)} rows of {path} parses; first: {rows[0].where}: "
                          f"{rows[0].error}")
    return good


def tokenizer_folder(section: str, model: Any, *, others: tuple[str, ...] = ()) -> tuple[str, str] | None:
    """(key, local folder) of the tokenizer a model section reads (its `tokenizer`, else its `source`) when that
    is a local folder of model files; None for a preset, a Hub repo, a run dir, or a copy of another model
    section (`others`)."""
    tokenizer = getattr(model, "tokenizer", None)
    key, where = ("tokenizer", tokenizer) if isinstance(tokenizer, str) else ("source", getattr(model, "source", None))
    if not isinstance(where, str) or where in others:
        return None
    path = os.path.expanduser(where)
    if not os.path.isdir(path) or (key == "source" and is_run_dir(path)):
        return None
    try:
        if resolve_source(where).kind == "preset":
            return None
    except TempaxError:
        return None  # the model checks name the source that does not resolve
    return f"{section}.{key}", path


def check_rewards(cfg: Any) -> None:
    """Each name in rewards.functions resolves as the run would resolve it (a built-in, a `model:RUN_DIR` folder,
    an importable `module:function`); nothing is built or loaded."""
    rewards = getattr(cfg, "rewards", None)
    functions = getattr(rewards, "functions", None)
    if not functions:
        return
    import difflib
    import importlib

    from tempax.rewards.registry import REWARD_MODEL_PREFIX, builtin_rewards

    builtins = sorted(builtin_rewards())
    for name in functions:
        if name in builtins:
            continue
        if name.startswith(REWARD_MODEL_PREFIX):
            folder = os.path.expanduser(name[len(REWARD_MODEL_PREFIX):])
            if not os.path.isdir(folder):
                raise ConfigError(f"rewards.functions: {name!r}: no such folder {folder}; give the run_dir of a "
                                  "`tempax reward-model` run")
            continue
        if ":" not in name:
            close = difflib.get_close_matches(name, builtins, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"rewards.functions: unknown reward {name!r}; {hint}use one of {builtins} or "
                              "'package.module:function'")
        module_name, fn_name = name.split(":", 1)
        try:
            getattr(importlib.import_module(module_name), fn_name)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"rewards.functions: cannot import {name!r} ({e})") from None


def check_task(cfg: Any) -> None:
    """A gsm8k task's source is there and its first rows read (a generated task needs nothing)."""
    task = getattr(cfg, "task", None)
    if getattr(task, "name", None) != "gsm8k":
        return

    source = task.source
    if source is None or (not os.path.exists(os.path.expanduser(source)) and source.count("/") == 1):
        return  # a Hub id (with none, the Hub's openai/gsm8k): read on first use, with network
    try:
        rows = list(load_gsm8k(task.train_split, source, limit=_FIRST_ROWS))
    except TempaxError as e:
        raise ConfigError(f"task.source: {e}") from None
    if not rows:
        raise ConfigError(f"task.source: the {task.train_split!r} split of {source or 'gsm8k'} holds no problems")


def check_tokenizer_folder(key: str, folder: str, *, chat: bool) -> None:
    """A local tokenizer folder has tokenizer files, and a chat template when the run renders chats."""
    import json

    names = set(os.listdir(folder))
    if not names & {"tokenizer.json", "tokenizer.model", "vocab.json"}:
        raise ConfigError(f"{key}: {folder} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json); point "
                          "model.tokenizer at a folder with one")
    if not chat or "chat_template.jinja" in names or "chat_template.json" in names:
        return
    try:
        with open(os.path.join(folder, "tokenizer_config.json")) as f:
            has_template = bool(json.load(f).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        has_template = False
    if not has_template:
        raise ConfigError(f"{key}: the tokenizer in {folder} has no chat template, and this run renders chats; use "
                          "an instruct model's tokenizer (model.tokenizer) or plain-text data")
