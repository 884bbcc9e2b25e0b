"""The gateway's upstream client: HTTP/1.1 over asyncio streams (framed by
:mod:`intentlog.gateway._wire`), with a pool of kept-alive connections per origin.

Why not httpx, which the HTTP effect uses: a request through httpx's AsyncClient cost about
470 µs of CPU on this path, against well under 100 µs here, and the gateway pays it on every
request it forwards (issue 36's added-latency targets are 0.5 ms for a pass-through). This
client does only what the gateway asks: one request at a time per connection, no redirects,
no cookies, no proxies from the environment, no HTTP/2.

It speaks the subset of httpx's interface the gateway and the HTTP effect's async runner use
(``build_request``, ``send(request, stream=True)``, a response's ``status_code``, ``headers``,
``aiter_bytes`` and ``aclose``), and raises httpx's exceptions (``ConnectError``,
``ConnectTimeout``, ``ReadTimeout``, ``RemoteProtocolError``, ...), so that what the runner
and the gateway decide from a failure is unchanged: a connection never made is known as
such; anything after it is ambiguous.

Guarantees:

- a connection is reused only after its exchange ended cleanly (the request written, the
  answer read to the end its framing gives, neither side asking to close), and never once
  it has been idle for :data:`IDLE_EXPIRY` seconds or the server has closed it or sent
  anything unasked while it was idle;
- the ``trace`` extension is called with ``http11.send_request_body.complete`` once the
  whole request is written to the socket (the HTTP effect's ``after_send`` mark), as httpcore
  does;
- a ``timeout`` bounds the connect, the request's writing, its answer's head, and each read
  of the body (httpx bounds each wait alike); None waits. The trace is not bounded;
- a request that cannot be written (a CR or LF in a header, a bad name) is refused before
  any connection is taken, and a connection dropped is aborted: nothing buffered for it is
  sent later;
- an answer in ``gzip`` or ``deflate`` is given decoded (those are the encodings asked for);
  its headers are given as they came;
- an answer the wire cannot frame without guessing (see :mod:`intentlog.gateway._wire`) is
  a RemoteProtocolError, and its connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import urllib.parse
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from intentlog.gateway._wire import (
    Framing,
    Head,
    WireError,
    chunk_size,
    framing,
    parse_head,
    request_bytes,
)

__all__ = ["IDLE_EXPIRY", "Relay", "RelayResponse"]

#: Seconds an idle connection is kept. Below the 5 s keep-alive timeout of uvicorn and of
#: Node's http server, so that the gateway does not reuse a connection the server is closing
#: at that moment (a request written into a closing connection is lost, and ambiguous).
IDLE_EXPIRY = 4.0
#: Requests in flight to one origin at once; more wait for one to end (httpx's default).
MAX_PER_ORIGIN = 100
#: Idle connections kept per origin.
MAX_IDLE = 20
_READ = 65536
#: The largest answer head read (httpcore's bound).
_MAX_HEAD = 100 * 1024
_ASKED_ENCODINGS = "gzip, deflate"
#: Methods whose request carries a Content-Length even when empty (as httpx sends them).
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

T = TypeVar("T")
Origin = tuple[str, str, int]


class _Headers:
    """An answer's headers as they came: ``get`` is case-insensitive (the first value),
    ``multi_items`` gives every field in order."""

    __slots__ = ("_first", "_items")

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self._items = items
        self._first: dict[str, str] = {}
        for name, value in items:
            self._first.setdefault(name.lower(), value)

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._first.get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return self._first[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._first

    def multi_items(self) -> list[tuple[str, str]]:
        return list(self._items)


@dataclass(slots=True)
class RelayRequest:
    """A request made by :meth:`Relay.build_request`, ready to send."""

    method: str
    origin: Origin
    target: str
    headers: list[tuple[str, str]]
    content: bytes
    timeout: float | None
    trace: Callable[[str, dict[str, Any]], Awaitable[None] | None] | None


class _Connection:
    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.idle_since = 0.0

    def reusable(self, now: float) -> bool:
        """Whether an idle connection can take a request: not expired, not closed by the
        server, nothing unasked waiting on it."""
        return (
            now - self.idle_since < IDLE_EXPIRY
            and not self.writer.is_closing()
            and not self.reader.at_eof()
            and self.reader.exception() is None
            # Bytes nobody asked for (a 408 sent before a close, say) would be read as the
            # next request's answer. asyncio reads eagerly, so they would be in its buffer.
            and not getattr(self.reader, "_buffer", b"")
        )

    def close(self) -> None:
        """Drop the connection at once: what is still buffered to be written is discarded
        (a request whose writing timed out is not finished behind the caller's back)."""
        with contextlib.suppress(Exception):
            self.writer.transport.abort()


class _Pool:
    __slots__ = ("idle", "slots")

    def __init__(self, bounded: bool) -> None:
        self.idle: list[_Connection] = []
        self.slots = asyncio.Semaphore(MAX_PER_ORIGIN) if bounded else None

    async def take(self, timeout: float | None) -> None:
        """A slot for a request, waiting at most ``timeout`` (httpx's PoolTimeout)."""
        if self.slots is None:
            return
        try:
            await _within(timeout, self.slots.acquire())
        except TimeoutError:
            raise httpx.PoolTimeout("no connection to the upstream was free in time") from None

    def give(self) -> None:
        if self.slots is not None:
            self.slots.release()


class Relay:
    """See the module's docstring. One per gateway; closed with :meth:`aclose`."""

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None, bounded: bool = True) -> None:
        """``bounded``: at most :data:`MAX_PER_ORIGIN` requests in flight per origin, the
        others waiting (up to their timeout) for one to end. The gateway's journaled requests
        use an unbounded relay: a journaled request must leave when its intent says it does
        (the in-flight window is counted from there), never after a wait for a slot."""
        self._pools: dict[Origin, _Pool] = {}
        self._ssl = ssl_context
        self._bounded = bounded
        self._closed = False

    def build_request(
        self,
        method: str,
        url: str,
        *,
        content: bytes | None = None,
        headers: Any = None,
        timeout: float | None = None,
        extensions: dict[str, Any] | None = None,
    ) -> RelayRequest:
        """The request, its URL checked (``http`` or ``https``, a host) and its framing
        headers set: Host from the URL, Content-Length from the body."""
        try:
            parts = urllib.parse.urlsplit(url)
            stated = parts.port
        except ValueError as exc:
            raise httpx.InvalidURL(str(exc)) from None
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise httpx.UnsupportedProtocol(f"cannot send to {scheme or 'no'} URL")
        if stated == 0:
            raise httpx.InvalidURL("port 0 is no port to send to")
        port = stated or (443 if scheme == "https" else 80)
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        default_port = port == (443 if scheme == "https" else 80)
        given = list(headers.items() if isinstance(headers, dict) else headers or ())
        names = {n.lower() for n, _ in given}
        framed = [(n, v) for n, v in given if n.lower() not in ("host", "content-length")]
        framed.insert(0, ("Host", shown if default_port else f"{shown}:{port}"))
        body = content or b""
        if body or method.upper() in _BODY_METHODS:
            framed.append(("Content-Length", str(len(body))))
        if "accept-encoding" not in names:
            framed.append(("Accept-Encoding", _ASKED_ENCODINGS))
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        trace = (extensions or {}).get("trace")
        return RelayRequest(
            method.upper(), (scheme, host, port), target, framed, body, timeout, trace
        )

    async def send(self, request: RelayRequest, *, stream: bool = True) -> RelayResponse:
        """Send the request and read its answer's head; the body is read by the response
        (``stream`` is accepted for httpx's signature: the body is always streamed)."""
        if self._closed:
            raise httpx.ConnectError("the gateway's upstream client is closed")
        try:  # before any connection is taken: a request that cannot be written is not sent
            data = request_bytes(request.method, request.target, request.headers, request.content)
        except WireError as exc:
            raise httpx.LocalProtocolError(str(exc)) from exc
        pool = self._pools.get(request.origin)
        if pool is None:
            pool = self._pools[request.origin] = _Pool(self._bounded)
        await pool.take(request.timeout)
        try:
            conn = self._idle(pool) or await self._connect(request)
            try:
                head = await self._exchange(conn, request, data)
                return RelayResponse(self, pool, conn, request, head)
            except BaseException:
                conn.close()
                raise
        except BaseException:
            pool.give()
            raise

    async def aclose(self) -> None:
        """Close every idle connection; a response still open closes its own."""
        self._closed = True
        for pool in self._pools.values():
            for conn in pool.idle:
                conn.close()
            pool.idle.clear()

    def _idle(self, pool: _Pool) -> _Connection | None:
        now = time.monotonic()
        while pool.idle:
            conn = pool.idle.pop()  # the most recently used: the likeliest to be alive
            if conn.reusable(now):
                return conn
            conn.close()
        return None

    def _release(self, pool: _Pool, conn: _Connection, *, keep: bool) -> None:
        pool.give()
        if keep and not self._closed and len(pool.idle) < MAX_IDLE:
            conn.idle_since = time.monotonic()
            pool.idle.append(conn)
        else:
            conn.close()

    async def _connect(self, request: RelayRequest) -> _Connection:
        scheme, host, port = request.origin
        context: ssl.SSLContext | None = None
        if scheme == "https":
            context = self._ssl or _default_ssl()
        try:
            reader, writer = await _within(
                request.timeout,
                asyncio.open_connection(
                    host, port, ssl=context, server_hostname=host if context else None,
                    limit=_MAX_HEAD,
                ),
            )  # fmt: skip
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        return _Connection(reader, writer)

    async def _exchange(self, conn: _Connection, request: RelayRequest, data: bytes) -> Head:
        """Write the request, then read up to the answer's head (1xx answers passed over)."""
        conn.writer.write(data)
        if conn.writer.transport.get_write_buffer_size():  # not all taken by the socket yet
            try:
                await _within(request.timeout, conn.writer.drain())
            except TimeoutError:
                raise httpx.WriteTimeout("writing the request timed out") from None
            except OSError as exc:
                raise httpx.WriteError(str(exc) or type(exc).__name__) from exc
        if request.trace is not None:
            # Outside the request's deadline: the trace is the journal's (its after_send
            # mark), which must not be cut short by a slow answer, nor count against it.
            awaited = request.trace("http11.send_request_body.complete", {})
            if awaited is not None:
                await awaited
        # One deadline for the whole head (a timer per read would cost more than the read).
        try:
            async with (
                contextlib.nullcontext()
                if request.timeout is None
                else asyncio.timeout(request.timeout)
            ):
                while True:
                    raw = await _head(conn)
                    try:
                        head = parse_head(raw)
                    except WireError as exc:
                        raise httpx.RemoteProtocolError(str(exc)) from exc
                    if not 100 <= head.status < 200:
                        return head
                    if head.status == 101:
                        raise httpx.RemoteProtocolError("the server switched protocols (101)")
        except TimeoutError:
            raise httpx.ReadTimeout("reading the answer timed out") from None


