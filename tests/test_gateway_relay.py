"""The gateway's upstream client (intentlog.gateway._relay, framed by intentlog.gateway._wire)
on a wire this test writes byte by byte:

- each framing of an answer's body (Content-Length, chunked with extensions and trailers, up
  to the close, none for HEAD/204/304, 1xx passed over) gives the body whole, and the
  connection is reused exactly when the exchange ended cleanly and neither side asked to
  close (an HTTP/1.0 answer, ``Connection: close``, a body up to the close are not);
- gzip and deflate (zlib-wrapped and raw) answers are given decoded, their headers as sent;
- an answer the wire cannot frame without guessing is httpx's RemoteProtocolError, and its
  connection is closed, never reused;
- the request as written: Host, Content-Length, the caller's headers in order, the
  encodings asked for; a request that cannot be written is refused before any byte of it;
- httpx's errors: UnsupportedProtocol and InvalidURL for a URL, ConnectError (that class)
  and ConnectTimeout for a connection never made, ReadTimeout and WriteTimeout after;
- an idle connection is not reused once expired, closed by the server or holding bytes
  nobody asked for (a 408 sent while idle);
- the ``trace`` extension (sync or async) is called once, after the request is written and
  before the answer is read;
- closing: a response closed unread, twice, after the relay closed; the per-origin limit
  (a send waits for a slot) and the idle bound.

The servers are asyncio servers on 127.0.0.1 in the test's own event loop, recording every
connection, the bytes that came on it and the requests read from them; every wait is on
something observed (a request read, an EOF, a flag of the relay's pool polled turn by turn
of the event loop), bounded so that a hang fails the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gzip
import ipaddress
import itertools
import socket
import ssl
import zlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import pytest

from intentlog.gateway import _relay
from intentlog.gateway._relay import Relay, RelayResponse
from intentlog.gateway._wire import (
    Framing,
    Head,
    WireError,
    chunk_size,
    framing,
    parse_head,
    request_bytes,
)

#: In a Server's answers: the server closes the connection there.
CLOSE = "close"
#: The longest one test's event loop may run before the test fails (a bound, not a pause).
BOUND = 10.0
TRACE = "http11.send_request_body.complete"
REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"

Handler = Callable[["Peer"], Awaitable[None]]


def ok(body: bytes = b"ok", *headers: str, status: str = "200 OK") -> bytes:
    """An HTTP/1.1 answer framed by Content-Length."""
    fields = "".join(f"{h}\r\n" for h in headers)
    return (
        f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{fields}\r\n".encode("latin-1") + body
    )


def chunked(*pieces: bytes, headers: str = "", trailers: bytes = b"") -> bytes:
    """An HTTP/1.1 answer in chunks, one per piece."""
    head = f"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n{headers}\r\n".encode("latin-1")
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    return head + body + b"0\r\n" + trailers + b"\r\n"


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


class Peer:
    """One connection the server accepted: the bytes that came on it, the requests read from
    them, whether the relay closed it (``ended``) or this side did (``closed``)."""

    def __init__(
        self, server: Server, number: int, reader: asyncio.StreamReader, writer: Any
    ) -> None:
        self.server, self.number = server, number
        self.reader, self.writer = reader, writer
        self.received = bytearray()
        self.requests: list[bytes] = []
        self.ended = False
        self.closed = False

    async def request(self) -> bytes | None:
        """The next request (its head and its Content-Length body); None once the relay
        closed the connection."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
            self.received += head
            body = await self.reader.readexactly(_content_length(head))
        except asyncio.IncompleteReadError as exc:
            self.received += exc.partial
            self.end()
            return None
        except ConnectionError:
            self.end()
            return None
        self.received += body
        self.requests.append(head + body)
        self.server.requests.append(head + body)
        self.server.changed()
        return head + body

    async def send(self, data: bytes) -> None:
        with contextlib.suppress(ConnectionError):
            self.writer.write(data)
            await self.writer.drain()

    async def until_ended(self) -> bytes:
        """Read up to the relay's close; what came before it."""
        try:
            rest = await self.reader.read()
        except ConnectionError:
            rest = b""
        self.received += rest
        self.end()
        return rest

    def end(self) -> None:
        self.ended = True
        self.server.changed()

    def close(self) -> None:
        self.closed = True
        self.writer.close()
        self.server.changed()


class Server:
    """An HTTP/1.1 server on 127.0.0.1, port 0. By default each request read is given the
    next of ``answers`` (bytes, written as they are), in order across connections; ``CLOSE``
    there closes the connection the last answer went on. ``handler`` replaces that."""

    def __init__(
        self,
        *answers: bytes | str,
        handler: Handler | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.answers: deque[bytes | str] = deque(answers)
        self.handler = handler or self._answer
        self.tls = tls
        self.peers: list[Peer] = []
        self.requests: list[bytes] = []
        self.errors: list[BaseException] = []
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, kind: object, *rest: object) -> None:
        self._server.close()
        await self._server.wait_closed()
        for peer in self.peers:
            peer.writer.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for peer in self.peers:
            with contextlib.suppress(Exception):
                await peer.writer.wait_closed()
        if kind is None:
            assert not self.errors, self.errors

    def changed(self) -> None:
        self._changed.set()

    async def until(self, check: Callable[[], bool]) -> None:
        """Wait (on the server's own progress: a connection, a request, a close) until
        ``check`` holds."""
        while not check():
            self._changed.clear()
            await self._changed.wait()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        peer = Peer(self, len(self.peers), reader, writer)
        self.peers.append(peer)
        self.changed()
        try:
            await self.handler(peer)
        except asyncio.CancelledError:
            # Only the server's own close cancels a handler (one waiting on an event the test
            # never set): not an error. Returning keeps asyncio's stream callback from
            # logging the cancelled task as one.
            return
        except Exception as exc:
            self.errors.append(exc)
        finally:
            peer.close()

    async def _answer(self, peer: Peer) -> None:
        while True:
            if self.answers and self.answers[0] is CLOSE:
                self.answers.popleft()
                return
            if await peer.request() is None:
                return
            answer = self.answers.popleft()
            assert isinstance(answer, bytes), answer
            await peer.send(answer)


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run a test's coroutine in a new event loop; a hang fails it after BOUND seconds."""

    async def bounded() -> None:
        async with asyncio.timeout(BOUND):
            await main

    asyncio.run(bounded())


