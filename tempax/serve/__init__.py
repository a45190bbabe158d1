"""`tempax serve`: an OpenAI-compatible HTTP endpoint on the generation engine, with a request batcher.

    from tempax.serve import start_server
    server = start_server(model, tokenizer, port=0)   # bound to 127.0.0.1; port 0 picks a free one
    server.start_in_thread()
    # openai.OpenAI(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key="none")
    server.shutdown(); server.close()

See docs/serving.md.
"""

from __future__ import annotations

from typing import Any

from tempax.errors import GenerationError
from tempax.serve.batcher import Batcher
from tempax.serve.protocol import APIError, Limits
from tempax.serve.server import OpenAIServer


def start_server(
    model: Any,
    tokenizer: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str = "tempax",
    max_model_len: int | None = None,
    max_batch: int = 32,
    chunk: int = 8,
    default_max_tokens: int = 256,
    max_n: int = 16,
) -> OpenAIServer:
    """A bound (not yet serving) `OpenAIServer` for `model` with its batcher running.

    Args:
      host, port: where to listen; the loopback address by default (the server has no authentication).
      model_name: the model id clients name.
      max_model_len: positions per request, prompt + completion (None: the model's max_position_embeddings).
      max_batch: most completions decoded together; chunk: tokens per device call between host checks.
      default_max_tokens: max_tokens of a request that gives none (capped by what its prompt leaves).
      max_n: most completions one request may ask for.
    """
    context = int(model.config.max_position_embeddings)
    if max_model_len is not None:
        if not 2 <= max_model_len <= context:
            raise GenerationError(f"--max-model-len {max_model_len} must lie in [2, {context}] (the model's context)")
        context = max_model_len
    if max_batch < 1 or chunk < 1 or default_max_tokens < 1:
        raise GenerationError("--max-batch, --chunk and --default-max-tokens must be positive integers")
    limits = Limits(context=context, default_max_tokens=default_max_tokens, max_n=min(max_n, max_batch))
    batcher = Batcher(model, tokenizer, max_rows=max_batch, chunk=chunk)
    try:
        return OpenAIServer((host, port), tokenizer=tokenizer, batcher=batcher, model_name=model_name, limits=limits)
    except OSError as e:
        batcher.close()
        raise GenerationError(f"cannot listen on {host}:{port} ({e.strerror}); choose another --port") from None


__all__ = ["APIError", "Batcher", "Limits", "OpenAIServer", "start_server"]
