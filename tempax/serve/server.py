"""The HTTP side of `tempax serve`: the standard library's threading HTTP server speaking OpenAI's API.

    GET  /v1/models              the one model served
    POST /v1/chat/completions    messages rendered with the model's chat template
    POST /v1/completions         raw prompts (text or token ids)
    GET  /health                 200 once the model is loaded

Each connection has its own thread, which parses and checks the request (`tempax.serve.protocol`), hands it to
the batcher and writes its answer: one JSON body, or server-sent events (`data: {chunk}` lines, then
`data: [DONE]`) when `stream` is true. No dependency beyond the standard library.
"""

from __future__ import annotations

import errno
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tempax.errors import GenerationError
from tempax.serve.batcher import Batcher, Job
from tempax.serve.protocol import (
    APIError,
    Limits,
    chunk_body,
    parse_chat,
    parse_completion,
    response_body,
    usage_chunk,
)

MAX_BODY_BYTES = 16 * 2**20


def check_address(host: str, port: int) -> None:
    """Refuses an address the server could not listen on, before a model is loaded or compiled: a port outside
    0-65535, a host that is not an address here, a port another process listens on (a trial bind of the socket
    the server makes, with its options, closed at once).

    Raises:
      GenerationError: naming the flag and the fix.
    """
    if not 0 <= port <= 65535:
        raise GenerationError(f"--port {port} is not a TCP port; choose one in 0-65535 (0: any free port)")
    with socket.socket(OpenAIServer.address_family, OpenAIServer.socket_type) as trial:
        trial.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, int(OpenAIServer.allow_reuse_address))
        try:
            trial.bind((host, port))
        except OSError as e:  # in use, not an address of this machine, a name that does not resolve
            flag = "--port" if e.errno in (errno.EADDRINUSE, errno.EACCES) else "--host"
            raise GenerationError(f"cannot listen on {host}:{port} ({e.strerror or e}); choose another {flag}") from None