async def settle(check: Callable[[], bool], what: str, turns: int = 10_000) -> None:
    """Yield to the event loop until ``check`` (the relay's own state) holds; fail after
    ``turns`` turns."""
    for _ in range(turns):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{what}: not after {turns} turns of the event loop")


@contextlib.asynccontextmanager
async def serving(*answers: bytes | str, handler: Handler | None = None) -> AsyncIterator[
    tuple[Server, Relay]
]:  # fmt: skip
    """A server and a relay, both closed at the end."""
    relay = Relay()
    try:
        async with Server(*answers, handler=handler) as server:
            yield server, relay
    finally:
        await relay.aclose()


async def read(response: RelayResponse, into: list[bytes] | None = None) -> bytes:
    """The body, read to its end (each piece also put ``into`` a list, as it comes); the
    response closed whatever happens."""
    got = [] if into is None else into
    try:
        async for chunk in response.aiter_bytes():
            got.append(chunk)
    finally:
        await response.aclose()
    return b"".join(got)


async def exchange(relay: Relay, request: Any, heads: list[RelayResponse]) -> bytes:
    """Send, and read the body; the response, once its head is read, put in ``heads``."""
    response = await relay.send(request)
    heads.append(response)
    return await read(response)


async def fetch(
    relay: Relay, url: str, method: str = "GET", **options: Any
) -> tuple[RelayResponse, bytes]:
    request = relay.build_request(method, url, **options)
    response = await relay.send(request, stream=True)
    return response, await read(response)


def pool_of(relay: Relay, server: Server) -> Any:
    return relay._pools[("http", "127.0.0.1", server.port)]


def head_of(request: bytes) -> list[str]:
    """A request's request line and header lines."""
    return request.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")


# --- bodies, and when the connection is reused ---------------------------------------------


def test_content_length_answer_is_given_whole_and_its_connection_reused() -> None:
    body = bytes(range(256)) * 1024  # more than one read

    async def main() -> None:
        async with serving(ok(body, "Content-Type: application/octet-stream"), ok(b"two")) as (
            server,
            relay,
        ):
            first, got = await fetch(relay, server.url + "/one")
            assert (first.status_code, got) == (200, body)
            assert first.headers.get("content-type") == "application/octet-stream"
            second, got = await fetch(relay, server.url + "/two")
            assert (second.status_code, got) == (200, b"two")
            assert len(server.peers) == 1, "the second request went on a new connection"
            assert [head_of(r)[0] for r in server.peers[0].requests] == [
                "GET /one HTTP/1.1",
                "GET /two HTTP/1.1",
            ]
            assert len(pool_of(relay, server).idle) == 1

    run(main())


def test_chunked_answer_with_extensions_and_trailers_is_reassembled_and_reused() -> None:
    answer = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"
        b"5;name=value\r\nhello\r\n"
        b'1 ; quoted="a;b"\r\n \r\n'
        b"A\r\n0123456789\r\n"
        b"00000000000000a\r\nabcdefghij\r\n"
        b"0;last\r\nX-Checksum: abc\r\nX-Other: 1\r\n\r\n"
    )

    async def main() -> None:
        async with serving(answer, ok(b"after")) as (server, relay):
            response, body = await fetch(relay, server.url + "/chunks")
            assert body == b"hello 0123456789abcdefghij"
            assert response.headers.get("X-Checksum") is None  # trailers are not given back
            # The trailer section was read to its end: the next answer is read whole.
            _, body = await fetch(relay, server.url + "/after")
            assert body == b"after"
            assert len(server.peers) == 1
            assert len(server.requests) == 2

    run(main())


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n", id="no-framing"),
    ],
)
def test_answer_delimited_by_the_close_is_read_to_eof_and_not_reused(head: bytes) -> None:
    async def main() -> None:
        async with serving(head + b"up to " + b"the close" * 1000, CLOSE, ok(b"next")) as (
            server,
            relay,
        ):
            response, body = await fetch(relay, server.url + "/")
            assert (response.status_code, body) == (200, b"up to " + b"the close" * 1000)
            assert pool_of(relay, server).idle == []
            _, body = await fetch(relay, server.url + "/")
            assert body == b"next"
            assert [len(p.requests) for p in server.peers] == [1, 1]

    run(main())


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(ok(b"bye", "Connection: close"), id="connection-close"),
        pytest.param(ok(b"bye", "Connection: keep-alive, CLOSE"), id="close-among-tokens"),
        pytest.param(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nbye", id="http-1.0"),
    ],
)
def test_answer_asking_to_close_or_in_http_1_0_is_not_reused(answer: bytes) -> None:
    """The server keeps the connection open: the relay decides from the answer alone."""

    async def main() -> None:
        async with serving(answer, ok(b"next")) as (server, relay):
            _, body = await fetch(relay, server.url + "/")
            assert body == b"bye"
            await server.until(lambda: server.peers[0].ended)  # the relay closed it
            _, body = await fetch(relay, server.url + "/")
            assert body == b"next"
            assert [len(p.requests) for p in server.peers] == [1, 1]

    run(main())


def test_1xx_answers_before_the_final_one_are_passed_over() -> None:
    answer = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
        + ok(b"final", "X-Final: yes", status="201 Created")
    )

    async def main() -> None:
        async with serving(answer, ok(b"next")) as (server, relay):
            response, body = await fetch(relay, server.url + "/", "POST", content=b"{}")
            assert (response.status_code, body) == (201, b"final")
            assert response.headers.get("x-final") == "yes"
            assert response.headers.get("link") is None
            _, body = await fetch(relay, server.url + "/")
            assert body == b"next"
            assert len(server.peers) == 1

    run(main())


def test_101_switching_protocols_is_a_protocol_error_and_closes() -> None:
    answer = (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
    )

    async def main() -> None:
        async with serving(answer, ok(b"next")) as (server, relay):
            with pytest.raises(httpx.RemoteProtocolError, match="101"):
                await relay.send(relay.build_request("GET", server.url + "/"))
            await server.until(lambda: server.peers[0].ended)
            _, body = await fetch(relay, server.url + "/")
            assert body == b"next"
            assert len(server.peers) == 2

    run(main())


