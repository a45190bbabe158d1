"""Conversations with a model: an interactive session on a text stream, each reply streamed as it is generated
(`chat_loop`, `tempax chat`), and a reply function that samples one reply to the messages so far
(`sampled_replies`, the model as the policy of `tempax data episodes`).

Each turn renders the whole conversation with the model's chat template and streams the reply. `/reset` starts
over, `/exit` (or the end of the input) quits. Ctrl-C during a reply stops that reply and keeps the conversation
(what was said so far stays in it), as ollama and llama-cli do; a conversation that outgrows the model's context
is said and the session goes on.
"""

from __future__ import annotations

from typing import Any, Callable, TextIO

from tempax.errors import GenerationError
from tempax.generate.config import SamplingConfig
from tempax.generate.generation import generate, stream


def chat_loop(model: Any, tokenizer: Any, config: SamplingConfig, *, system: str | None, chunk: int, inp: TextIO,
              out: TextIO) -> None:
    """Reads user turns from `inp` until `/exit` or end of input, streaming each reply to `out` (see the module
    docstring for the commands and Ctrl-C)."""
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


def sampled_replies(model: Any, tokenizer: Any, *, temperature: float, max_new_tokens: int,
                    seed: int) -> Callable[[list[dict[str, Any]], Any], str]:
    """`reply(messages, task_row)`: one reply sampled for the conversation so far (rendered with the chat
    template), at `temperature`; each call uses the next seed, so a repeated conversation gets a fresh sample."""
    calls = [0]

    def reply(messages: list[dict[str, Any]], task_row: Any) -> str:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        calls[0] += 1
        config = SamplingConfig(n=1, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed + calls[0])
        return generate(model, tokenizer, [ids], config).texts[0]

    return reply
