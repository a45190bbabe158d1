"""The `tempax` command line: parses arguments and calls each command's `run(args)`.

Every command lives in its own module under `tempax.cli` exposing `add_arguments(parser)` and `run(args)`;
modules are imported only when their command runs, so `tempax --help` stays fast. User-caused problems
(`TempaxError`) print one clear message and exit with status 2 instead of a traceback; a training run that a
hook stopped early exits with status 3, one whose checkpoint or metrics could not be written (a full disk) with 4,
one stopped by SIGTERM or Ctrl-C (after saving a checkpoint) with 143 or
130 (`EXIT_STATUSES`, shown by `tempax --help`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from tempax.algorithms import registry
from tempax.errors import TempaxError
from tempax.runtime.process import (
    compilation_cache_env, error_stream, quiet_unless_first_process, setup_process, weight_cache_env,
)

EXIT_STATUSES = """exit status:
  0    done
  2    a problem with the input (bad recipe, missing file, model too big...): the message says what to fix
  3    a training hook stopped the run early (e.g. the entropy-collapse guard); the reason is printed and
       written to RUN_DIR/metrics.jsonl and RUN_DIR/summary.json, and a checkpoint of that step is saved
  4    a run's file could not be written (disk full, file-size limit, I/O error): the message names the file,
       the space needed and free; nothing was half-written and the newest intact checkpoint is where the same
       command resumes (train.checkpoint.on_save_error=retry keeps training past a failed checkpoint)
  130  Ctrl-C: a training run finishes its step, saves a checkpoint of it and records the reason (a second
       Ctrl-C stops at once, without saving); other commands stop at once
  143  SIGTERM (preemption, SLURM, Kubernetes): the same as a first Ctrl-C; run the command again to resume"""

# command name -> (module under tempax.cli, one-line help); the training commands come from the algorithm
# registry (`tempax.algorithms.registry`, listed without importing JAX or any algorithm) and run in train_cmds.
TOOLS_BEFORE: dict[str, tuple[str, str]] = {
    "demo": ("demo", "the main job: SFT warm-start + GRPO on verifiable arithmetic, with a before/after table"),
    "model-info": ("model_info", "family, shapes, parameter count and weight memory of a model"),
    "generate": ("generate", "sample completions for prompts"),
    "chat": ("chat", "interactive chat with streamed tokens"),
    "serve": ("serve", "an OpenAI-compatible HTTP endpoint (chat and completions, streaming, batched requests)"),
}
TOOLS_AFTER: dict[str, tuple[str, str]] = {
    "score": ("score", "rate (prompt, response) pairs with a reward model"),
    "eval": ("evaluate", "accuracy, format accuracy and pass@k of a model on a task"),
    "validate": ("validate", "check a recipe: parse it, build its config, report problems"),
    "plot": ("plot", "draw a run's metric curves to PNG"),
    "export": ("export", "export a run or model: Hugging Face folder or llama.cpp GGUF, with a model card"),
    "data": ("data", "clean (dedup, filters, PII, decontamination) or measure (tokens, lengths) a dataset"),
    "tokenizer": ("tokenizer", "train a byte-level BPE tokenizer, or add tokens to a model's tokenizer"),
    "recommend": ("recommend", "which method (pre-training, SFT, DPO, GRPO; full/LoRA/QLoRA) suits the data, as a recipe"),
    "launch": ("launch", "start N processes of one multi-process run on this machine (jax.distributed)"),
}


def commands() -> dict[str, tuple[str, str]]:
    """Every command: name -> (module under tempax.cli, one-line help)."""
    training = {name: ("train_cmds", a.help) for name, a in registry.algorithms().items()}
    return {**TOOLS_BEFORE, **training, **TOOLS_AFTER}


def training_commands() -> tuple[str, ...]:
    """Commands that only train (Trainer.fit, no generation): their processes get `setup_process(job="train")`
    (a kept malloc heap)."""
    return tuple(name for name, a in registry.algorithms().items() if not a.on_policy)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The `tempax` parser. Given the command line `argv`, only the command it names gets its options (and only
    its module is imported): `tempax --help` lists the commands from `commands()` alone, without importing JAX.
    Without `argv` every command is complete (tests and the message checks walk all of them)."""
    parser = argparse.ArgumentParser(
        prog="tempax", description="Post-training for LLMs in JAX.", epilog=EXIT_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    for name, (module, help_text) in commands().items():
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=EXIT_STATUSES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(_module=module, _command=name)
        if chosen is not None and name != chosen:
            continue  # not the command being run: its name and help line are all the top-level help needs
        try:
            mod = importlib.import_module(f"tempax.cli.{module}")
        except ModuleNotFoundError as e:
            if e.name != f"tempax.cli.{module}":
                raise
            p.set_defaults(_missing=True)
            continue
        mod.add_arguments(p)  # the command's name reaches `run` as args._command
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the `tempax` command itself, not a call from Python: set up the process first
        command = sys.argv[1] if sys.argv[1:2] else None
        os.environ.update(compilation_cache_env(os.environ, command=command))  # before JAX starts: read once
        os.environ.update(weight_cache_env(os.environ))
        setup_process(job="train" if command in training_commands() else None)
        quiet_unless_first_process()
    command_line = sys.argv[1:] if argv is None else argv
    parser = build_parser(command_line)
    args = parser.parse_args(command_line)
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    if getattr(args, "_missing", False):
        print(f"tempax {args.command}: not available in this build", file=sys.stderr)
        return 2
    mod = importlib.import_module(f"tempax.cli.{args._module}")
    try:
        result = mod.run(args)
    except TempaxError as e:
        status = getattr(e, "exit_status", 2)  # RunStopped: 128 + the signal, not an error
        print(f"tempax {args.command}: {'error: ' if status in (2, 4) else ''}{e}", file=error_stream())
        return status
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