@pytest.mark.parametrize(
    ("method", "answer"),
    [
        pytest.param(
            "HEAD",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\nContent-Type: text/plain\r\n\r\n",
            id="head-with-length",
        ),
        pytest.param(
            "HEAD", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", id="head-chunked"
        ),
        pytest.param("GET", b"HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n", id="204"),
        pytest.param(
            "GET",
            b'HTTP/1.1 304 Not Modified\r\nETag: "v1"\r\nContent-Length: 50\r\n\r\n',
            id="304-with-length",
        ),
    ],
)
def test_answers_without_a_body_read_none_and_reuse_the_connection(
    method: str, answer: bytes
) -> None:
    async def main() -> None:
        async with serving(answer, ok(b"next")) as (server, relay):
            response, body = await fetch(relay, server.url + "/", method)
            assert body == b""
            assert response.status_code == int(answer.split(b" ")[1])
            # Had the relay read a body of 1234 or 50 bytes, it would be waiting on it, or
            # take the next answer's bytes for it.
            _, body = await fetch(relay, server.url + "/")
            assert body == b"next"
            assert len(server.peers) == 1

    run(main())


def test_headers_are_given_as_they_came_with_a_case_insensitive_get() -> None:
    answer = ok(b"{}", "X-Dup: a", "x-dup: b", "Content-Type: application/json", "X-Pad:  v \t")

    async def main() -> None:
        async with serving(answer) as (server, relay):
            response, _ = await fetch(relay, server.url + "/")
            headers = response.headers
            assert headers.get("X-DUP") == "a"
            assert headers.get("x-missing") is None
            assert headers.get("x-missing", "d") == "d"
            assert headers["CONTENT-TYPE"] == "application/json"
            assert "content-type" in headers
            assert "x-missing" not in headers
            assert headers.get("x-pad") == "v"
            assert headers.multi_items() == [
                ("Content-Length", "2"),
                ("X-Dup", "a"),
                ("x-dup", "b"),
                ("Content-Type", "application/json"),
                ("X-Pad", "v"),
            ]

    run(main())


# --- encodings ------------------------------------------------------------------------------

TEXT = b'{"id":"ch_1","amount":500,"note":"' + b"compressible " * 500 + b'"}'


def _raw_deflate(data: bytes) -> bytes:
    encoder = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return encoder.compress(data) + encoder.flush()


@pytest.mark.parametrize(
    ("coding", "encoded", "framed"),
    [
        pytest.param("gzip", gzip.compress(TEXT), "length", id="gzip"),
        pytest.param("x-gzip", gzip.compress(TEXT), "length", id="x-gzip"),
        pytest.param("GZip", gzip.compress(TEXT), "chunks", id="gzip-chunked"),
        pytest.param("deflate", zlib.compress(TEXT), "length", id="deflate-zlib"),
        pytest.param("deflate", zlib.compress(TEXT), "chunks", id="deflate-zlib-chunked"),
        pytest.param("deflate", _raw_deflate(TEXT), "length", id="deflate-raw"),
        pytest.param("deflate", _raw_deflate(TEXT), "chunks", id="deflate-raw-chunked"),
    ],
)
def test_encoded_answers_are_given_decoded_with_their_headers_as_sent(
    coding: str, encoded: bytes, framed: str
) -> None:
    if framed == "length":
        answer = ok(encoded, f"Content-Encoding: {coding}")
    else:  # uneven pieces, each over the first two bytes a decoder may need
        cut = [0, 7, len(encoded) // 2, len(encoded) - 3, len(encoded)]
        pieces = [encoded[a:b] for a, b in itertools.pairwise(cut)]
        answer = chunked(*pieces, headers=f"Content-Encoding: {coding}\r\n")

    async def main() -> None:
        async with serving(answer, ok(b"next")) as (server, relay):
            response, body = await fetch(relay, server.url + "/")
            assert body == TEXT
            assert response.headers.get("content-encoding") == coding
            if framed == "length":
                assert response.headers.get("content-length") == str(len(encoded))
            # The request asked for these encodings.
            assert "Accept-Encoding: gzip, deflate" in head_of(server.requests[0])
            _, body = await fetch(relay, server.url + "/")
            assert body == b"next"
            assert len(server.peers) == 1

    run(main())


def test_an_identity_or_unknown_coding_is_given_as_it_came() -> None:
    async def main() -> None:
        async with serving(ok(b"\x8bbrotli?", "Content-Encoding: br"), ok(b"plain")) as (
            server,
            relay,
        ):
            _, body = await fetch(relay, server.url + "/")
            assert body == b"\x8bbrotli?"
            _, body = await fetch(relay, server.url + "/", headers={"Accept-Encoding": "br"})
            assert body == b"plain"

    run(main())


def test_a_body_that_does_not_decode_is_a_decoding_error_and_closes() -> None:
    async def main() -> None:
        async with serving(ok(b"not gzip at all", "Content-Encoding: gzip"), ok(b"next")) as (
            server,
            relay,
        ):
            response = await relay.send(relay.build_request("GET", server.url + "/"))
            with pytest.raises(httpx.DecodingError):
                await read(response)
            await server.until(lambda: server.peers[0].ended)
            _, body = await fetch(relay, server.url + "/")
            assert body == b"next"
            assert len(server.peers) == 2

    run(main())


def test_raw_deflate_whose_first_chunk_is_one_byte_is_decoded() -> None:
    encoded = _raw_deflate(TEXT)
    answer = chunked(encoded[:1], encoded[1:], headers="Content-Encoding: deflate\r\n")

    async def main() -> None:
        async with serving(answer) as (server, relay):
            _, body = await fetch(relay, server.url + "/")
            assert body == TEXT

    run(main())


# --- answers the wire cannot frame ----------------------------------------------------------

BIG_LINE = b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (101 * 1024) + b"\r\nContent-Length: 0\r\n\r\n"
MANY_LINES = (
    b"HTTP/1.1 200 OK\r\n"
    + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 50) for i in range(2000))
    + b"Content-Length: 0\r\n\r\n"
)


