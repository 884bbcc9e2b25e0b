"""The gateway's HTTP/1.1 server: one asyncio protocol per connection, running an ASGI
application for each request.

Why its own: a journaled request's added latency is the gateway's own budget (its commits
plus a millisecond), and a general server's parsing and per-request machinery took about a
third of it. This one serves exactly what the gateway needs: HTTP/1.1 and 1.0 over TCP,
keep-alive and pipelining, Content-Length and chunked bodies both ways,
``Expect: 100-continue``, and flow control on both directions so memory stays bounded by a
chunk whatever the body's size.

Guarantees:

- A request the server cannot read unambiguously (:mod:`._http1`) is answered with a
  problem document naming what was wrong, the connection closed, and the application never
  called: nothing is forwarded or journaled.
- The application runs to its end even when the client goes away: a journaled request's
  answer is recorded whoever is left to read it (its ``receive`` then says
  ``http.disconnect``, and what it sends is dropped).
- :meth:`Server.serve` stops accepting on its ``stop`` event, closes idle connections, lets
  the requests in flight finish and answer for up to ``grace`` seconds, and only then
  cancels what is left.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import http
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from intentlog.gateway._http1 import BadRequest, ChunkedReader, RequestHead, parse_request_head

__all__ = ["Server"]

log = logging.getLogger("intentlog.gateway")

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
MAX_HEAD = 64 << 10  # a request's line and fields
HIGH_WATER = 256 << 10  # body bytes read ahead of the application before reading pauses
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_NO_BODY = frozenset({204, 304})
_REASONS = {s.value: s.phrase.encode() for s in http.HTTPStatus}


class Server:
    """Serves ``app`` on a listening socket. ``keep_alive``: seconds an idle connection is
    kept open, waiting for its next request's head."""

    def __init__(self, app: App, *, keep_alive: float = 5.0) -> None:
        self.app = app
        self.keep_alive = keep_alive
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self._date = (0, b"")

    async def serve(self, sock: socket.socket, stop: asyncio.Event, grace: float) -> None:
        """Serve until ``stop`` is set, then stop as the module's docstring says."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Connection(self), sock=sock)
        try:
            await stop.wait()
        finally:
            server.close()
            self.stopping = True
            for connection in list(self.connections):
                connection.stop_when_idle()
            if self.tasks:
                await asyncio.wait(set(self.tasks), timeout=grace)
            for task in list(self.tasks):
                task.cancel()
            if self.tasks:
                await asyncio.wait(set(self.tasks))
            for connection in list(self.connections):
                connection.close()
            await server.wait_closed()

    def date(self) -> bytes:
        """The Date header's value, made once a second."""
        now = int(time.time())
        if self._date[0] != now:
            self._date = (now, email.utils.formatdate(now, usegmt=True).encode())
        return self._date[1]


