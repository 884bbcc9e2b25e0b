"""HTTP plumbing for the fake services: a threading server on 127.0.0.1 and its handler.

The handler reads the whole body, records the request's arrival, asks the fake's router for a
`Reply`, records how it was answered, and sends it. The fake is anything with the four methods
the handler calls (see `Routed`).
"""

from __future__ import annotations

import http.server
import json
import urllib.parse
from dataclasses import dataclass, field
from email.message import Message
from typing import Any, Protocol, cast

from intentlog.testing._loopback import LoopbackServer

__all__ = ["Reply", "Request", "Routed", "Server"]

_MAX_BODY = 1 << 20


@dataclass
class Request:
    """A parsed HTTP request handed to a service's router."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: Message
    body: bytes

    def header(self, name: str) -> str | None:
        return self.headers.get(name)


@dataclass
class Reply:
    """An answer, with what the record keeps about it (``params``, ``outcome``)."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    outcome: str = "rejected"
    params: Any = None


class Routed(Protocol):
    """What the handler needs from a fake."""

    @property
    def key_header(self) -> str: ...

    def _record_begin(self, method: str, path: str, key: str | None) -> int: ...
    def _record_finish(self, seq: int, reply: Reply) -> None: ...
    def _route(self, request: Request) -> Reply: ...
    def _error(self, status: int, message: str) -> Reply: ...


class Server(LoopbackServer):
    def __init__(self, address: tuple[str, int], fake: Routed) -> None:
        self.fake = fake
        super().__init__(address, _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 15.0  # a client that connects and never sends must not pin stop() forever

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        fake = cast(Server, self.server).fake
        url = urllib.parse.urlsplit(self.path)
        seq = fake._record_begin(self.command, url.path, self.headers.get(fake.key_header))
        try:
            body = self._body()  # read it all first: unread input makes close send a reset
            query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
            reply = fake._route(Request(self.command, url.path, query, self.headers, body))
        except _BodyError as exc:
            reply = fake._error(400, str(exc))
        except Exception as exc:  # a bug in the fake must still answer and be recorded
            reply = fake._error(500, f"{type(exc).__name__}: {exc}")
        fake._record_finish(seq, reply)
        data = json.dumps(reply.body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    do_POST = do_DELETE = do_PUT = do_PATCH = do_GET

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise _BodyError("send a Content-Length, not a chunked body")
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            self.close_connection = True
            raise _BodyError("Content-Length is no number") from None
        if not 0 <= length <= _MAX_BODY:
            self.close_connection = True
            raise _BodyError(f"the body must be 0 to {_MAX_BODY} bytes")
        data = self.rfile.read(length)
        if len(data) != length:  # the client died mid-send: never apply a truncated request
            self.close_connection = True
            raise _BodyError(f"got {len(data)} of {length} bytes")
        return data


class _BodyError(Exception):
    pass