@pytest.mark.parametrize(
    ("answer", "server_closes", "at"),
    [
        pytest.param(b"SSH-2.0-OpenSSH_9.6\r\n\r\n", False, "head", id="not-http"),
        pytest.param(b"HTTP/2 200\r\ncontent-length: 0\r\n\r\n", False, "head", id="http-2"),
        pytest.param(b"HTTP/1.1 2xx OK\r\nContent-Length: 0\r\n\r\n", False, "head", id="status"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nX-A: one\r\n  folded\r\nContent-Length: 2\r\n\r\nok",
            False,
            "head",
            id="folded-line",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nX-A: one\r\n\tfolded\r\nContent-Length: 2\r\n\r\nok",
            False,
            "head",
            id="folded-tab",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nno colon here\r\nContent-Length: 2\r\n\r\nok",
            False,
            "head",
            id="no-colon",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok", False, "head", id="space-in-name"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok!",
            False,
            "head",
            id="two-lengths",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\nok!", False, "head", id="length-list"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok", False, "head", id="length-sign"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: two\r\n\r\nok", False, "head", id="length-word"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
            False,
            "body",
            id="chunk-size-not-hex",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
            False,
            "body",
            id="chunk-size-0x",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXY0\r\n\r\n",
            False,
            "body",
            id="chunk-without-crlf",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nfour", True, "body", id="closed-mid-body"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nhalf",
            True,
            "body",
            id="closed-mid-chunk",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nfour\r\n",
            True,
            "body",
            id="closed-before-last-chunk",
        ),
        pytest.param(b"", True, "head", id="closed-without-answer"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Le", True, "head", id="closed-mid-head"),
        pytest.param(BIG_LINE, False, "head", id="head-line-over-100KiB"),
        pytest.param(MANY_LINES, False, "head", id="head-over-100KiB"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nX-A: one\rtwo\r\nContent-Length: 2\r\n\r\nok",
            False,
            "head",
            id="bare-cr-in-value",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\nok",
            False,
            "head",
            id="te-identity",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            False,
            "head",
            id="te-gzip-chunked",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nX-A: one\x00two\r\nContent-Length: 2\r\n\r\nok",
            False,
            "head",
            id="nul-in-value",
        ),
    ],
)
def test_an_answer_the_wire_cannot_frame_is_a_protocol_error_and_its_connection_closed(
    answer: bytes, server_closes: bool, at: str
) -> None:
    answers = [answer, CLOSE, ok(b"next")] if server_closes else [answer, ok(b"next")]

    async def main() -> None:
        async with serving(*answers) as (server, relay):
            request = relay.build_request("GET", server.url + "/", timeout=5.0)
            heads: list[RelayResponse] = []
            with pytest.raises(httpx.RemoteProtocolError):
                await exchange(relay, request, heads)
            assert bool(heads) is (at == "body")
            assert pool_of(relay, server).idle == []
            if not server_closes:  # the relay closed it
                await server.until(lambda: server.peers[0].ended)
            _, body = await fetch(relay, server.url + "/")
            assert body == b"next"
            assert [len(p.requests) for p in server.peers] == [1, 1]

    run(main())


def test_lines_ended_by_a_bare_lf_are_read_as_lines() -> None:
    # RFC 9112 section 2.2: a recipient may take a bare LF for a line's end (h11 and httpx
    # do); a head so written must not be waited on until the timeout.
    head = b"HTTP/1.1 201 Created\nX-A: one\nX-B: two\nContent-Length: 7\n\ncreated"
    chunked = b"HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n\n2\nok\n0\n\n"

    async def main() -> None:
        async with serving(head, chunked, ok(b"next")) as (server, relay):
            response, body = await fetch(relay, server.url + "/")
            assert (response.status_code, body) == (201, b"created")
            assert response.headers.multi_items() == [
                ("X-A", "one"),
                ("X-B", "two"),
                ("Content-Length", "7"),
            ]
            _, body = await fetch(relay, server.url + "/")
            assert body == b"ok"
            _, body = await fetch(relay, server.url + "/")
            assert body == b"next"
            assert len(server.peers) == 1  # each ended cleanly: one connection for all

    run(main())


@pytest.mark.parametrize(
    ("answer", "fields", "body"),
    [
        # the head ends at the bare-LF blank line, not at the CRLF CRLF in its body
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 8\n\nab\r\n\r\ncd",
            [("Content-Length", "8")],
            b"ab\r\n\r\ncd",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\nab\r\n\r\ncd",
            [("Content-Length", "8")],
            b"ab\r\n\r\ncd",
        ),
        # a status line and no field
        (b"HTTP/1.1 204 No Content\r\n\r\n", [], b""),
        (b"HTTP/1.1 204 No Content\r\n\n", [], b""),
        (
            b"HTTP/1.1 200 OK\r\nX-A: 1\r\nContent-Length: 2\r\n\r\nok",
            [("X-A", "1"), ("Content-Length", "2")],
            b"ok",
        ),
    ],
)
def test_a_head_read_in_one_piece_ends_at_its_own_blank_line(
    answer: bytes, fields: list[tuple[str, str]], body: bytes
) -> None:
    async def main() -> None:
        async with serving(answer) as (server, relay):
            response, got = await fetch(relay, server.url + "/")
            assert (response.headers.multi_items(), got) == (fields, body)

    run(main())


def test_a_repeated_content_length_of_one_value_is_that_value() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\nContent-Length: 2\r\n\r\nok"

    async def main() -> None:
        async with serving(answer) as (server, relay):
            _, body = await fetch(relay, server.url + "/")
            assert body == b"ok"

    run(main())


def test_a_head_under_the_bound_is_read() -> None:
    fields = [f"X-H{i}: {'v' * 50}" for i in range(1400)]  # about 84 KiB

    async def main() -> None:
        async with serving(ok(b"big head", *fields)) as (server, relay):
            response, body = await fetch(relay, server.url + "/")
            assert body == b"big head"
            assert len(response.headers.multi_items()) == 1401

    run(main())


# --- the request as written -----------------------------------------------------------------


