"""The `tempax` command line: parses arguments and calls each command's `run(args)`.

Every command lives in its own module under `tempax.cli` exposing `add_arguments(parser)` and `run(args)`;
modules are imported only when their command runs, so `tempax --help` stays fast. User-caused problems
(`TempaxError`, and XLA running out of device memory) print one clear message and exit with status 2 instead of a
traceback; a training run that a hook stopped early exits with status 3, one whose checkpoint or metrics could
not be written (a full disk) with 4, one stopped by SIGTERM or Ctrl-C (after saving a checkpoint) with 143 or 130
(`EXIT_STATUSES`, shown by `tempax --help`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import signal
import sys
from typing import NoReturn

from tempax.cli import interrupt

if __name__ == "__main__" or os.path.basename(sys.argv[0]) == "tempax":  # the `tempax` command, not an import
    interrupt.exit_on_ctrl_c()  # before the imports below: a Ctrl-C while they run ends it without a traceback

from tempax.algorithms import registry  # noqa: E402  (after the Ctrl-C handler above)
from tempax.errors import TempaxError, device_out_of_memory, is_device_out_of_memory  # noqa: E402
from tempax.runtime.process import (  # noqa: E402
    compilation_cache_env, error_stream, quiet_unless_first_process, setup_process, weight_cache_env,
)

EXIT_STATUSES = """exit status:
  0    done
  2    a problem with the input (bad recipe, missing file, model too big, device out of memory...): the message
       says what to fix
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


# `--train.steps=1`: a recipe setting typed as an option (a dotted key, which no option has).
_DASHED_SETTING = re.compile(r"^--?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(=.*)?$")


def dashed_setting(parser: argparse.ArgumentParser, command_line: list[str]) -> str | None:
    """The message for a KEY=VALUE setting written with leading dashes (`--train.steps=1`), which argparse would
    answer with the usage and "unrecognized arguments"; None when there is none, or the command takes no settings."""
    chain, current = ["tempax"], parser
    for word in command_line:  # down to the (sub)command the line names: `tempax data clean ...`
        choices = next((a.choices for a in current._actions if isinstance(a, argparse._SubParsersAction)), None)
        if word.startswith("-") or not choices or word not in choices:
            continue
        chain.append(word)
        current = choices[word]
    if not any("KEY=VALUE" in str(action.metavar) for action in current._actions):
        return None
    for i, word in enumerate(command_line):
        found = _DASHED_SETTING.match(word)
        if found is None:
            continue
        key, value = found.group(1), found.group(2)
        if value is None:
            following = command_line[i + 1] if i + 1 < len(command_line) else None
            value = f"={following}" if following is not None and not following.startswith("-") else "=VALUE"
        return (f"{' '.join(chain)}: error: {word} is not an option; a setting is written without the dashes: "
                f"{key}{value}")
    return None


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the `tempax` command itself, not a call from Python: set up the process first
        command = sys.argv[1] if sys.argv[1:2] else None
        os.environ.update(compilation_cache_env(os.environ, command=command))  # before JAX starts: read once
        os.environ.update(weight_cache_env(os.environ))
        setup_process(job="train" if command in training_commands() else None)
        quiet_unless_first_process()
    command_line = sys.argv[1:] if argv is None else argv
    parser = build_parser(command_line)
    dashed = dashed_setting(parser, command_line)
    if dashed is not None:
        print(dashed, file=sys.stderr)
        return 2
    args = parser.parse_args(command_line)
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    if getattr(args, "_missing", False):
        print(f"tempax {args.command}: not available in this build", file=sys.stderr)
        return 2
    mod = importlib.import_module(f"tempax.cli.{args._module}")
    if argv is None:  # the command's own meaning of Ctrl-C, or tempax's (`tempax.cli.interrupt`)
        if getattr(mod, "HANDLES_CTRL_C", False):
            interrupt.leave_to_command()
        else:
            interrupt.install()
    try:
        result = mod.run(args)
    except KeyboardInterrupt:
        return _interrupted(process=argv is None)
    except Exception as e:
        if interrupt.requested():  # the Ctrl-C came out as another error (an import it cut short raises ImportError)
            return _interrupted(process=argv is None)
        if is_device_out_of_memory(e):  # XLA's RESOURCE_EXHAUSTED outside a train step (which explains its own)
            e = device_out_of_memory(e, what=f"tempax {args.command}")
        if not isinstance(e, TempaxError):
            raise
        status = getattr(e, "exit_status", 2)  # RunStopped: 128 + the signal, not an error
        print(f"tempax {args.command}: {'error: ' if status in (2, 4) else ''}{e}", file=error_stream())
        return status
    return int(result or 0)


def _interrupted(*, process: bool) -> int:
    """Says "interrupted" and gives status 130; as the `tempax` process, ends it (`end_interrupted_process`)."""
    if process:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a further Ctrl-C must not cut the lines below short
    print("interrupted", file=sys.stderr)
    if process:
        end_interrupted_process()
    return 130


def end_interrupted_process() -> NoReturn:
    """Ends the `tempax` process after a Ctrl-C with status 130, without Python's interpreter teardown.

    A Ctrl-C that lands while XLA compiles or runs a program surfaces as `KeyboardInterrupt` in the main thread
    while XLA's own threads are still at work; the teardown then frees the client those threads use, and the
    process dies of a segmentation fault (exit 139) instead of exiting 130. Nothing is left to finish after an
    interrupt: what tempax writes (checkpoints, caches, outputs) is written whole to a temporary name and renamed.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it anyway
            pass
    os._exit(130)


if __name__ == "__main__":
    sys.exit(main())