class OpenAIServer(ThreadingHTTPServer):
    """A bound server; `serve_forever()` answers requests, `shutdown()` + `close()` stop it.

    Args:
      address: (host, port); port 0 picks a free one (read it back from `server_address`).
      tokenizer: the model's tokenizer (chat template, encoding, decoding).
      batcher: the `Batcher` that runs generation.
      model_name: the id /v1/models lists and requests must name (or leave out).
      limits: context and per-request limits.
    """

    daemon_threads = True  # a connection thread that outlives `close`'s wait does not hold the process open
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], *, tokenizer: Any, batcher: Batcher, model_name: str,
                 limits: Limits):
        self.tokenizer, self.batcher, self.model_name, self.limits = tokenizer, batcher, model_name, limits
        self.created = 0
        # Each connection and the thread serving it, kept until the thread has finished (not only the connection):
        # see `close`.
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serves the connection from its own thread, remembered so that `close` can end the connection and wait
        for the thread."""
        thread = threading.Thread(target=self.process_request_thread, args=(request, client_address),
                                  name="tempax-connection", daemon=True)
        with self._connections_lock:
            for conn, old in list(self._connections.items()):
                if not old.is_alive():
                    del self._connections[conn]
            self._connections[request] = thread
        thread.start()

    @property
    def open_connections(self) -> int:
        """Connections whose threads are still running."""
        with self._connections_lock:
            return sum(thread.is_alive() for thread in self._connections.values())

    def close(self, timeout: float = 10.0) -> None:
        """Stops serving: no new connections; every request not yet answered gets a 503 (`Batcher.close`); idle
        keep-alive connections are ended; then every connection thread is waited for until it has finished (up to
        `timeout` seconds in all).

        Why wait for the threads, not just the connections: a thread's target is this server's bound method, so
        the last thread to finish can hold the last reference to the server, its batcher and the model. Were that
        thread still running when the interpreter exits, the model's arrays would be freed in it during
        finalisation, where jaxlib's array destructor cannot take the interpreter lock back and the process
        aborts ("terminate called ... FATAL: exception not rethrown", status -6)."""
        self.server_close()
        self.batcher.close()
        with self._connections_lock:
            connections = dict(self._connections)
        for conn, thread in connections.items():
            if thread.is_alive():
                try:
                    conn.shutdown(socket.SHUT_RD)  # a wait for the next request reads the end; answers still go out
                except OSError:
                    pass  # its thread closed it meanwhile
        deadline = time.monotonic() + timeout
        for thread in connections.values():
            try:
                thread.join(max(deadline - time.monotonic(), 0.0))
            except RuntimeError:
                pass  # registered, but the stop signal came before it was started: it never runs

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed below HTTP (the client went away, or the server closed its socket while
        stopping on a signal) gets one line, not socketserver's traceback; anything else is socketserver's."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            host = client_address[0] if isinstance(client_address, tuple) and client_address else client_address
            print(f"tempax serve: a connection from {host} ended before its answer was sent ({error})",
                  file=sys.stderr)
            return
        super().handle_error(request, client_address)

    def start_in_thread(self) -> threading.Thread:
        """Serves from a daemon thread (tests and benchmarks); returns it."""
        thread = threading.Thread(target=self.serve_forever, name="tempax-serve", daemon=True)
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: OpenAIServer
    protocol_version = "HTTP/1.1"  # keep-alive for JSON answers; a stream closes its connection at the end

    def log_message(self, format: str, *args: Any) -> None:  # the default writes every request to stderr
        pass

    def do_GET(self) -> None:
        if self.path in ("/v1/models", "/models"):
            self._json(200, {"object": "list", "data": [
                {"id": self.server.model_name, "object": "model", "created": self.server.created,
                 "owned_by": "tempax", "max_model_len": self.server.limits.context}]})
        elif self.path in ("/health", "/v1/health"):
            self._json(200, {"status": "ok"})
        else:
            self._error(APIError(f"no route GET {self.path}; try GET /v1/models", status=404, code="not_found"))

    def do_POST(self) -> None:
        parsers = {"/v1/chat/completions": parse_chat, "/v1/completions": parse_completion}
        parse = parsers.get(self.path)
        try:
            body = self._body()  # read even for an unknown route, so the connection stays usable
            if parse is None:
                raise APIError(f"no route POST {self.path}; use /v1/chat/completions or /v1/completions",
                               status=404, code="not_found")
            request = parse(body, self.server.tokenizer, self.server.model_name, self.server.limits)
            job = self.server.batcher.submit(request)
        except APIError as e:
            self._error(e)
            return
        if request.stream:
            self._stream(job)
        else:
            self._answer(job)

    # -- bodies ------------------------------------------------------------------------------------------------
    def _body(self) -> Any:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise APIError("the request needs a Content-Length header and a JSON body", status=411)
        if int(length) > MAX_BODY_BYTES:
            raise APIError(f"the request body has {length} bytes; at most {MAX_BODY_BYTES} are accepted", status=413)
        raw = self.rfile.read(int(length))
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(f"the request body is not valid JSON: {e}") from None

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, error: APIError) -> None:
        self._json(error.status, error.body())

    def _answer(self, job: Job) -> None:
        while True:
            kind, value = job.events.get()
            if kind == "error":
                self._error(value)
                return
            if kind == "end":
                break
        self._json(200, response_body(job.request, job.choices, self.server.tokenizer))

    def _stream(self, job: Job) -> None:
        request = job.request
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        send = lambda body: self.wfile.write(b"data: " + json.dumps(body).encode() + b"\n\n") or self.wfile.flush()
        try:
            if request.kind == "chat":
                for index in range(job.rows):
                    send(chunk_body(request, index, None, first=True))
            while True:
                kind, value = job.events.get()
                if kind == "delta":
                    send(chunk_body(request, value[0], value[1]))
                elif kind == "choice":
                    send(chunk_body(request, value.index, None, value.finish_reason))
                elif kind == "error":
                    send(value.body())
                elif kind == "end":
                    break
            if request.include_usage and job.choices:
                send(usage_chunk(request, job.choices))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away; its rows finish in the batch and are dropped
