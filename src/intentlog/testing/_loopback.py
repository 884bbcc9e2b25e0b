"""What the test services share: a threaded HTTP server on a loopback address, a SQLite
record that is on disk before an answer about it leaves, and canonical JSON.

Used by :class:`intentlog.testing.ReferenceService` and by the fakes of
:mod:`intentlog.testing.fakes`.
"""

from __future__ import annotations

import http.server
import json
import socketserver
import sqlite3
import sys
from typing import Any

__all__ = ["LoopbackServer", "canonical", "open_record"]


class LoopbackServer(http.server.ThreadingHTTPServer):
    """A ThreadingHTTPServer for crash tests: handler threads are daemons, a burst of
    clients is queued, binding never asks DNS, and a client killed mid-request is no error.

    ``block_on_close`` (inherited, True) makes ``server_close()`` join the handler threads, so
    none of them touches a record after its owner closed it.
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # the default 5 makes a burst of clients wait out SYN retries

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
