"""The `tempax` entry point: `tempax --help` lists the commands without importing any command module or JAX."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Runs `tempax --help` in a fresh interpreter and prints the modules it imported, one a line.
_PROBE = """
import sys
from tempax.cli.main import main
try:
    main({argv!r})
except SystemExit:
    pass
print("\\n".join(sorted(sys.modules)), file=sys.stderr)
"""


def _imported_by(argv: list[str]) -> tuple[str, set[str]]:
    done = subprocess.run([sys.executable, "-c", _PROBE.format(argv=argv)], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout, set(done.stderr.split())


def test_top_level_help_imports_no_command_module_and_no_jax():
    help_text, modules = _imported_by(["--help"])
    assert "sft" in help_text and "supervised fine-tuning" in help_text and "launch" in help_text
    commands = sorted(m for m in modules if m.startswith("tempax.cli.") and m not in (
        "tempax.cli.main", "tempax.cli.interrupt", "tempax.runtime.process", "tempax.runtime.host"))
    assert commands == [], f"tempax --help imported command modules {commands}"
    assert "jax" not in modules and "flax" not in modules


def test_a_command_help_imports_only_that_command():
    help_text, modules = _imported_by(["model-info", "--help"])
    assert "usage: tempax model-info" in help_text
    assert "tempax.cli.model_info" in modules
    assert not {"tempax.cli.train_cmds", "tempax.cli.demo", "tempax.cli.chat"} & modules


def test_the_cli_names_its_training_commands():
    from tempax.cli.main import commands, training_commands

    training = training_commands()
    assert set(training) <= set(commands())
    assert "sft" in training and "generate" not in training and "grpo" not in training


def test_a_setting_written_as_an_option_gets_the_form_without_dashes(capsys):
    """`--train.steps=1` got the top-level usage and "unrecognized arguments"; now one line with the fix, for every
    command that takes KEY=VALUE settings (a nested one too), whichever way the value was attached."""
    from tempax.cli.main import main

    cases = [
        (["sft", "--config", "r.yaml", "--train.steps=1"], "tempax sft: error: --train.steps=1 is not an option; "
                                                           "a setting is written without the dashes: train.steps=1"),
        (["dpo", "--train.steps", "3"], "tempax dpo: error: --train.steps is not an option; a setting is written "
                                        "without the dashes: train.steps=3"),
        (["data", "clean", "in.jsonl", "out.jsonl", "--near_dedup.threshold=0.8"],
         "tempax data clean: error: --near_dedup.threshold=0.8 is not an option; a setting is written without the "
         "dashes: near_dedup.threshold=0.8"),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        assert capsys.readouterr().err == message + "\n"



def test_xla_out_of_memory_from_any_command_is_one_line_and_status_2(monkeypatch, capsys):
    """A RESOURCE_EXHAUSTED raised outside a train step (which explains its own) still ends as one message naming
    it and what to change, exit status 2, never a traceback."""
    import jax

    import tempax.cli.validate
    from tempax.cli.main import main

    def out_of_memory(args):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to "
                                         "allocate 4.00G. That was not possible. There are 1.20G free.")

    monkeypatch.setattr(tempax.cli.validate, "run", out_of_memory)
    assert main(["validate", "recipe.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tempax validate: error: the device ran out of memory running tempax validate")
    assert "Attempting to allocate 4.00G" in err and "train.memory=offload_optimizer" in err
    assert "Traceback" not in err and err.count("\n") == 0