def test_the_request_is_written_with_host_length_the_callers_headers_in_order() -> None:
    async def main() -> None:
        async with serving(ok(b"done")) as (server, relay):
            _, body = await fetch(
                relay,
                server.url + "/v1/charges?amount=500&currency=usd#fragment",
                "post",
                content=b'{"a":1}',
                headers=[
                    ("X-First", "1"),
                    ("X-Dup", "a"),
                    ("Content-Type", "application/json"),
                    ("x-dup", "b"),
                    ("Host", "evil.example"),  # the URL's host is sent
                    ("content-length", "999"),  # the body's length is sent
                    ("X-Empty", ""),
                ],
            )
            assert body == b"done"
            assert server.requests == [
                b"POST /v1/charges?amount=500&currency=usd HTTP/1.1\r\n"
                b"Host: 127.0.0.1:%d\r\n"
                b"X-First: 1\r\n"
                b"X-Dup: a\r\n"
                b"Content-Type: application/json\r\n"
                b"x-dup: b\r\n"
                b"X-Empty: \r\n"
                b"Content-Length: 7\r\n"
                b"Accept-Encoding: gzip, deflate\r\n"
                b'\r\n{"a":1}' % server.port
            ]

    run(main())


@pytest.mark.parametrize(
    ("method", "length"),
    [
        ("POST", "0"),
        ("PUT", "0"),
        ("PATCH", "0"),
        ("GET", None),
        ("DELETE", None),
        ("OPTIONS", None),
    ],
)
def test_an_empty_body_has_a_content_length_only_for_post_put_patch(
    method: str, length: str | None
) -> None:
    async def main() -> None:
        async with serving(ok()) as (server, relay):
            await fetch(relay, server.url + "/x", method)
            lines = head_of(server.requests[0])
            assert lines[0] == f"{method} /x HTTP/1.1"
            lengths = [line for line in lines if line.lower().startswith("content-length:")]
            assert lengths == ([] if length is None else [f"Content-Length: {length}"])

    run(main())


def test_the_callers_accept_encoding_is_sent_instead_of_the_relays() -> None:
    async def main() -> None:
        async with serving(ok(b"as is")) as (server, relay):
            await fetch(relay, server.url + "/", headers={"accept-encoding": "identity"})
            encodings = [
                line for line in head_of(server.requests[0]) if "accept-encoding" in line.lower()
            ]
            assert encodings == ["accept-encoding: identity"]

    run(main())


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://example.com/", "example.com"),
        ("http://example.com:80/", "example.com"),
        ("http://EXAMPLE.com:8080/", "example.com:8080"),
        ("https://example.com/", "example.com"),
        ("https://example.com:443/", "example.com"),
        ("https://example.com:80/", "example.com:80"),
        ("http://[::1]/", "[::1]"),
        ("http://[::1]:8080/", "[::1]:8080"),
    ],
)
def test_the_host_header_shows_the_port_only_when_not_the_schemes(url: str, host: str) -> None:
    request = Relay().build_request("GET", url)
    assert request.headers[0] == ("Host", host)
    assert request.target == "/"


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        ("GET", "/", [("X-A", "one\r\nX-Injected: two")]),
        ("GET", "/", [("X-A", "one\ntwo")]),
        ("GET", "/", [("X-A", "one\rtwo")]),
        ("GET", "/", [("X-A", "one\x00two")]),
        ("GET", "/", [("X Bad", "v")]),
        ("GET", "/", [("X-Bad:", "v")]),
        ("GET", "/", [("", "v")]),
        ("GET", "/", [("X-\u6f22", "v")]),
        ("GE T", "/", []),
        ("GET", "/a b", []),
    ],
)
def test_a_request_that_cannot_be_written_is_refused_before_any_byte(
    method: str, path: str, headers: list[tuple[str, str]]
) -> None:
    traced: list[str] = []

    def trace(name: str, info: dict[str, Any]) -> None:
        traced.append(name)

    async def main() -> None:
        async with serving(ok(b"fine")) as (server, relay):
            request = relay.build_request(
                method, server.url + path, headers=headers, extensions={"trace": trace}
            )
            with pytest.raises(httpx.LocalProtocolError):
                await relay.send(request)
            assert traced == []
            # The relay still sends what it can (its slot was given back).
            _, body = await fetch(relay, server.url + "/")
            assert body == b"fine"
            await relay.aclose()
            await server.until(lambda: all(p.ended for p in server.peers))
            assert server.requests[0].startswith(b"GET / HTTP/1.1\r\n")
            assert len(server.requests) == 1
            # Not one byte of the refused request came on any connection.
            assert b"".join(p.received for p in server.peers) == server.requests[0]

    run(main())


# --- URLs, connecting, timeouts -------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("ftp://127.0.0.1/file", httpx.UnsupportedProtocol),
        ("ws://127.0.0.1/", httpx.UnsupportedProtocol),
        ("http:///no-host", httpx.UnsupportedProtocol),
        ("127.0.0.1:8080/x", httpx.UnsupportedProtocol),
        ("/only/a/path", httpx.UnsupportedProtocol),
        ("http://127.0.0.1:99999/", httpx.InvalidURL),
        ("http://127.0.0.1:port/", httpx.InvalidURL),
        ("http://127.0.0.1:-1/", httpx.InvalidURL),
        pytest.param(
            "http://[::1/",
            httpx.InvalidURL,
        ),
    ],
)
def test_a_url_the_relay_cannot_send_to_is_refused(url: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        Relay().build_request("GET", url)


def test_an_explicit_port_0_is_not_taken_for_the_default_port() -> None:
    with pytest.raises(httpx.InvalidURL, match="port 0"):
        Relay().build_request("GET", "http://127.0.0.1:0/")


def test_a_closed_port_is_a_connect_error_and_gives_its_slot_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_relay, "MAX_PER_ORIGIN", 1)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Closed: nothing listens on the port now.

    async def main() -> None:
        relay = Relay()
        try:
            for _ in range(2):  # the second would wait forever on a slot not given back
                with pytest.raises(httpx.ConnectError) as caught:
                    await relay.send(relay.build_request("GET", f"http://127.0.0.1:{port}/"))
                assert type(caught.value) is httpx.ConnectError
        finally:
            await relay.aclose()

    run(main())