class RelayResponse:
    """An answer whose head is read; its body is read by :meth:`aiter_bytes`. Close it
    (:meth:`aclose`) whatever happens: its connection goes back to the pool only when the
    exchange ended cleanly."""

    def __init__(
        self, relay: Relay, pool: _Pool, conn: _Connection, request: RelayRequest, head: Head
    ) -> None:
        self._relay, self._pool, self._conn, self._request = relay, pool, conn, request
        self.status_code = head.status
        self.headers = _Headers(head.headers)
        try:
            self._framing: Framing = framing(head, request.method)
        except WireError as exc:
            raise httpx.RemoteProtocolError(str(exc)) from exc
        self._done = False  # the body was read to its end
        self._released = False

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body as it comes, decoded from gzip or deflate."""
        decoder = _decoder(self.headers.get("content-encoding"))
        async for chunk in self._raw():
            if decoder is not None:
                try:
                    chunk = decoder.decompress(chunk)
                except zlib.error as exc:
                    raise httpx.DecodingError(f"the answer's body: {exc}") from exc
            if chunk:
                yield chunk
        if decoder is not None:
            rest = decoder.flush()
            if rest:
                yield rest

    async def _raw(self) -> AsyncIterator[bytes]:
        conn, timeout, frame = self._conn, self._request.timeout, self._framing
        if frame.chunked:
            while True:
                line = await _read(conn, timeout, b"\n")
                try:
                    size = chunk_size(line)
                except WireError as exc:
                    raise httpx.RemoteProtocolError(str(exc)) from exc
                if size == 0:
                    while await _read(conn, timeout, b"\n") not in _BLANK:
                        pass  # trailer fields: not given back
                    break
                yield await _exactly(conn, timeout, size)
                if await _read(conn, timeout, b"\n") not in _BLANK:
                    raise httpx.RemoteProtocolError("a chunk did not end with CRLF")
        elif frame.length is not None:
            left = frame.length
            while left:
                chunk = await _some(conn, timeout, min(left, _READ))
                if not chunk:
                    raise httpx.RemoteProtocolError(
                        f"the server closed the connection {left} bytes before the body's end"
                    )
                left -= len(chunk)
                yield chunk
        else:
            while chunk := await _some(conn, timeout, _READ):
                yield chunk
        self._done = True

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        keep = self._done and self._framing.keep
        self._relay._release(self._pool, self._conn, keep=keep)


async def _read(
    conn: _Connection, timeout: float | None, end: bytes, *, head: bool = False
) -> bytes:
    """Bytes up to and with ``end``; a head over :data:`_MAX_HEAD` bytes, or a connection
    closed before ``end``, is httpx's RemoteProtocolError."""
    try:
        return await _within(timeout, conn.reader.readuntil(end))
    except TimeoutError:
        raise httpx.ReadTimeout("reading the answer timed out") from None
    except asyncio.LimitOverrunError:
        raise httpx.RemoteProtocolError(f"an answer line over {_MAX_HEAD} bytes") from None
    except asyncio.IncompleteReadError as exc:
        what = "without an answer" if head and not exc.partial else "in the middle of an answer"
        raise httpx.RemoteProtocolError(f"the server closed the connection {what}") from None
    except OSError as exc:
        raise httpx.ReadError(str(exc) or type(exc).__name__) from exc


