"""`tempax serve SOURCE`: an OpenAI-compatible endpoint (/v1/chat/completions, /v1/completions, /v1/models).

    tempax serve smollm2-135m-instruct --port 8000
    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
      -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32}'
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import NoReturn

from tempax.cli.generate import load_source

# Modules that load JAX are imported in the functions using them: `tempax COMMAND --help` stays light.

LOOPBACK = ("127.0.0.1", "localhost", "::1")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class ServerStopped(BaseException):
    """Raised in the main thread by a stop signal: leaves `serve_forever` so the server closes. A BaseException,
    as KeyboardInterrupt is, because socketserver answers an `Exception` raised while it hands a request to its
    thread by logging it and serving on: a signal landing at that moment would be swallowed."""


def _raise_stopped(signum: int, frame: object) -> None:
    raise ServerStopped(signal.Signals(signum).name)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="registered model name, checkpoint folder, .gguf file, Hub repo id or a "
                        "training run's directory")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: loopback only; the server has no authentication)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free port)")
    parser.add_argument("--served-model-name", help="the model id clients name (default: SOURCE's base name)")
    parser.add_argument("--max-model-len", type=int, help="positions per request, prompt + completion "
                        "(default: the model's context)")
    parser.add_argument("--max-batch", type=int, default=32, help="most completions decoded together")
    parser.add_argument("--chunk", type=int, default=8,
                        help="tokens decoded per device call between checks (stop strings, streaming)")
    parser.add_argument("--default-max-tokens", type=int, default=256,
                        help="max_tokens of a request that sets none")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                        help="compute dtype (default: the checkpoint's)")


def run(args: argparse.Namespace) -> NoReturn:
    from tempax.serve import check_address, start_server

    check_address(args.host, args.port)  # before the model loads and compiles: a bad or busy port is refused at once
    model, tokenizer = load_source(args.source, args.dtype)
    name = args.served_model_name or os.path.basename(os.path.normpath(args.source))
    server = start_server(model, tokenizer, host=args.host, port=args.port, model_name=name,
                          max_model_len=args.max_model_len, max_batch=args.max_batch, chunk=args.chunk,
                          default_max_tokens=args.default_max_tokens)
    host, port = server.server_address[:2]
    if args.host not in LOOPBACK:
        print(f"warning: listening on {args.host}, reachable from other machines; tempax serve has no "
              "authentication", file=sys.stderr)
    # Ctrl-C and SIGTERM (docker stop, Kubernetes, systemd) both stop the server. The handlers are installed here
    # rather than left to Python's default: a server started in the background by a script inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt for it, so Ctrl-C / kill -INT would do nothing.
    previous = {signum: signal.signal(signum, _raise_stopped) for signum in STOP_SIGNALS}
    print(f"serving {name} on http://{host}:{port}/v1 (Ctrl-C stops)", file=sys.stderr)
    try:
        server.serve_forever()
    except ServerStopped as stopped:
        print(f"tempax serve: stopped ({stopped})", file=sys.stderr)
    finally:
        for signum, handler in previous.items():  # a second Ctrl-C while closing is the usual interrupt
            signal.signal(signum, handler)
        server.close()
    exit_without_finalising(0)


def exit_without_finalising(status: int) -> NoReturn:
    """Ends the process with `status` once the server has closed: every request answered, every connection ended,
    nothing left to write. The interpreter's own finalisation is skipped because it can abort the process at this
    point: a thread that lets go of the last reference to JAX arrays while the interpreter is finalising frees
    them without the interpreter lock, and jaxlib's destructor then calls std::terminate (status -6, after the
    "stopped" line). `close()` waits for the server's own threads, but not for every thread a library started."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