def test_a_connect_that_does_not_complete_is_a_connect_timeout() -> None:
    """A listening socket whose accept queue is full (listen(0), never accepting, filled by
    other connections): the kernel drops further SYNs, so a connect waits."""

    async def main() -> None:
        with contextlib.ExitStack() as stack:
            listener = stack.enter_context(socket.socket())
            listener.bind(("127.0.0.1", 0))
            listener.listen(0)
            port = listener.getsockname()[1]
            for _ in range(4):
                filler = stack.enter_context(socket.socket())
                filler.setblocking(False)
                filler.connect_ex(("127.0.0.1", port))
            relay = Relay()
            try:
                request = relay.build_request("GET", f"http://127.0.0.1:{port}/", timeout=0.2)
                with pytest.raises(httpx.ConnectTimeout):
                    await relay.send(request)
            finally:
                await relay.aclose()

    run(main())


def test_a_server_that_never_answers_is_a_read_timeout_and_the_connection_closed() -> None:
    async def silent(peer: Peer) -> None:
        await peer.request()
        await peer.until_ended()  # no answer: waits for the relay's close

    async def main() -> None:
        async with serving(handler=silent) as (server, relay):
            request = relay.build_request("GET", server.url + "/", timeout=0.2)
            with pytest.raises(httpx.ReadTimeout) as caught:
                await relay.send(request)
            assert type(caught.value) is httpx.ReadTimeout
            await server.until(lambda: server.peers[0].ended)
            assert len(server.requests) == 1

    run(main())


def test_a_body_that_stops_coming_is_a_read_timeout_after_what_came() -> None:
    async def stalls(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await peer.until_ended()

    async def main() -> None:
        async with serving(handler=stalls) as (server, relay):
            response = await relay.send(relay.build_request("GET", server.url + "/", timeout=0.2))
            got: list[bytes] = []
            with pytest.raises(httpx.ReadTimeout):
                await read(response, got)
            assert b"".join(got) == b"abc"
            await server.until(lambda: server.peers[0].ended)

    run(main())


BODY = b"x" * (32 << 20)  # more than the kernel's socket buffers hold


def test_a_request_the_server_does_not_read_is_a_write_timeout() -> None:
    gave_up = asyncio.Event()
    traced: list[str] = []

    async def reads_late(peer: Peer) -> None:
        await gave_up.wait()
        await peer.until_ended()

    async def main() -> None:
        async with serving(handler=reads_late) as (server, relay):
            request = relay.build_request(
                "POST",
                server.url + "/",
                content=BODY,
                timeout=0.2,
                extensions={"trace": lambda name, info: traced.append(name)},
            )
            with pytest.raises(httpx.WriteTimeout):
                await relay.send(request)
            assert traced == []  # the request was not all written
            gave_up.set()
            await server.until(lambda: server.peers[0].ended)
            assert pool_of(relay, server).idle == []

    run(main())


def test_a_request_given_up_on_at_a_write_timeout_is_not_sent_on() -> None:
    gave_up = asyncio.Event()

    async def reads_late(peer: Peer) -> None:
        await gave_up.wait()
        await peer.until_ended()

    async def main() -> None:
        async with serving(handler=reads_late) as (server, relay):
            request = relay.build_request("POST", server.url + "/", content=BODY, timeout=0.2)
            with pytest.raises(httpx.WriteTimeout):
                await relay.send(request)
            gave_up.set()
            await server.until(lambda: server.peers[0].ended)
            assert len(server.peers[0].received) < len(BODY)

    run(main())


# --- idle connections -----------------------------------------------------------------------


def test_an_idle_connection_the_server_closed_is_not_reused() -> None:
    async def main() -> None:
        async with serving(ok(b"one"), CLOSE, ok(b"two")) as (server, relay):
            _, body = await fetch(relay, server.url + "/")
            assert body == b"one"
            await server.until(lambda: server.peers[0].closed)
            idle = pool_of(relay, server).idle
            assert len(idle) == 1  # no Connection: close: kept, until the server's FIN comes
            await settle(idle[0].reader.at_eof, "the relay saw the server's close")
            response, body = await fetch(relay, server.url + "/")
            assert (response.status_code, body) == (200, b"two")
            assert [len(p.requests) for p in server.peers] == [1, 1]

    run(main())


def test_an_idle_connection_holding_unasked_bytes_is_not_reused() -> None:
    """The 408 came in the same segment as the first answer: it is in the relay's buffer
    when the connection goes idle."""

    async def main() -> None:
        async with serving(ok(b"first") + REQUEST_TIMEOUT, ok(b"second")) as (server, relay):
            _, body = await fetch(relay, server.url + "/")
            assert body == b"first"
            response, body = await fetch(relay, server.url + "/")
            assert (response.status_code, body) == (200, b"second")
            assert [len(p.requests) for p in server.peers] == [1, 1]
            await server.until(lambda: server.peers[0].ended)  # and the relay closed it

    run(main())


def test_unasked_bytes_arriving_while_idle_make_the_connection_unusable() -> None:
    released = asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.request()
        if peer.number == 0:
            await peer.send(ok(b"first"))
            await released.wait()
            await peer.send(REQUEST_TIMEOUT)  # and the connection left open
            await peer.until_ended()
        else:
            await peer.send(ok(b"second"))
            await peer.until_ended()

    async def main() -> None:
        async with serving(handler=handler) as (server, relay):
            _, body = await fetch(relay, server.url + "/")
            assert body == b"first"
            (conn,) = pool_of(relay, server).idle
            released.set()
            # The only sign the relay has of them: its reader's buffer (as _relay reads it).
            await settle(lambda: bool(conn.reader._buffer), "the 408 reached the relay")
            response, body = await fetch(relay, server.url + "/")
            assert (response.status_code, body) == (200, b"second")
            assert [len(p.requests) for p in server.peers] == [1, 1]
            await server.until(lambda: server.peers[0].ended)

    run(main())


def test_an_idle_connection_past_its_expiry_is_closed_not_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_relay, "IDLE_EXPIRY", 0.0)

    async def main() -> None:
        async with serving(ok(b"one"), ok(b"two")) as (server, relay):
            await fetch(relay, server.url + "/")
            assert len(pool_of(relay, server).idle) == 1
            _, body = await fetch(relay, server.url + "/")
            assert body == b"two"
            assert [len(p.requests) for p in server.peers] == [1, 1]
            await server.until(lambda: server.peers[0].ended)

    run(main())