#: A line that ends a head, a trailer section or a chunk: CRLF, or a bare LF (RFC 9112 2.2).
_BLANK = (b"\r\n", b"\n")


async def _head(conn: _Connection) -> bytes:
    """An answer's head, line by line up to its blank line (a line may end with a bare LF);
    over :data:`_MAX_HEAD` bytes in all is a RemoteProtocolError."""
    lines: list[bytes] = []
    size = 0
    while True:
        if lines and (whole := _rest_of_head(conn, size)) is not None:
            # Already read: no wait, and no timer to arm.
            rest = await conn.reader.readexactly(whole[0])
            return b"".join(lines) + rest[: whole[1]]
        line = await _read(conn, None, b"\n", head=not lines)
        size += len(line)
        if size > _MAX_HEAD:
            raise httpx.RemoteProtocolError(f"an answer head over {_MAX_HEAD} bytes")
        if line in _BLANK:
            if lines:
                return b"".join(lines)
            continue  # blank lines before the status line are passed over (RFC 9112 2.2)
        lines.append(line)


def _rest_of_head(conn: _Connection, size: int) -> tuple[int, int] | None:
    """How many bytes of the stream's buffer are the rest of a head whose end is already
    read (its fields and the blank line), to be taken in one piece, and how many of them are
    its fields; None to go on line by line: the end is not here yet, a line ends with a bare
    LF, or the head would be over :data:`_MAX_HEAD`."""
    buffered = getattr(conn.reader, "_buffer", None)
    if not isinstance(buffered, bytearray) or not buffered:
        return None
    for blank in _BLANK:  # no more fields: the blank line comes next
        if buffered.startswith(blank):
            return len(blank), 0
    end = buffered.find(b"\r\n\r\n", 0, _MAX_HEAD)
    if end < 0 or size + end + 4 > _MAX_HEAD or b"\n\n" in buffered[:end]:
        return None
    if buffered.find(b"\n\r\n", 0, end + 4) != end + 1:
        return None  # a blank line (after a bare LF) before it: that one ends the head
    return end + 4, end + 2


