"""`tempax chat SOURCE`: an interactive conversation, tokens printed as they are generated.

Each turn renders the whole conversation with the model's chat template and streams the reply. Type `/reset`
to start over, `/exit` (or end the input) to quit. Ctrl-C during a reply stops that reply and keeps the
conversation (what was said so far stays in it), as ollama and llama-cli do; Ctrl-C at the prompt quits.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from tempax.cli.generate import add_sampling_arguments, load_source, sampling_config
from tempax.errors import GenerationError

# Modules that load JAX are imported in the functions using them: `tempax COMMAND --help` stays light.


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sampling_arguments(parser, temperature=0.7, max_new_tokens=256)
    parser.add_argument("--system", help="system message that opens the conversation")
    parser.add_argument("--chunk", type=int, default=4, help="tokens decoded per device call while streaming")


def chat_loop(model, tokenizer, config, *, system: str | None, chunk: int, inp: TextIO, out: TextIO) -> None:
    """Reads user turns from `inp` until `/exit` or end of input, streaming each reply to `out`."""
    from tempax.generate import stream

    history: list[dict[str, str]] = []
    if system:
        history.append({"role": "system", "content": system})
    turn = 0
    while True:
        out.write("you> ")
        out.flush()
        line = inp.readline()
        if not line:
            out.write("\n")
            return
        text = line.strip()
        if text == "/exit":
            return
        if text == "/reset":
            history = history[:1] if system else []
            out.write("(conversation cleared)\n")
            continue
        if not text:
            continue
        history.append({"role": "user", "content": text})
        ids = tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=True)
        out.write("assistant> ")
        reply = []
        # A different seed per turn so that repeated questions do not get identical samples.
        pieces = stream(model, tokenizer, ids, config.replace(seed=config.seed + turn), chunk_size=chunk)
        try:
            for piece in pieces:
                reply.append(piece)
                out.write(piece)
                out.flush()
        except GenerationError as e:  # the conversation outgrew the context: say so and keep the session
            history.pop()
            out.write(f"\n(error: {e} Type /reset to start a new conversation.)\n")
            continue
        except KeyboardInterrupt:  # stop this reply only; the part already shown stays in the conversation
            pieces.close()
            out.write("\n(reply stopped; Ctrl-C at the prompt or /exit quits)")
            if not reply:
                history.pop()
                out.write("\n")
                continue
        out.write("\n")
        history.append({"role": "assistant", "content": "".join(reply)})
        turn += 1


def run(args: argparse.Namespace) -> int:
    config = sampling_config(args)
    model, tokenizer = load_source(args.source, args.dtype)
    if not tokenizer.has_chat_template:
        print("note: this tokenizer has no chat template; using a plain 'role: content' layout", file=sys.stderr)
    chat_loop(model, tokenizer, config, system=args.system, chunk=max(1, args.chunk), inp=sys.stdin, out=sys.stdout)
    return 0