def test_idle_connections_beyond_max_idle_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_relay, "MAX_IDLE", 1)

    async def main() -> None:
        async with serving(ok(b"a"), ok(b"b"), ok(b"c")) as (server, relay):
            first = await relay.send(relay.build_request("GET", server.url + "/"))
            second = await relay.send(relay.build_request("GET", server.url + "/"))
            assert len(server.peers) == 2  # both in flight at once
            assert {await read(first), await read(second)} == {b"a", b"b"}
            assert len(pool_of(relay, server).idle) == 1
            await server.until(lambda: sum(p.ended for p in server.peers) == 1)
            _, body = await fetch(relay, server.url + "/")
            assert body == b"c"
            assert len(server.peers) == 2
            (kept,) = [p for p in server.peers if not p.ended]
            assert len(kept.requests) == 2

    run(main())


# --- the trace extension --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_trace_is_called_once_after_the_request_is_written_before_the_answer(
    kind: str,
) -> None:
    traced: list[tuple[str, dict[str, Any]]] = []
    marked = asyncio.Event()

    async def answers_after_the_mark(peer: Peer) -> None:
        await peer.request()
        await marked.wait()  # the answer comes only once the trace was called
        await peer.send(b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"answered"))
        await peer.until_ended()

    def sync_trace(name: str, info: dict[str, Any]) -> None:
        traced.append((name, info))
        marked.set()

    async def async_trace(name: str, info: dict[str, Any]) -> None:
        await asyncio.sleep(0)
        sync_trace(name, info)

    server = Server(handler=answers_after_the_mark)

    async def main() -> None:
        relay = Relay()
        try:
            async with server:
                trace = sync_trace if kind == "sync" else async_trace
                request = relay.build_request(
                    "POST", server.url + "/", content=b"{}", extensions={"trace": trace}
                )
                response = await relay.send(request)
                # The answer came only after the mark: so the mark came before it was read.
                assert traced == [(TRACE, {})]
                assert await read(response) == b"answered"
                assert traced == [(TRACE, {})]  # once, the 100 Continue notwithstanding
                assert server.requests == [server.peers[0].received]
        finally:
            await relay.aclose()

    run(main())


def test_a_slow_async_trace_is_not_cancelled_by_the_request_timeout() -> None:
    """The timeout is what is under test: the trace takes longer than it, for real."""
    finished: list[str] = []

    async def slow_mark(name: str, info: dict[str, Any]) -> None:
        await asyncio.sleep(0.25)
        finished.append(name)

    async def main() -> None:
        async with serving(ok(b"answered at once")) as (server, relay):
            request = relay.build_request(
                "GET", server.url + "/", timeout=0.1, extensions={"trace": slow_mark}
            )
            response = await relay.send(request)
            assert await read(response) == b"answered at once"
            assert finished == [TRACE]

    run(main())


# --- closing --------------------------------------------------------------------------------


def test_a_response_closed_before_its_body_is_read_closes_its_connection() -> None:
    async def main() -> None:
        async with serving(ok(b"never read"), ok(b"next")) as (server, relay):
            response = await relay.send(relay.build_request("GET", server.url + "/"))
            assert response.status_code == 200
            await response.aclose()
            assert pool_of(relay, server).idle == []
            await server.until(lambda: server.peers[0].ended)
            _, body = await fetch(relay, server.url + "/")
            assert body == b"next"
            assert len(server.peers) == 2

    run(main())


def test_a_response_closed_twice_gives_its_slot_and_connection_back_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_relay, "MAX_PER_ORIGIN", 1)

    async def main() -> None:
        async with serving(ok(b"one"), ok(b"two")) as (server, relay):
            response = await relay.send(relay.build_request("GET", server.url + "/"))
            assert await read(response) == b"one"
            await response.aclose()
            await response.aclose()
            pool = pool_of(relay, server)
            assert len(pool.idle) == 1  # pooled once, not twice
            second = await relay.send(relay.build_request("GET", server.url + "/"))
            # One slot, taken: had the second aclose given one back too, one would be free.
            assert pool.slots.locked()
            assert await read(second) == b"two"
            assert not pool.slots.locked()
            assert len(server.peers) == 1

    run(main())


def test_closing_the_relay_closes_idle_connections_and_refuses_sends() -> None:
    async def main() -> None:
        async with serving(ok(b"one")) as (server, relay):
            await fetch(relay, server.url + "/")
            await relay.aclose()
            assert pool_of(relay, server).idle == []
            await server.until(lambda: server.peers[0].ended)
            with pytest.raises(httpx.ConnectError) as caught:
                await relay.send(relay.build_request("GET", server.url + "/"))
            assert type(caught.value) is httpx.ConnectError
            await relay.aclose()  # again: harmless
            assert len(server.peers) == 1

    run(main())


def test_a_response_open_when_the_relay_closes_is_read_then_closed_not_pooled() -> None:
    async def main() -> None:
        async with serving(ok(b"still read")) as (server, relay):
            response = await relay.send(relay.build_request("GET", server.url + "/"))
            await relay.aclose()
            assert await read(response) == b"still read"
            assert pool_of(relay, server).idle == []
            await server.until(lambda: server.peers[0].ended)

    run(main())


def test_a_send_cancelled_while_waiting_for_its_answer_gives_its_slot_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_relay, "MAX_PER_ORIGIN", 1)

    async def handler(peer: Peer) -> None:
        await peer.request()
        if peer.number == 0:  # never answered
            await peer.until_ended()
        else:
            await peer.send(ok(b"after"))
            await peer.until_ended()

    async def main() -> None:
        async with serving(handler=handler) as (server, relay):
            waiting = asyncio.create_task(relay.send(relay.build_request("GET", server.url + "/")))
            await server.until(lambda: len(server.requests) == 1)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await server.until(lambda: server.peers[0].ended)  # closed: its answer is owed
            _, body = await fetch(relay, server.url + "/")
            assert body == b"after"
            assert len(server.peers) == 2

    run(main())