async def _exactly(conn: _Connection, timeout: float | None, size: int) -> bytes:
    try:
        return await _within(timeout, conn.reader.readexactly(size))
    except TimeoutError:
        raise httpx.ReadTimeout("reading the answer timed out") from None
    except asyncio.IncompleteReadError:
        raise httpx.RemoteProtocolError("the server closed the connection in a chunk") from None
    except OSError as exc:
        raise httpx.ReadError(str(exc) or type(exc).__name__) from exc


async def _some(conn: _Connection, timeout: float | None, size: int) -> bytes:
    if getattr(conn.reader, "_buffer", None):
        timeout = None  # the bytes are here already: no wait to bound, and no timer to arm
    try:
        return await _within(timeout, conn.reader.read(size))
    except TimeoutError:
        raise httpx.ReadTimeout("reading the answer timed out") from None
    except OSError as exc:
        raise httpx.ReadError(str(exc) or type(exc).__name__) from exc


async def _within(timeout: float | None, awaitable: Awaitable[T]) -> T:
    if timeout is None:
        return await awaitable
    async with asyncio.timeout(timeout):
        return await awaitable


class _Deflate:
    """``deflate`` as servers send it: zlib-wrapped as RFC 9110 says, or raw (as some do);
    the first chunk tells which (httpx reads it the same way)."""

    def __init__(self) -> None:
        self._start = b""  # the first bytes, until two are here: zlib's header is two
        self._z: Any = None

    def decompress(self, data: bytes) -> bytes:
        if self._z is None:
            self._start += data
            if len(self._start) < 2:
                return b""
            data, self._start = self._start, b""
            self._z = zlib.decompressobj()
            try:
                return bytes(self._z.decompress(data))
            except zlib.error:
                self._z = zlib.decompressobj(-zlib.MAX_WBITS)
        return bytes(self._z.decompress(data))

    def flush(self) -> bytes:
        if self._z is None:  # fewer than two bytes in all: raw deflate, or nothing
            if not self._start:
                return b""
            return zlib.decompressobj(-zlib.MAX_WBITS).decompress(self._start)
        return bytes(self._z.flush())


def _decoder(encoding: str | None) -> Any:
    coding = (encoding or "").strip().lower()
    if coding in ("gzip", "x-gzip"):
        return zlib.decompressobj(zlib.MAX_WBITS | 16)
    if coding == "deflate":
        return _Deflate()
    return None  # identity, or a coding not asked for: given as it came


_SSL: ssl.SSLContext | None = None


def _default_ssl() -> ssl.SSLContext:
    """The system's trust store, with certifi's bundle where it is installed (as httpx
    verifies), made once."""
    global _SSL
    if _SSL is None:
        context = ssl.create_default_context()
        with contextlib.suppress(ImportError):
            import certifi

            context.load_verify_locations(certifi.where())
        _SSL = context
    return _SSL
