"""The `tempax` command line: parses arguments and calls each command's `run(args)`.

Every command lives in its own module under `tempax.cli` exposing `add_arguments(parser)` and `run(args)`;
modules are imported only when their command runs, so `tempax --help` stays fast. User-caused problems
(`TempaxError`) print one clear message and exit with status 2 instead of a traceback; a training run that a
hook stopped early exits with status 3, one stopped by SIGTERM or Ctrl-C (after saving a checkpoint) with 143 or
130 (`EXIT_STATUSES`, shown by `tempax --help`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from tempax.errors import TempaxError

EXIT_STATUSES = """exit status:
  0    done
  2    a problem with the input (bad recipe, missing file, model too big...): the message says what to fix
  3    a training hook stopped the run early (e.g. the entropy-collapse guard); the reason is printed and
       written to RUN_DIR/metrics.jsonl and RUN_DIR/summary.json, and a checkpoint of that step is saved
  130  Ctrl-C: a training run finishes its step, saves a checkpoint of it and records the reason (a second
       Ctrl-C stops at once, without saving); other commands stop at once
  143  SIGTERM (preemption, SLURM, Kubernetes): the same as a first Ctrl-C; run the command again to resume"""

# command name -> (module under tempax.cli, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "the main job: SFT warm-start + GRPO on verifiable arithmetic, with a before/after table"),
    "model-info": ("model_info", "family, shapes, parameter count and weight memory of a model"),
    "generate": ("generate", "sample completions for prompts"),
    "chat": ("chat", "interactive chat with streamed tokens"),
    "sft": ("train_cmds", "supervised fine-tuning (full, LoRA, QLoRA) from a recipe"),
    "pretrain": ("train_cmds", "continued pre-training on plain text from a recipe"),
    "dpo": ("train_cmds", "preference tuning (DPO, IPO, hinge, ORPO, SimPO) from a recipe"),
    "kto": ("train_cmds", "KTO on unpaired desirable / undesirable feedback from a recipe"),
    "reward-model": ("train_cmds", "train a Bradley-Terry reward model from a recipe"),
    "grpo": ("train_cmds", "GRPO / DAPO / GSPO with verifiable rewards from a recipe"),
    "ppo": ("train_cmds", "RLHF with PPO against a trained reward model from a recipe"),
    "distill": ("train_cmds", "knowledge distillation of a teacher into a (layer-pruned) student from a recipe"),
    "score": ("score", "rate (prompt, response) pairs with a reward model"),
    "eval": ("evaluate", "accuracy, format accuracy and pass@k of a model on a task"),
    "validate": ("validate", "check a recipe: parse it, build its config, report problems"),
    "plot": ("plot", "draw a run's metric curves to PNG"),
    "export": ("export", "merge adapters and export a Hugging Face checkpoint"),
    "data": ("data", "clean (dedup, filters, PII, decontamination) or measure (tokens, lengths) a dataset"),
    "tokenizer": ("tokenizer", "train a byte-level BPE tokenizer, or add tokens to a model's tokenizer"),
    "recommend": ("recommend", "which method (pre-training, SFT, DPO, GRPO; full/LoRA/QLoRA) suits the data, as a recipe"),
    "launch": ("launch", "start N processes of one multi-process run on this machine (jax.distributed)"),
}


# Commands that only train (Trainer.fit): their processes get `setup_process(job="train")` (huge pages).
TRAINING_COMMANDS = ("sft", "pretrain", "dpo", "kto", "reward-model", "distill")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tempax", description="Post-training for LLMs in JAX.", epilog=EXIT_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=EXIT_STATUSES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(_module=module, _command=name)
        try:
            mod = importlib.import_module(f"tempax.cli.{module}")
        except ModuleNotFoundError as e:
            if e.name != f"tempax.cli.{module}":
                raise
            p.set_defaults(_missing=True)
            continue
        mod.add_arguments(p, name) if _takes_name(mod.add_arguments) else mod.add_arguments(p)
    return parser


def _takes_name(fn) -> bool:
    import inspect

    return len(inspect.signature(fn).parameters) >= 2


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the `tempax` command itself, not a call from Python: set up the process first
        from tempax.cli.process import compilation_cache_env, setup_process

        os.environ.update(compilation_cache_env(os.environ))  # before JAX starts: it reads these once
        setup_process(job="train" if sys.argv[1:2] and sys.argv[1] in TRAINING_COMMANDS else None)
    parser = build_parser()
    args = parser.parse_args(argv)
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
        print(f"tempax {args.command}: {'error: ' if status == 2 else ''}{e}", file=sys.stderr)
        return status
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