class _Connection(asyncio.Protocol):
    """One client connection: heads read in turn, one request served at a time."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()  # bytes not yet taken by a request (a head, pipelined ones)
        self.request: _Request | None = None
        self.idle: asyncio.TimerHandle | None = None
        self.writable: asyncio.Future[None] | None = None  # set while writing is paused
        self.peer: tuple[str, int] | None = None
        self.local: tuple[str, int] | None = None
        self.loop = asyncio.get_running_loop()

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.peer = _address(transport.get_extra_info("peername"))
        self.local = _address(transport.get_extra_info("sockname"))
        self.server.connections.add(self)
        if self.server.stopping:
            self.close()
            return
        self._wait_idle()

    def data_received(self, data: bytes) -> None:
        if self.request is not None and not self.request.body_done:
            self.request.feed(data)  # a malformed chunk: the request ends; this is dropped
            return
        self.buffer += data
        if self.request is None:
            self._next()
        elif len(self.buffer) > MAX_HEAD and self.transport is not None:
            self.transport.pause_reading()  # pipelined requests wait their turn

    def eof_received(self) -> bool | None:
        return None  # close: a half-closed client sends no further request

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self.idle is not None:
            self.idle.cancel()
        if self.request is not None:
            self.request.disconnected()
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.transport = None

    def pause_writing(self) -> None:
        self.writable = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None

    # -- requests

    def _next(self) -> None:
        """Start the request whose head is in the buffer, once a whole one is."""
        end = self.buffer.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
        if end < 0:
            if len(self.buffer) > MAX_HEAD:
                self._refuse(BadRequest(431, f"the request's head is over {MAX_HEAD} bytes"))
            elif b"\n\n" in self.buffer or b"\n\r\n" in self.buffer:
                self._refuse(BadRequest(400, "a line of the request's head is not ended by CRLF"))
            return
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        raw = bytes(self.buffer[:end])
        del self.buffer[: end + 4]
        try:
            head = parse_request_head(raw)
        except BadRequest as exc:
            self._refuse(exc)
            return
        request = _Request(self, head)
        self.request = request
        rest = bytes(self.buffer)
        self.buffer.clear()
        request.feed(rest)
        if request.broken is not None:  # a chunked body malformed already: nothing is called
            self.request = None
            self._refuse(request.broken)
            return
        task = self.loop.create_task(request.run())
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    def finished(self, request: _Request, reuse: bool) -> None:
        """The answer to ``request`` is written: take the next request, or close."""
        if self.request is not request:
            return
        self.request = None
        if not reuse or self.server.stopping or self.transport is None:
            self.close()
            return
        self.transport.resume_reading()
        if self.buffer:
            self._next()
        if self.request is None and self.transport is not None:
            self._wait_idle()

    def _refuse(self, exc: BadRequest) -> None:
        """Answer a request that cannot be read with a problem naming why, and close."""
        body = json.dumps(
            {
                "type": "https://intentlog.dev/problems/bad-request",
                "title": "The request is not HTTP/1.1 this gateway can read",
                "status": exc.status,
                "detail": f"{exc}; nothing was forwarded or journaled",
            },
            separators=(",", ":"),
        ).encode()
        head = [
            b"HTTP/1.1 %d %s\r\n" % (exc.status, _REASONS.get(exc.status, b"Error")),
            b"content-type: application/problem+json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n",
            b"date: " + self.server.date() + b"\r\n\r\n",
        ]
        self.write(b"".join(head) + body)
        self.close()

    def _wait_idle(self) -> None:
        if self.idle is not None:
            self.idle.cancel()
        self.idle = self.loop.call_later(self.server.keep_alive, self.close)

    def stop_when_idle(self) -> None:
        if self.request is None:
            self.close()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    async def drain(self) -> None:
        if self.writable is not None:
            await self.writable

    def close(self) -> None:
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class _Request:
    """One request: its body fed as it comes, its ASGI ``receive`` and ``send``."""

    def __init__(self, connection: _Connection, head: RequestHead) -> None:
        self.connection = connection
        self.head = head
        self.left = head.length  # body bytes still to come (None: chunked)
        self.chunks = ChunkedReader() if head.length is None else None
        self.body = bytearray()  # body bytes read, not yet received by the application
        self.body_done = head.length == 0
        self.delivered = False  # the application received the whole body
        self.gone = False  # the client went away
        self.broken: BadRequest | None = None  # a malformed chunk cut the body off
        self.waiter: asyncio.Future[None] | None = None
        self.continued = False
        self.started: tuple[int, list[tuple[bytes, bytes]]] | None = None
        self.head_written = False
        self.chunked_answer = False
        self.framed = False  # the answer's end is known to the client (not the close)
        self.answered = False

    # -- the body, as it comes

    def feed(self, data: bytes) -> None:
        """Take body bytes; bytes after the body wait in the connection's buffer."""
        if not data or self.broken is not None:
            return
        if self.chunks is not None:
            try:
                self.body += self.chunks.feed(data)
            except BadRequest as exc:
                # The body is cut off where it went wrong; the connection is not reused.
                self.broken = exc
            else:
                self.body_done = self.chunks.done
                self.connection.buffer += self.chunks.leftover
        else:
            assert self.left is not None
            taken = data[: self.left]
            self.body += taken
            self.left -= len(taken)
            self.body_done = self.left == 0
            if len(taken) < len(data):
                self.connection.buffer += data[len(taken) :]
        transport = self.connection.transport
        if len(self.body) > HIGH_WATER and transport is not None:
            transport.pause_reading()  # resumed as the application receives
        self._wake()

    def disconnected(self) -> None:
        self.gone = True
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    # -- ASGI

    def scope(self) -> dict[str, Any]:
        head = self.head
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": f"1.{head.minor}",
            "method": head.method,
            "scheme": "http",
            "path": head.path,
            "raw_path": head.raw_path,
            "query_string": head.query,
            "root_path": "",
            "headers": head.headers,
            "client": self.connection.peer,
            "server": self.connection.local,
        }

    async def receive(self) -> dict[str, Any]:
        """The body as it came since the last call; once it was given whole, or the client
        went away (or sent a malformed chunk), ``http.disconnect`` when that happens."""
        while True:
            if not self.delivered and (self.body or self.body_done):
                data = bytes(self.body)
                self.body.clear()
                transport = self.connection.transport
                if transport is not None and not self.body_done:
                    transport.resume_reading()
                self.delivered = self.body_done
                return {"type": "http.request", "body": data, "more_body": not self.body_done}
            if self.gone or self.broken is not None:
                return {"type": "http.disconnect"}
            if self.head.expect_continue and not self.continued and not self.head_written:
                self.continued = True  # the client waits for this before it sends the body
                self.connection.write(_CONTINUE)
            self.waiter = self.connection.loop.create_future()
            await self.waiter
            self.waiter = None

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.started is None:
                self.started = (message["status"], list(message.get("headers", ())))
            return
        if kind != "http.response.body" or self.started is None or self.answered:
            return
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        out = b""
        if not self.head_written:
            out = self._head(more, len(body))
            self.head_written = True
        if self.chunked_answer:
            if body:
                out += b"%x\r\n%s\r\n" % (len(body), body)
            if not more:
                out += b"0\r\n\r\n"
        elif self.head.method != "HEAD" and self.started[0] not in _NO_BODY:
            out += body
        self.answered = not more
        if self.gone:
            return  # nobody to read it: the application goes on to its end regardless
        self.connection.write(out)
        if more:
            await self.connection.drain()

    def _head(self, more: bool, size: int) -> bytes:
        """The answer's status line and fields, with its framing and the connection's."""
        assert self.started is not None
        status, given = self.started
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))]
        has_length = False
        for name, value in given:
            has_length = has_length or name.lower() == b"content-length"
            lines.append(name + b": " + value + b"\r\n")
        bodiless = self.head.method == "HEAD" or status in _NO_BODY
        if not has_length and not bodiless:
            if more and self.head.minor == 1:
                self.chunked_answer = True
                lines.append(b"transfer-encoding: chunked\r\n")
            elif not more:
                lines.append(b"content-length: %d\r\n" % size)
                has_length = True
        self.framed = has_length or bodiless or self.chunked_answer
        if not self.keeps():
            lines.append(b"connection: close\r\n")
        lines.append(b"date: " + self.connection.server.date() + b"\r\n\r\n")
        return b"".join(lines)

    def keeps(self) -> bool:
        """Whether the connection may take another request after this answer: the client
        asked to keep it, the body was read whole, the answer's end is framed."""
        return (
            self.head.keep
            and self.body_done
            and self.broken is None
            and not self.gone
            and self.framed
            and not self.connection.server.stopping
        )

    async def run(self) -> None:
        """Run the application for this request; answer 500 if it gave no answer."""
        try:
            await self.connection.server.app(self.scope(), self.receive, self.send)
        except Exception:
            log.exception("the request %s %r failed", self.head.method, self.head.path)
        finally:
            if not self.answered:
                self._failed()
            self.connection.finished(self, reuse=self.keeps())

    def _failed(self) -> None:
        self.framed = False
        if self.head_written or self.gone:
            self.connection.close()  # an answer cut off: the client sees it end short
            return
        body = b"the gateway failed to answer this request; see its log"
        self.started = (500, [(b"content-type", b"text/plain; charset=utf-8")])
        self.head = dataclasses.replace(self.head, keep=False)
        self.connection.write(self._head(False, len(body)) + body)
        self.answered = True


def _address(raw: Any) -> tuple[str, int] | None:
    if isinstance(raw, tuple) and len(raw) >= 2:
        return str(raw[0]), int(raw[1])
    return None
