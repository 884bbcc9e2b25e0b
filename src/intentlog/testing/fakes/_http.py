"""HTTP plumbing for the fake services: a threading server on 127.0.0.1 and its handler.

The handler reads the whole body, records the request's arrival, asks the fake's router for a
`Reply`, records how it was answered, and sends it. The fake is anything with the four methods
the handler calls (see `Routed`).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from email.message import Message
from typing import Any, Protocol, cast

from intentlog.testing._loopback import BodyError, JsonHandler, LoopbackServer

__all__ = ["Reply", "Request", "Routed", "Server"]


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


class _Handler(JsonHandler):
    protocol_version = "HTTP/1.1"

    def answer(self) -> None:
        fake = cast(Server, self.server).fake
        url = urllib.parse.urlsplit(self.path)
        seq = fake._record_begin(self.command, url.path, self.headers.get(fake.key_header))
        try:
            body = self.read_body()
            query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
            reply = fake._route(Request(self.command, url.path, query, self.headers, body))
        except BodyError as exc:
            self.close_connection = True  # the rest of the stream is no request to read
            reply = fake._error(400, str(exc))
        except Exception as exc:  # a bug in the fake must still answer and be recorded
            reply = fake._error(500, f"{type(exc).__name__}: {exc}")
        fake._record_finish(seq, reply)
        self.send_json(reply.status, reply.body, reply.headers)
