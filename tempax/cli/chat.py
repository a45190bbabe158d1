"""`tempax chat SOURCE`: an interactive conversation, tokens printed as they are generated.

Type `/reset` to start over, `/exit` (or end the input) to quit. Ctrl-C during a reply stops that reply and keeps
the conversation; Ctrl-C at the prompt quits. The conversation is `tempax.generate.chat.chat_loop`; this module
parses arguments and loads the model.
"""

from __future__ import annotations

import argparse
import sys

from tempax.cli.generate import add_sampling_arguments, load_source, sampling_config

# Ctrl-C during a reply stops the reply and keeps the conversation (`tempax.cli.interrupt`).
HANDLES_CTRL_C = True

# Modules that load JAX are imported in the functions using them: `tempax COMMAND --help` stays light.


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sampling_arguments(parser, temperature=0.7, max_new_tokens=256)
    parser.add_argument("--system", help="system message that opens the conversation")
    parser.add_argument("--chunk", type=int, default=4, help="tokens decoded per device call while streaming")


def run(args: argparse.Namespace) -> int:
    from tempax.generate.chat import chat_loop

    config = sampling_config(args)
    model, tokenizer = load_source(args.source, args.dtype)
    if not tokenizer.has_chat_template:
        print("note: this tokenizer has no chat template; using a plain 'role: content' layout", file=sys.stderr)
    chat_loop(model, tokenizer, config, system=args.system, chunk=max(1, args.chunk), inp=sys.stdin, out=sys.stdout)
    return 0