@pytest.mark.parametrize("limit", [1, 2])
def test_a_send_beyond_max_per_origin_waits_for_a_slot(
    monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    """With a limit of 1 the second send waits (the server has its one request only) until
    the first response is closed; with 2 (the control) it completes in the same turns."""
    monkeypatch.setattr(_relay, "MAX_PER_ORIGIN", limit)
    turns = 2000

    async def main() -> None:
        async with serving(ok(b"one"), ok(b"two")) as (server, relay):
            first = await relay.send(relay.build_request("GET", server.url + "/"))
            assert pool_of(relay, server).slots.locked() is (limit == 1)
            second = asyncio.create_task(fetch(relay, server.url + "/"))
            for _ in range(turns):
                if second.done():
                    break
                await asyncio.sleep(0)
            if limit == 2:
                assert second.done()
                assert second.result()[1] == b"two"
                assert await read(first) == b"one"
                assert len(server.peers) == 2
                return
            assert not second.done()
            assert len(server.requests) == 1
            assert len(server.peers) == 1
            assert await read(first) == b"one"
            _, body = await second
            assert body == b"two"
            assert len(server.peers) == 1  # the first's connection, given back, was reused

    run(main())


def test_a_bounded_send_waits_no_longer_than_its_timeout_and_an_unbounded_one_not_at_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gateway's journaled requests go through an unbounded relay: one must leave when
    its intent says it does, never after a wait for a slot taken by slow pass-through
    reads; a bounded send that finds no slot in its timeout is httpx's PoolTimeout (nothing
    of it was sent)."""
    monkeypatch.setattr(_relay, "MAX_PER_ORIGIN", 1)

    async def main() -> None:
        async with serving(ok(b"one"), ok(b"two"), ok(b"three")) as (server, bounded):
            first = await bounded.send(bounded.build_request("GET", server.url + "/"))
            with pytest.raises(httpx.PoolTimeout):
                await bounded.send(bounded.build_request("GET", server.url + "/", timeout=0.05))
            assert len(server.requests) == 1  # the one that timed out was never written
            unbounded = Relay(bounded=False)
            try:
                answer = await unbounded.send(unbounded.build_request("POST", server.url + "/"))
                assert await read(answer) == b"two"  # sent at once, beside the held slot
                assert pool_of(unbounded, server).slots is None
            finally:
                await unbounded.aclose()
            assert await read(first) == b"one"

    run(main())


# --- https ----------------------------------------------------------------------------------


def _tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a self-signed certificate for 127.0.0.1, and a client context
    trusting it."""
    pytest.importorskip("cryptography", reason="cryptography makes the test's certificate")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "intentlog relay test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (tmp_path / "cert.pem").write_bytes(pem)
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    client = ssl.create_default_context(cadata=pem.decode("ascii"))
    return server, client


def test_https_verifies_the_certificate_and_reuses_the_connection(tmp_path: Path) -> None:
    server_context, client_context = _tls(tmp_path)

    async def main() -> None:
        async with Server(ok(b"secure"), ok(b"again"), tls=server_context) as server:
            untrusting = Relay()  # the system's trust store: the test's certificate is not in it
            try:
                with pytest.raises(httpx.ConnectError):
                    await untrusting.send(untrusting.build_request("GET", server.url + "/"))
            finally:
                await untrusting.aclose()
            relay = Relay(ssl_context=client_context)
            try:
                _, body = await fetch(relay, server.url + "/s")
                assert body == b"secure"
                _, body = await fetch(relay, server.url + "/s")
                assert body == b"again"
                assert len(server.requests) == 2
                assert f"Host: 127.0.0.1:{server.port}" in head_of(server.requests[0])
                assert len(relay._pools[("https", "127.0.0.1", server.port)].idle) == 1
            finally:
                await relay.aclose()

    run(main())


def test_https_to_a_server_not_speaking_tls_is_a_connect_error() -> None:
    async def plain(peer: Peer) -> None:
        peer.received += await peer.reader.read(1)  # the ClientHello's first byte
        await peer.send(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    async def main() -> None:
        async with serving(handler=plain) as (server, relay):
            url = server.url.replace("http://", "https://") + "/"
            with pytest.raises(httpx.ConnectError) as caught:
                await relay.send(relay.build_request("GET", url, timeout=5.0))
            assert type(caught.value) is httpx.ConnectError
            assert server.requests == []

    run(main())


# --- _wire on its own -----------------------------------------------------------------------


def test_wire_request_bytes_parse_head_framing_and_chunk_size() -> None:
    assert request_bytes("GET", "/x", [("Host", "h"), ("X-A", "\u00e9")], b"") == (
        b"GET /x HTTP/1.1\r\nHost: h\r\nX-A: \xe9\r\n\r\n"
    )
    for method, target in [("get", "/"), ("GET", ""), ("GET", "/a\r\n"), ("G\u00c9T", "/")]:
        with pytest.raises(WireError):
            request_bytes(method, target, [], b"")
    head = parse_head(b"HTTP/1.0 404\r\nA: 1\r\nb:2\r\n\r\n")
    assert head == Head(404, 0, [("A", "1"), ("b", "2")])
    assert head.values("a") == ["1"]
    ok_head = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n")
    assert framing(ok_head, "GET") == Framing(5, False, True)
    assert framing(ok_head, "HEAD") == Framing(0, False, True)
    both = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: Chunked\r\n\r\n")
    assert framing(both, "GET") == Framing(None, True, False)  # chunked, and not reused
    for codings in (b"gzip, chunked", b"chunked, gzip", b"identity"):
        coded = parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: " + codings + b"\r\n\r\n")
        with pytest.raises(WireError, match="transfer coding"):
            framing(coded, "GET")
    lf = parse_head(b"HTTP/1.1 204 No Content\nA: 1\n\n")
    assert lf == Head(204, 1, [("A", "1")])
    assert chunk_size(b"1f;ext=1\r\n") == 31
    assert chunk_size(b"FFFFFFFFFFFFFFFF\r\n") == 2**64 - 1
    for line in [b"\r\n", b"-1\r\n", b"1 2\r\n", b"1" * 17 + b"\r\n", b"\xef\xbc\x91\r\n"]:
        with pytest.raises(WireError):
            chunk_size(line)
