"""What the test services share: a threaded HTTP server on a loopback address, the request
handler's strict reading of a body and its JSON answer, the foreground run of ``python -m``, a
SQLite record that is on disk before an answer about it leaves, and canonical JSON.

Used by :class:`intentlog.testing.ReferenceService` and by the fakes of
:mod:`intentlog.testing.fakes`.
"""

from __future__ import annotations

import argparse
import http.server
import json
import signal
import socketserver
import sqlite3
import sys
import threading
from collections.abc import Mapping
from typing import Any, Protocol

__all__ = [
    "MAX_BODY",
    "BodyError",
    "JsonHandler",
    "LoopbackServer",
    "canonical",
    "open_record",
    "serve_until_signalled",
    "serving_arguments",
]

MAX_BODY = 1 << 20


class LoopbackServer(http.server.ThreadingHTTPServer):
    """A ThreadingHTTPServer for crash tests: handler threads are daemons, a burst of
    clients is queued, binding never asks DNS, and a client killed mid-request is no error.

    ``block_on_close`` (inherited, True) makes ``server_close()`` join the handler threads, so
    none of them touches a record after its owner closed it.
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # the default 5 makes a burst of clients wait out SYN retries
    _serving: threading.Thread | None = None  # the thread serve_in_thread started

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), which can stall for seconds on hosts
        # without reverse DNS; the name is never used here.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Crash tests kill clients mid-request: a reset or broken pipe while answering a dead
        # client is expected and must not spray tracebacks over the test output.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        """The base URL, like ``http://127.0.0.1:54321``."""
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def serve_in_thread(self, name: str) -> None:
        """Serve on a daemon thread called ``name``, until :meth:`stop_serving`."""
        thread = threading.Thread(
            target=self.serve_forever,
            kwargs={"poll_interval": 0.05},  # shutdown() waits up to one poll interval
            name=name,
            daemon=True,
        )
        thread.start()
        self._serving = thread

    def stop_serving(self) -> None:
        """Stop serving and close the socket; returns once the serving thread and every
        handler thread have ended."""
        self.shutdown()
        self.server_close()  # joins the handler threads
        if self._serving is not None:
            self._serving.join()
            self._serving = None


class BodyError(Exception):
    """A request body :meth:`JsonHandler.read_body` refuses; ``status`` and ``code`` are the
    reference service's answer to it (a fake answers it as its service answers a 400)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class JsonHandler(http.server.BaseHTTPRequestHandler):
    """A test service's request handler: every method is answered by :meth:`answer`, which
    reads the whole body first (:meth:`read_body`) and answers JSON (:meth:`send_json`)."""

    timeout = 15.0  # a client that connects and never sends must not pin stop() forever

    def log_message(self, format: str, *args: Any) -> None:
        pass  # crash tests would drown in access logs

    def answer(self) -> None:
        raise NotImplementedError

    def do_GET(self) -> None:
        self.answer()

    # Routing answers 405 for a wrong method on a known path, so every method goes one way.
    do_POST = do_DELETE = do_PUT = do_PATCH = do_GET

    def read_body(self) -> bytes:
        """The whole body, by its Content-Length; BodyError for a chunked, unbounded, over
        :data:`MAX_BODY` or truncated one. Read it before answering anything: closing a socket
        with unread input sends a reset, which can destroy the answer before the client read
        it."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise BodyError(411, "length_required", "send a Content-Length, not a chunked body")
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise BodyError(400, "invalid_content_length", "Content-Length is no number") from None
        if not 0 <= length <= MAX_BODY:
            raise BodyError(413, "body_too_large", f"the body must be 0 to {MAX_BODY} bytes")
        data = self.rfile.read(length)
        if len(data) != length:  # the client died mid-send: never apply a truncated request
            raise BodyError(400, "truncated_body", f"got {len(data)} of {length} bytes")
        return data

    def send_json(self, status: int, body: Any, headers: Mapping[str, str]) -> None:
        """Answer ``status`` with ``body`` as JSON and the extra ``headers``."""
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


def serving_arguments(parser: argparse.ArgumentParser, record: str) -> None:
    """Add the options every ``python -m`` test service takes: ``--host``, ``--port`` and its
    record file (``record``: the option's name)."""
    parser.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="default: 0, an ephemeral port")
    parser.add_argument(
        record, default=None, help="SQLite record file (default: a temporary file, removed)"
    )


class _Serving(Protocol):
    @property
    def url(self) -> str: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc_info: object) -> None: ...


def serve_until_signalled(service: _Serving) -> int:
    """Run ``service`` in the foreground (``python -m``): print exactly one line, ``listening
    on URL``, once it accepts connections, and stop it on SIGTERM or SIGINT, after the requests
    in flight are done. Returns the exit status, 0."""
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    # Block the stop signals before any thread exists (threads inherit the mask), then take
    # them with sigwait: no handler runs at an arbitrary point, and a signal that arrives during
    # start-up waits for sigwait instead of killing the process half-started.
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    with service:
        print(f"listening on {service.url}", flush=True)
        signal.sigwait(stop_signals)
    return 0


def open_record(path: str, schema: str, *, timeout: float) -> sqlite3.Connection:
    """A connection to the SQLite record at ``path``, with ``schema`` applied.

    WAL + FULL: a row is on disk before the answer about it leaves, even if the service's
    process is killed (which makes the record usable as ground truth), and readers in other
    processes never block the writer. ``isolation_level=None``: callers issue their own
    transactions; ``check_same_thread=False``: handler threads share it under their lock.
    """
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=timeout)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.executescript(schema)
    except BaseException:
        conn.close()
        raise
    return conn


def canonical(value: object) -> str:
    """Canonical JSON (sorted keys, no spaces), to compare a retry's parameters with the
    first request's."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
