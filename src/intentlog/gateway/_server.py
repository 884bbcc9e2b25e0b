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
- Memory and time are bounded per connection: a head by 64 KiB, pipelined requests by as
  much (reading pauses), a body by what the application has not yet received (256 KiB, then
  reading pauses), an answer by what the socket takes (the application's ``send`` waits). A
  client that sends no byte of a body it announced for 30 s, or reads nothing of its answer
  for 30 s, is cut off; an idle connection is closed after ``keep_alive`` seconds; beyond
  ``max_connections`` a new connection is closed at once.
- A connection closed with bytes of a request unread (a refusal, an answer given before the
  body was read) is half-closed first and its remaining bytes read and dropped for up to
  2 s, so that the answer is not lost to a reset.
- A client that half-closes once its request is sent still gets its answer.
- :meth:`Server.serve` stops accepting on its ``stop`` event, closes idle connections, lets
  the requests in flight finish and answer for up to ``grace`` seconds, cancels what is
  left, and waits (up to 5 s) for the answers written to reach their sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.utils
import http
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from intentlog.gateway._answers import problem
from intentlog.gateway._http1 import BadRequest, ChunkedReader, RequestHead, parse_request_head

__all__ = ["Server"]

log = logging.getLogger("intentlog.gateway")

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
MAX_HEAD = 64 << 10  # a request's line and fields; also pipelined bytes read ahead
HIGH_WATER = 256 << 10  # body bytes read ahead of the application before reading pauses
BODY_TIMEOUT = 30.0  # seconds a body announced may go without a byte
WRITE_TIMEOUT = 30.0  # seconds an answer may wait for the client to read
LINGER = 2.0  # seconds a closing connection's unread request bytes are read and dropped
FLUSH = 5.0  # seconds a stop waits for the answers written to reach their sockets
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_NO_BODY = frozenset({204, 304})
_REASONS = {s.value: s.phrase.encode() for s in http.HTTPStatus}


class Server:
    """Serves ``app`` on a listening socket. ``keep_alive``: seconds an idle connection is
    kept open, waiting for its next request's head; ``max_connections``: open at once."""

    def __init__(self, app: App, *, keep_alive: float = 5.0, max_connections: int = 2048) -> None:
        self.app = app
        self.keep_alive = keep_alive
        self.max_connections = max_connections
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self.flushed = asyncio.Event()  # set once stopping and every connection is gone
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
            if not self.connections:
                self.flushed.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.flushed.wait(), FLUSH)
            await server.wait_closed()

    def gone(self, connection: _Connection) -> None:
        """``connection`` closed; once stopping, the last one sets :attr:`flushed`."""
        self.connections.discard(connection)
        if self.stopping and not self.connections:
            self.flushed.set()

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
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()  # bytes not yet taken by a request (a head, pipelined ones)
        self.request: _Request | None = None
        self.timer: asyncio.TimerHandle | None = None  # the idle or the linger deadline
        self.writable: asyncio.Future[None] | None = None  # set while writing is paused
        self.lingering = False  # half-closed: what comes is dropped until the close
        self.peer: tuple[str, int] | None = None
        self.local: tuple[str, int] | None = None

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.peer = _address(transport.get_extra_info("peername"))
        self.local = _address(transport.get_extra_info("sockname"))
        self.server.connections.add(self)
        if self.server.stopping or len(self.server.connections) > self.server.max_connections:
            self.close()
            return
        self._wait_idle()

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return
        request = self.request
        if request is not None and not request.body_done and request.broken is None:
            request.feed(data)
            return
        self.buffer += data
        if request is None:
            self._next()
        elif len(self.buffer) > MAX_HEAD and self.transport is not None:
            self.transport.pause_reading()  # pipelined requests wait their turn

    def eof_received(self) -> bool | None:
        request = self.request
        if request is not None and request.body_done and not self.lingering:
            # Half-closed once the request was sent (as some clients do): it is answered,
            # then the connection is closed.
            request.head = dataclasses.replace(request.head, keep=False)
            return True
        return None  # else the connection is closed: a request cut off is a disconnect

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.request is not None:
            self.request.disconnected()
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.transport = None
        self.server.gone(self)

    def pause_writing(self) -> None:
        self.writable = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None

    # -- requests

    def _next(self) -> None:
        """Start the request whose head is in the buffer, once a whole one is."""
        buffer = self.buffer
        while buffer.startswith(b"\r\n"):
            del buffer[:2]  # empty lines before a request line (RFC 9112 section 2.2)
        if not buffer:
            return
        end = buffer.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
        if end < 0:
            if len(buffer) > MAX_HEAD:
                self._refuse(BadRequest(431, f"the request's head is over {MAX_HEAD} bytes"))
            elif b"\n\n" in buffer or b"\n\r\n" in buffer:
                self._refuse(BadRequest(400, "a line of the request's head is not ended by CRLF"))
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        raw = bytes(buffer[:end])
        del buffer[: end + 4]
        try:
            head = parse_request_head(raw)
        except BadRequest as exc:
            self._refuse(exc)
            return
        request = _Request(self, head)
        self.request = request
        rest = bytes(buffer)
        buffer.clear()
        request.feed(rest)
        if request.broken is not None:  # a chunked body malformed already: nothing is called
            self.request = None
            self._refuse(request.broken)
            return
        if not request.body_done:
            request.watch_body()
        task = self.loop.create_task(request.run())
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    def finished(self, request: _Request, reuse: bool) -> None:
        """The answer to ``request`` is written: take the next request, or close."""
        if self.request is not request:
            return
        self.request = None
        if not reuse or self.server.stopping or self.transport is None:
            self.close(linger=not request.body_done or bool(self.buffer))
            return
        self.transport.resume_reading()
        if self.buffer:
            self._next()
        if self.request is None and self.transport is not None and not self.lingering:
            self._wait_idle()

    def _refuse(self, exc: BadRequest) -> None:
        """Answer a request that cannot be read with a problem naming why, and close."""
        # The gateway's own problem document, as every other refusal of it.
        body = problem(exc.status, "bad-request", f"{exc}; nothing was forwarded or journaled").body
        head = [
            b"HTTP/1.1 %d %s\r\n" % (exc.status, _REASONS.get(exc.status, b"")),
            b"content-type: application/problem+json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n",
            b"date: " + self.server.date() + b"\r\n\r\n",
        ]
        self.write(b"".join(head) + body)
        self.close(linger=True)

    def _wait_idle(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(self.server.keep_alive, self.close)

    def stop_when_idle(self) -> None:
        if self.request is None:
            self.close()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the socket takes no more; cut a client off that reads nothing of its
        answer for :data:`WRITE_TIMEOUT` seconds (it would hold a task and an upstream
        connection for as long as it likes)."""
        writable = self.writable
        if writable is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(writable), WRITE_TIMEOUT)
        except TimeoutError:
            if self.transport is not None:
                self.transport.abort()

    def close(self, *, linger: bool = False) -> None:
        """Close; with ``linger``, half-close first and drop what still comes for up to
        :data:`LINGER` seconds (a close with bytes unread is a reset, which can destroy the
        answer in the client's buffers before it reads it)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        transport = self.transport
        if transport is None or transport.is_closing() or self.lingering:
            return
        if linger and transport.can_write_eof():
            self.lingering = True
            self.buffer.clear()
            transport.write_eof()
            transport.resume_reading()
            self.timer = self.loop.call_later(LINGER, transport.close)
            return
        transport.close()


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
        self.broken: BadRequest | None = None  # a malformed or stalled body cut off
        self.waiter: asyncio.Future[None] | None = None
        self.watch: asyncio.TimerHandle | None = None  # the body's deadline
        self.last_byte = 0.0
        self.continued = False
        self.started: tuple[int, list[tuple[bytes, bytes]]] | None = None
        self.head_written = False
        self.said_keep = False  # the answer's head did not say "connection: close"
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
        if self.watch is not None:
            self.last_byte = self.connection.loop.time()
        transport = self.connection.transport
        if len(self.body) > HIGH_WATER and transport is not None:
            transport.pause_reading()  # resumed as the application receives
        self._wake()

    def watch_body(self) -> None:
        """Cut the body off once no byte of it came for :data:`BODY_TIMEOUT` seconds."""
        self.last_byte = self.connection.loop.time()
        self.watch = self.connection.loop.call_later(BODY_TIMEOUT, self._check_body)

    def _check_body(self) -> None:
        self.watch = None
        if self.body_done or self.broken is not None or self.gone:
            return
        quiet = self.connection.loop.time() - self.last_byte
        if quiet < BODY_TIMEOUT:
            self.watch = self.connection.loop.call_later(BODY_TIMEOUT - quiet, self._check_body)
            return
        self.broken = BadRequest(408, f"no byte of the body came for {BODY_TIMEOUT:.0f} s")
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
        """The body as it came since the last call; once it was given whole, the answer
        sent, or the client gone (or its body broken off), ``http.disconnect``."""
        while True:
            if not self.delivered and (self.body or self.body_done):
                data = bytes(self.body)
                self.body.clear()
                transport = self.connection.transport
                if transport is not None and not self.body_done:
                    transport.resume_reading()
                self.delivered = self.body_done
                return {"type": "http.request", "body": data, "more_body": not self.body_done}
            if self.gone or self.broken is not None or self.answered:
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
        if self.connection.writable is not None:
            await self.connection.drain()  # pipelined answers wait as a streamed one does

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
        self.said_keep = self.keeps()
        if not self.said_keep:
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
            if self.watch is not None:
                self.watch.cancel()
            if not self.answered:
                self._failed()
            self.connection.finished(self, reuse=self.said_keep and self.keeps())

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
