"""Every config key and command-line flag that a message suggests exists.

Walks the message templates of the package: the string parts (f-string pieces included) of every `raise`, and of
every call to `say`, `print`, `warn` or `log`. A dotted word that starts with a config section (`train.`,
`data.`, `model.`...) must be a key (or section) of some algorithm's config; a `--flag` must be an option of some
`tempax` command. A message that suggests `drop_remainder=False` or `--task` with a key no config has fails here.
"""

from __future__ import annotations

import ast
import glob
import os
import re

import pytest

from tempax.cli.main import build_parser
from tempax.algorithms.registry import algorithms, resolve
from tempax.configlib.fields import all_keys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = sorted(glob.glob(os.path.join(ROOT, "tempax", "**", "*.py"), recursive=True))
MESSAGE_CALLS = {"say", "_say", "print", "warn", "log"}


def _config_keys() -> set[str]:
    """Every key (and section) of a config a command reads KEY=VALUE overrides into."""
    from tempax.experiments.demo import DemoConfig

    keys: set[str] = set()
    for cls in [resolve(command)[0] for command in algorithms()] + [DemoConfig]:
        for key in all_keys(cls):
            parts = key.split(".")
            keys.update(".".join(parts[: i + 1]) for i in range(len(parts)))  # sections count too
    return keys


def _flags() -> set[str]:
    """Every option of every `tempax` command: from the real parser (sub-commands of sub-commands included) and
    from each `add_argument("--...")` in tempax/cli (parsers a command builds for itself, like `data clean`)."""
    out: set[str] = set()

    def walk(parser) -> None:
        for action in parser._actions:
            out.update(action.option_strings)
            if isinstance(action.choices, dict):  # a sub-command table: name -> its parser
                for sub in action.choices.values():
                    walk(sub)

    walk(build_parser())
    for path in glob.glob(os.path.join(ROOT, "tempax", "cli", "*.py")):
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                out.update(a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-"))
    return out


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def message_templates() -> list[tuple[str, int, str]]:
    """(file, line, text) of every string in a raise or a say/print/warn/log call under tempax/."""
    out = []
    for path in SOURCES:
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                parts = _strings(node.exc)
            elif isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                parts = _strings(node) if name in MESSAGE_CALLS else []
            else:
                continue
            if parts:
                out.append((os.path.relpath(path, ROOT), node.lineno, "".join(parts)))
    return out


def suggested_keys(text: str, sections: set[str]) -> list[str]:
    """Dotted words starting with a config section: `train.optimizer.learning_rate=1e-4` -> that key."""
    found = re.findall(r"(?<![\w./-])([a-z_]+(?:\.[a-z_][a-z0-9_]*)+)(?![\w/(])", text)
    return [k for k in found if k.split(".")[0] in sections and not re.search(r"\.(py|json|jsonl|yaml|md)$", k)]


def test_the_walk_finds_the_messages():
    texts = [t for _, _, t in message_templates()]
    assert len(texts) > 200
    assert any("train.checkpoint.resume=false" in t for t in texts)
    assert suggested_keys("set train.optimizer.learning_rate=1e-4 or data.max_rows", {"train", "data"}) == [
        "train.optimizer.learning_rate", "data.max_rows"]


def _sections(keys: set[str]) -> set[str]:
    """Names of config sections at any depth (`train`, `optimizer`, `checkpoint`...): a suggestion starting with
    `optimizer.` must still be the full key a user can type (`train.optimizer.learning_rate`)."""
    return {part for k in keys for part in k.split(".")[:-1]} | {k.split(".")[0] for k in keys}


def test_every_suggested_config_key_exists():
    keys = _config_keys()
    sections = _sections(keys)
    bad = [f"{f}:{line}: {k}" for f, line, text in message_templates() for k in suggested_keys(text, sections)
           if k not in keys]
    assert not bad, "messages suggest config keys that no config has:\n" + "\n".join(bad)


def test_every_suggested_flag_exists():
    flags = _flags()
    bad = [f"{f}:{line}: {flag}" for f, line, text in message_templates()
           for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text) if flag not in flags]
    assert not bad, "messages suggest flags that no command has:\n" + "\n".join(bad)


@pytest.mark.parametrize("text", ["use drop_remainder=False", "pass --no-such-flag"])
def test_the_checks_catch_a_bad_suggestion(text):
    keys, flags = _config_keys(), _flags()
    sections = _sections(keys)
    missing = [k for k in suggested_keys("data." + text.split()[-1], sections) if k not in keys]
    missing += [f for f in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text) if f not in flags]
    assert missing


# A suggestion: a verb that asks for a change, then a key ("raise max_bad_fraction", "set group_size > 0"), or
# "or key=value". The lookaheads let one verb's match overlap the next ("fix the file or raise max_rows").
SUGGESTION = re.compile(
    r"(?=\b(?:raise|lower|set|increase|reduce|decrease|loosen|shorten|pass|use|drop|enable|disable)\s+`?"
    r"([a-z][a-z0-9_]*)\b(?!\.?[a-z_(]))|(?=\bor\s+([a-z][a-z0-9_]*)=)"
)
# `tempax data clean` reads its own config (tempax.data.clean.CleanConfig), whose keys start at its top level.
CLEAN_FILES = ("tempax/data/clean.py", "tempax/cli/data.py")


def bare_suggestions(text: str, leaves: set[str]) -> list[str]:
    """Keys a message asks the user to change by their last part only (`max_bad_fraction`), not in full."""
    return [w for m in SUGGESTION.finditer(text) for w in m.groups() if w in leaves]


def _leaves(keys: set[str]) -> set[str]:
    """Last parts of nested keys that are not keys on their own."""
    return {k.rsplit(".", 1)[1] for k in keys if "." in k} - {k for k in keys if "." not in k}


def test_every_suggested_key_is_named_with_its_full_dotted_path():
    from tempax.data.clean import CleanConfig

    leaves = _leaves(_config_keys())
    clean_top = {k for k in all_keys(CleanConfig) if "." not in k}
    bad = [f"{f}:{line}: {word}" for f, line, text in message_templates()
           for word in bare_suggestions(text, leaves - (clean_top if f in CLEAN_FILES else set()))]
    assert not bad, "messages suggest a key by its last part only; write it in full (data.max_bad_fraction):\n" + \
        "\n".join(bad)


def test_the_full_path_check_catches_a_bare_key():
    leaves = _leaves(_config_keys())
    assert bare_suggestions("fix the rows or raise max_bad_fraction.", leaves) == ["max_bad_fraction"]
    assert bare_suggestions("use kind=jsd, or top_k=0", leaves) == ["kind", "top_k"]
    assert bare_suggestions("fix the rows or raise data.max_bad_fraction, or set train.seq_len=64", leaves) == []
    assert bare_suggestions("pass the path of a recipe", leaves) == []
