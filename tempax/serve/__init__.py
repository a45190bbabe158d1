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
from tempax.generate.continuous import slot_bucket
from tempax.models.cache import kv_bytes_per_position, linear_state_bytes
from tempax.serve.batcher import Batcher
from tempax.serve.protocol import APIError, Limits
from tempax.serve.server import OpenAIServer, check_address


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
    kv_cache_gib: float = 4.0,
    join_running: bool = True,
) -> OpenAIServer:
    """A bound (not yet serving) `OpenAIServer` for `model` with its batcher running and every program it can
    call compiled (so /health answers only once no request can trigger a compile).

    Args:
      host, port: where to listen; the loopback address by default (the server has no authentication).
      model_name: the model id clients name.
      max_model_len: positions per request, prompt + completion (None: the model's max_position_embeddings, cut
        to the longest power of two whose KV cache for `max_batch` slots fits `kv_cache_gib`).
      max_batch: slots: most completions decoded together; chunk: tokens per device call between host checks.
      default_max_tokens: max_tokens of a request that gives none (capped by what its prompt leaves).
      max_n: most completions one request may ask for.
      kv_cache_gib: the most memory the slots' KV cache may take.
      join_running: requests join the running decode (continuous batching); False waits for it to empty
        (static batches, for comparison).
    """
    check_address(host, port)  # before the compiles below: a busy port is refused at once
    context = int(model.config.max_position_embeddings)
    if max_batch < 1 or chunk < 1 or default_max_tokens < 1:
        raise GenerationError("--max-batch, --chunk and --default-max-tokens must be positive integers")
    budget = (int(kv_cache_gib * 2**30) // max_batch - linear_state_bytes(model.config)) \
        // kv_bytes_per_position(model.config)
    if max_model_len is not None:
        if not 2 <= max_model_len <= context:
            raise GenerationError(f"--max-model-len {max_model_len} must lie in [2, {context}] (the model's context)")
        if slot_bucket(max_model_len) > budget:
            raise GenerationError(
                f"--max-model-len {max_model_len} needs {slot_bucket(max_model_len)} cache positions in each of "
                f"--max-batch {max_batch} slots, more than {kv_cache_gib} GiB of KV cache holds ({budget}); "
                "lower --max-batch or --max-model-len")
        context = max_model_len
    else:
        fitting = 1 << max(budget, 1).bit_length() - 1
        if fitting < 16:
            raise GenerationError(f"--max-batch {max_batch} slots leave under 16 cache positions each in "
                                  f"{kv_cache_gib} GiB of KV cache; lower --max-batch")
        context = min(context, fitting)
    limits = Limits(context=context, default_max_tokens=default_max_tokens, max_n=min(max_n, max_batch))
    batcher = Batcher(model, tokenizer, max_rows=max_batch, chunk=chunk, context=context, join_running=join_running)
    batcher.warm_up()
    batcher.start()
    try:
        return OpenAIServer((host, port), tokenizer=tokenizer, batcher=batcher, model_name=model_name, limits=limits)
    except OSError as e:
        batcher.close()
        raise GenerationError(f"cannot listen on {host}:{port} ({e.strerror}); choose another --port") from None


__all__ = ["APIError", "Batcher", "Limits", "OpenAIServer", "check_address", "start_server"]
