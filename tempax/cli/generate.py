"""`tempax generate SOURCE --prompt TEXT [...]`: sample completions and print them.

SOURCE is a registered name, a Hugging Face checkpoint folder or Hub id, a .gguf file, or a training run's
directory (its newest intact checkpoint, adapters merged: `tempax.train.run_model`). For a model whose tokenizer has a chat
template (an instruct model), each prompt is sent as a user turn through that template, as `ollama run`, llama.cpp's
conversation mode and vLLM's chat endpoint do: an instruct model given the bare text tends to end the reply at once.
`--raw` sends prompts exactly as written (a base model, a completion-style prompt); a model without a template is
always sent the raw text. `--json` prints one JSON object per completion (text, token ids, log-probs, finish reason)
for scripts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from tempax.cli import interrupt
from tempax.cli.flags import fields_as_flags
from tempax.errors import GenerationError

# Modules that load JAX are imported in the functions using them: `tempax COMMAND --help` stays light.


def add_sampling_arguments(parser: argparse.ArgumentParser, *, temperature: float, max_new_tokens: int) -> None:
    """Options shared by `generate` and `chat`."""
    parser.add_argument("source", help="registered model name, checkpoint folder, .gguf file, Hub repo id or a "
                        "training run's directory")
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help="most tokens per completion")
    parser.add_argument("--temperature", type=float, default=temperature, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold in (0, 1] (1 = off)")
    parser.add_argument("--min-p", type=float, default=0.0, help="min-p threshold relative to the top token")
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed, same samples)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                        help="weights and activations dtype (default: the checkpoint's, float32 for GGUF)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sampling_arguments(parser, temperature=1.0, max_new_tokens=128)
    parser.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    parser.add_argument("--prompts-file", help="a text file with one prompt per line")
    parser.add_argument("--n", type=int, default=1, help="completions per prompt (a recipe's group_size)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--chat", action="store_true",
                      help="wrap each prompt in the chat template as a user turn (the default when there is one)")
    mode.add_argument("--raw", action="store_true", help="send each prompt as written, without the chat template")
    parser.add_argument("--system", help="system message (through the chat template)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per completion")


# The sampling fields `generate` and `chat` set from flags, and those flags (`tempax.cli.flags`).
SAMPLING_FLAGS = {"max_new_tokens": "--max-new-tokens", "temperature": "--temperature", "top_k": "--top-k",
                  "top_p": "--top-p", "min_p": "--min-p", "seed": "--seed", "stop": "--stop", "n": "--n"}


def sampling_config(args: argparse.Namespace, **extra: Any):
    from tempax.generate import SamplingConfig

    with fields_as_flags(**SAMPLING_FLAGS):
        return SamplingConfig(
            max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            min_p=args.min_p, seed=args.seed, stop=tuple(args.stop), **extra,
        )


def load_source(source: str, dtype: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) from any source `tempax.models.registry.load` accepts or a training run's directory
    (`tempax.algorithms.run_dirs.load_source`); the tokenizer is required."""
    from tempax.algorithms.run_dirs import load_source as load_model_or_run  # loads JAX and Orbax

    model, tokenizer = load_model_or_run(source, dtype=dtype, param_dtype=dtype, progress=True)
    if tokenizer is None:
        raise GenerationError(
            f"{source} has no tokenizer (a random-init preset?); generating text needs a checkpoint folder, "
            "a .gguf file or a registered model name"
        )
    return model, tokenizer


def _prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt)
    if args.prompts_file:
        if not os.path.isfile(args.prompts_file):
            raise GenerationError(f"--prompts-file {args.prompts_file} does not exist")
        with open(args.prompts_file, encoding="utf-8") as f:
            prompts += [line.rstrip("\n") for line in f if line.strip()]
    if not prompts:
        raise GenerationError("no prompt given: pass --prompt TEXT (repeatable) or --prompts-file FILE")
    for i, text in enumerate(prompts):
        if not text:
            raise GenerationError(f"prompt {i} is empty: pass some text")
    return prompts


# Tokens decoded per device call while one completion streams: small enough that text appears as it is made,
# large enough that the calls' own cost stays small beside the tokens'.
STREAM_CHUNK = 8


def _print_batch(result: Any, prompts: list[str], args: argparse.Namespace, templated: bool, out: Any) -> None:
    for r, text in enumerate(result.texts):
        i, j = divmod(r, result.n)
        if args.json:
            out.write(json.dumps({"prompt_index": i, "sample": j, "prompt": prompts[i], **result.completion(r),
                                  "chat_template": templated}) + "\n")
        else:
            label = f"[{i}]" if result.n == 1 else f"[{i}.{j}]"
            out.write(f"{label} {prompts[i]!r}\n{text}\n\n")


def _stream_one(model: Any, tokenizer: Any, prompt: Any, config: Any, text: str, out: Any) -> Any:
    """Prints one completion as it is generated (as `ollama run` and llama.cpp do), in the layout of the batch
    output, and returns its `GenerationResult`."""
    from tempax.generate import stream

    out.write(f"[0] {text!r}\n")
    out.flush()
    pieces = stream(model, tokenizer, prompt, config, chunk_size=STREAM_CHUNK)
    line_open = False  # text printed since the last newline
    try:
        while True:
            try:
                piece = next(pieces)
            except StopIteration as finished:
                out.write("\n\n")
                out.flush()
                return finished.value
            out.write(piece)
            out.flush()
            if piece:
                line_open = not piece.endswith("\n")
            interrupt.check()  # a Ctrl-C whose KeyboardInterrupt was dropped (in a callback) stops here
    except KeyboardInterrupt:
        if line_open:  # end the partial text's line, so "interrupted" (on stderr) starts a line of its own
            out.write("\n")
            out.flush()
        raise


def run(args: argparse.Namespace) -> int:
    from tempax.generate import generate

    prompts = _prompts(args)
    config = sampling_config(args, n=args.n)  # validates the knobs before the (slow) model load
    if args.system and args.raw:
        raise GenerationError("--system goes through the chat template; drop --raw to use it")
    model, tokenizer = load_source(args.source, args.dtype)
    templated = not args.raw and tokenizer.has_chat_template
    if args.chat and not templated:
        raise GenerationError(f"{args.source}'s tokenizer has no chat template; drop --chat to send the prompt as is")
    if templated:
        def render(text: str) -> list[int]:
            messages = ([{"role": "system", "content": args.system}] if args.system else [])
            return tokenizer.apply_chat_template(
                messages + [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )

        inputs: list[Any] = [render(p) for p in prompts]
    else:
        inputs = prompts
    out = sys.stdout
    if len(inputs) == 1 and args.n == 1 and not args.json:
        result = _stream_one(model, tokenizer, inputs[0], config, prompts[0], out)
    else:
        result = generate(model, tokenizer, inputs, config)
        _print_batch(result, prompts, args, templated, out)
    s = result.stats
    tokens = int(result.lengths.sum())
    how = ("prompts sent through the chat template; --raw sends them as written" if templated
           else "prompts sent as written")
    print(
        f"{tokens} tokens in {s.prefill_s + s.decode_s:.2f} s (prefill {s.prefill_s:.2f} s, "
        f"decode {s.decode_s:.2f} s, {s.compiles} compiled); {how}", file=sys.stderr,
    )
    empty = [r for r in range(len(result.texts)) if int(result.lengths[r]) <= 1 and not result.texts[r].strip()]
    if empty and not templated and tokenizer.has_chat_template:
        print(f"{len(empty)} completion(s) ended at once: this is a chat model; drop --raw to send the prompt "
              "through its chat template", file=sys.stderr)
    return 0
