"""The commands the README and the recipes' comments show are commands that work.

Every `tempax ...` line of the README's code blocks and every `# Run:` / `# Bigger:` line of a recipe (with its
backslash continuations) is parsed: a training command builds its config from the recipe and overrides (a key
that does not exist, or an override that cannot apply, fails here); any other command is parsed by the real
argument parser, and `tempax COMMAND --help` runs. The cheap ones then run: `validate` on the real recipe, and
`plot`, `export`, `generate` and `eval` on a tiny trained run (SOURCE = its exported folder, with a token budget
of a few tokens).
"""

from __future__ import annotations

import glob
import os
import re
import shlex

import pytest

from tempax.cli.main import build_parser, main
from tempax.algorithms.registry import algorithms
from tests.documented_commands import README, code_block_commands
from tests.cli.test_train_cmds import trained, workspace  # noqa: F401  (fixtures: a tiny LoRA SFT run)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme_commands() -> list[str]:
    return code_block_commands(README)


def recipe_commands() -> list[str]:
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "recipes", "**", "*.yaml"), recursive=True)):
        comment = []
        for line in open(path):
            if not line.startswith("#"):
                break
            comment.append(line[1:].strip())
        joined = "\n".join(comment).replace("\\\n", " ")
        for line in re.findall(r"^[A-Z][A-Za-z ]*:\s+(tempax .*)$", joined, re.M):
            line = re.split(r"\s{2,}\(", line)[0]  # a trailing "   (what it does)" note
            out += [part.strip() for part in line.split("&&")]
    return out


def argv_of(command: str, **placeholders: str) -> list[str]:
    """`tempax demo [--steps N --task arithmetic|gsm8k]` -> ["demo", "--steps", "1", "--task", "arithmetic"]."""
    command = re.sub(r"(?<!\S)\[(--[^\]]*)\]", r" \1 ", command)  # optional flags; `key=[a, b]` stays a list
    argv = []
    for word in shlex.split(command)[1:]:
        if word in ("...", "key=value", "KEY=VALUE"):  # the placeholder of "any overrides"
            continue
        word = word.split("|")[0] if "|" in word and not word.startswith("-") else word
        argv.append(placeholders.get(word, {"N": "1"}.get(word, word)))
    return argv


def _id(command: str) -> str:
    return command[:60]


COMMANDS = readme_commands() + recipe_commands()


def test_the_commands_are_found():
    readme, recipes = readme_commands(), recipe_commands()
    assert any(c.startswith("tempax generate") for c in readme) and any(c.startswith("tempax eval") for c in readme)
    assert any("model.overrides={}" in c for c in recipes)  # sft_full_tiny's "Bigger:" line
    assert any(c.startswith("tempax grpo") and "eval.num_problems=8" in c for c in recipes)  # "Quick check:"
    assert "tempax plot runs/sft_lora_smollm2" in recipes  # "Then: A && B" is two commands


@pytest.mark.parametrize("command", COMMANDS, ids=[_id(c) for c in COMMANDS])
def test_command_parses_and_builds(command, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    argv = argv_of(command, SOURCE="smollm2-135m-instruct", RUN_DIR="runs/x", OUT_DIR="out")
    if argv[0] in algorithms():
        from tempax.algorithms.registry import load_recipe

        args = build_parser().parse_args(argv)
        load_recipe(argv[0], args.config, list(args.overrides))  # raises ConfigError for a key or value that is wrong
        return
    build_parser().parse_args(argv)  # an unknown flag or a missing argument exits here
    with pytest.raises(SystemExit) as info:
        main([argv[0], "--help"])
    assert info.value.code == 0


@pytest.mark.heavy
def test_cheap_commands_run(trained, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.chdir(ROOT)
    run_dir, out = str(trained), str(tmp_path / "exported")
    ran = set()
    order = ["validate", "plot", "export", "generate", "eval"]  # export writes the folder the others load
    commands = sorted(readme_commands(), key=lambda c: order.index(c.split()[1]) if c.split()[1] in order else 9)
    for command in commands:
        argv = argv_of(command, SOURCE=out, RUN_DIR=run_dir, OUT_DIR=out, **{"MODEL.gguf": str(tmp_path / "m.gguf")})
        name = argv[0]
        if name == "validate" or (name in ("plot", "export")):
            pass
        elif name == "generate":
            argv[1] = out  # whatever model the line names (a registered name, the quick start's run dir)
            argv += ["--max-new-tokens", "3"]
        elif name == "eval":  # gsm8k's prompts are longer than the tiny model's 256 positions: its short sibling
            argv = [("arithmetic" if a == "gsm8k" else a) for a in argv]
            argv += ["--num-problems", "1", "--max-new-tokens", "3", "--batch-size", "1"]
        else:
            continue
        assert main(argv) == 0, f"{command!r} -> {argv} failed: {capsys.readouterr().err[-2000:]}"
        ran.add(name)
    assert ran == {"validate", "plot", "export", "generate", "eval"}
