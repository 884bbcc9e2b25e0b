"""The gateway's own HTTP/1.1 server: what it reads (and refuses to read), keep-alive,
pipelining, chunked bodies both ways, ``Expect: 100-continue``, HTTP/1.0, idle connections.

The parser is checked directly, a chunked body fed byte by byte as well as whole; the rest
runs a real ``intentlog gateway`` process in front of a recording upstream on 127.0.0.1,
spoken to over raw sockets so that the bytes are exactly the test's."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from tests.support.gateway_support import (
    Children,
    Gateway,
    RecordingUpstream,
    route,
    run_cli,
    write_routes,
)

from intentlog.gateway import _server
from intentlog.gateway._http1 import BadRequest, ChunkedReader, parse_request_head

# -- the parser -------------------------------------------------------------------------------


def test_a_request_head_is_read_with_its_framing() -> None:
    head = parse_request_head(
        b"POST /v1/charges%2Dx?expand=a HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Length: 11\r\nX-Note:  caf\xe9  \r\nConnection: keep-alive"
    )
    assert (head.method, head.raw_path, head.query, head.path) == (
        "POST", b"/v1/charges%2Dx", b"expand=a", "/v1/charges-x",
    )  # fmt: skip
    assert head.length == 11 and head.keep and not head.expect_continue
    # obs-text is kept for the gateway to judge (it refuses it naming the header)
    assert (b"x-note", b"caf\xe9") in head.headers
    chunked = parse_request_head(
        b"PUT /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nConnection: close"
    )
    assert chunked.length is None and not chunked.keep
    old = parse_request_head(b"GET / HTTP/1.0")
    assert old.length == 0 and not old.keep


@pytest.mark.parametrize(
    ("head", "status", "says"),
    [
        (b"POST /a HTTP/1.1\r\nHost: h\r\n folded", 400, "folded"),
        (b"POST /a HTTP/1.1\r\nHost: h\r\nBad Name: x", 400, "not a token"),
        (b"POST /a HTTP/1.1\r\nHost: h\r\nX-A: a\x01b", 400, "control character"),
        (b"POST /a HTTP/1.1\r\nHost: h\r\nX-A: a\nb", 400, "bare CR or LF"),
        (b"POST /a HTTP/1.1\r\nHost: h\r\nNo colon here", 400, "without a colon"),
        (
            b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked",
            400,
            "beside Content-Length",
        ),
        (b"POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked", 501, "other than"),
        (b"POST /a HTTP/1.0\r\nTransfer-Encoding: chunked", 400, "HTTP/1.0"),
        (b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 4", 400, "twice"),
        (b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: -3", 400, "not a number"),
        (b"POST /a HTTP/1.1\r\nContent-Length: 0", 400, "one Host"),
        (b"POST /a HTTP/1.1\r\nHost: a\r\nHost: b", 400, "one Host"),
        (b"POST /a HTTP/2.0\r\nHost: h", 505, "HTTP/1.1 and HTTP/1.0"),
        (b"POST  /a HTTP/1.1\r\nHost: h", 400, "request line"),
        (b"POST /caf\xe9 HTTP/1.1\r\nHost: h", 400, "request line"),
        (b"GET / HTTP/1.1\r\nHost: h" + b"\r\nX: y" * 101, 431, "header fields"),
    ],
)
def test_a_head_that_is_not_read_unambiguously_is_refused_naming_why(
    head: bytes, status: int, says: str
) -> None:
    with pytest.raises(BadRequest, match=says) as raised:
        parse_request_head(head)
    assert raised.value.status == status


def test_the_same_length_repeated_is_one_length_given_on_as_one_field() -> None:
    head = parse_request_head(
        b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 4, 4\r\nContent-Length: 4"
    )
    assert head.length == 4
    assert [v for n, v in head.headers if n == b"content-length"] == [b"4"]


def test_an_empty_transfer_encoding_beside_a_length_is_refused() -> None:
    with pytest.raises(BadRequest, match="beside Content-Length"):
        parse_request_head(
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: \r\nContent-Length: 5"
        )


def test_a_long_run_of_white_space_before_a_control_character_is_refused() -> None:
    # Linear whatever the line holds: a backtracking pattern took minutes on 60 KB, with
    # every connection of the gateway waiting (the suite's timeout is the bound here).
    head = b"GET / HTTP/1.1\r\nHost: h\r\nX:" + b" " * 60_000 + b"\x01"
    with pytest.raises(BadRequest, match="control character"):
        parse_request_head(head)


def test_the_absolute_form_is_read_as_its_path() -> None:
    head = parse_request_head(b"POST http://127.0.0.1:8787/pay/c?x=1 HTTP/1.1\r\nHost: h")
    assert (head.raw_path, head.query) == (b"/pay/c", b"x=1")
    assert parse_request_head(b"GET http://h HTTP/1.1\r\nHost: h").raw_path == b"/"


CHUNKED = b"4;ext=1\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nX-T: 1\r\n\r\nNEXT"


@pytest.mark.parametrize("step", [1, 2, 7, len(CHUNKED)])
def test_a_chunked_body_is_decoded_however_its_bytes_are_cut(step: int) -> None:
    reader = ChunkedReader()
    out = b""
    for at in range(0, len(CHUNKED), step):
        out += reader.feed(CHUNKED[at : at + step])
        if reader.done:
            leftover = reader.leftover + CHUNKED[at + step :]
            break
    assert reader.done
    assert out == b"Wikipedia in\r\n\r\nchunks."
    assert leftover == b"NEXT"  # the next request's bytes, kept for it


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"zz\r\nab\r\n", "not a chunk size"),
        (b"2\r\nabXY", "not followed by CRLF"),
        (b"1" * 5000, "over 4096 bytes"),
        (b"11111111111111111\r\n", "not a chunk size"),  # 17 hex digits: no such size
        (b" 5\r\nhello\r\n", "not a chunk size"),  # white space before the size
        (b"5 \r\nhello\r\n", "not a chunk size"),  # after it, with no extension
        # a bare LF or a control character in an extension: a proxy ending lines at LF
        # would read other chunks than this server
        (b"5;a\nb\r\nhello\r\n", "not a chunk size"),
        (b"5;\x00\x7f\r\nhello\r\n", "not a chunk size"),
        (b"5\r\nhello\r\n0\r\nnot a field\nGET /x HTTP/1.1\r\n\r\n", "trailer field"),
        (
            b"0\r\n"
            + b"X-T: "
            + b"y" * 1000
            + b"\r\n" * 1
            + (b"X-T: " + b"y" * 1000 + b"\r\n") * 20,
            "trailer fields over",
        ),
    ],
)
def test_a_malformed_chunk_is_refused(raw: bytes, says: str) -> None:
    with pytest.raises(BadRequest, match=says):
        ChunkedReader().feed(raw)


# -- a real gateway ---------------------------------------------------------------------------


class Upstream(RecordingUpstream):
    """``/.../chunked`` answers chunked, with no Content-Length; the rest, how many bytes
    of body came."""

    def answer(self, h: BaseHTTPRequestHandler, last: str, body: bytes) -> None:
        if last == "chunked":
            h.wfile.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            )
            return
        answer = json.dumps({"ok": True, "got": len(body)}).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(answer)))
        h.end_headers()
        h.wfile.write(answer)

    def count(self) -> int:
        with self.lock:
            return len(self.requests)


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    yield up
    up.close()


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    where = tmp_path_factory.mktemp("gateway-server")
    routes = write_routes(
        where / "routes.toml",
        [
            route("pay", "/pay", upstream.url + "/pay", idempotent=True, key_retention="24h",
                  key_header="Idempotency-Key"),
            route("read", "/read", upstream.url + "/read", passthrough=True),
        ],
    )  # fmt: skip
    with Children() as children:
        gw = Gateway(children, routes, db=str(where / "journal.db"), cwd=where)
        gw.start()
        yield gw
        gw.stop()


class Wire:
    """A raw connection to the gateway that reads answers one at a time."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.data = b""

    def send(self, raw: bytes) -> None:
        self.sock.sendall(raw)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.data += chunk
        return bool(chunk)

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        """The next answer: status, headers (lower-cased names), body (de-chunked)."""
        while b"\r\n\r\n" not in self.data:
            assert self._fill(), f"closed before an answer's head: {self.data!r}"
        head, _, self.data = self.data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        status = int(lines[0].split()[1])
        if headers.get("transfer-encoding") == "chunked":
            reader = ChunkedReader()
            body = reader.feed(self._take())
            while not reader.done:
                assert self._fill(), "closed inside a chunked answer"
                body += reader.feed(self._take())
            self.data = reader.leftover
            return status, headers, body
        if status in (100, 204, 304):
            return status, headers, b""
        if "content-length" in headers:
            size = int(headers["content-length"])
            while len(self.data) < size:
                assert self._fill(), "closed inside an answer"
            body, self.data = self.data[:size], self.data[size:]
            return status, headers, body
        while self._fill():  # delimited by the close
            pass
        body, self.data = self.data, b""
        return status, headers, body

    def _take(self) -> bytes:
        taken, self.data = self.data, b""
        return taken

    def closed(self) -> bool:
        """Whether the gateway closed the connection (read to its end)."""
        while self._fill():
            pass
        return True

    def close(self) -> None:
        self.sock.close()


def post(path: str, step: str, body: bytes, *more: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Intentlog-Task: wire",
             f"Intentlog-Step: {step}", "Content-Type: application/json", *more]  # fmt: skip
    if not any(m.lower().startswith("transfer-encoding") for m in more):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _states(gateway: Gateway) -> dict[str, str]:
    out = run_cli(gateway.db, "show", "wire", "--json")
    if out.returncode != 0:
        return {}
    return {op["key"]: op["state"] for op in json.loads(out.stdout)["operations"]}


def test_two_requests_pipelined_on_one_connection_are_answered_in_order(
    gateway: Gateway, upstream: Upstream
) -> None:
    before = list(_states(gateway).values()).count("CONFIRMED")
    wire = Wire(gateway.port)
    try:
        wire.send(post("/pay/c", "pipe-1", b'{"amount":1}') + post("/pay/c", "pipe-2", b'{"n":22}'))
        first, second = wire.answer(), wire.answer()
        assert (first[0], second[0]) == (200, 200)
        assert json.loads(first[2])["got"] == 12 and json.loads(second[2])["got"] == 8
        assert first[1]["intentlog-state"] == second[1]["intentlog-state"] == "CONFIRMED"
        # and the connection is kept for a third
        wire.send(post("/pay/c", "pipe-3", b"{}"))
        assert wire.answer()[0] == 200
    finally:
        wire.close()
    assert list(_states(gateway).values()).count("CONFIRMED") == before + 3
    assert upstream.bodies()[-3:] == [b'{"amount":1}', b'{"n":22}', b"{}"]


def test_a_chunked_request_body_is_journaled_and_forwarded_whole(
    gateway: Gateway, upstream: Upstream
) -> None:
    body = b'{"amount":1500,"currency":"usd"}'
    chunked = (
        b"7\r\n" + body[:7] + b"\r\n" + b"%x\r\n" % (len(body) - 7) + body[7:] + b"\r\n0\r\n\r\n"
    )
    wire = Wire(gateway.port)
    try:
        wire.send(post("/pay/c", "chunked-1", b"", "Transfer-Encoding: chunked"))
        for at in range(0, len(chunked), 5):  # in pieces, as a slow client sends them
            wire.send(chunked[at : at + 5])
        status, _, answer = wire.answer()
    finally:
        wire.close()
    assert status == 200, answer
    assert json.loads(answer)["got"] == len(body)
    assert body in upstream.bodies()


def test_expect_100_continue_is_answered_before_the_body_is_sent(
    gateway: Gateway, upstream: Upstream
) -> None:
    body = b'{"amount":42}'
    head, _, _ = post("/pay/c", "continue-1", body, "Expect: 100-continue").partition(b"\r\n\r\n")
    wire = Wire(gateway.port)
    try:
        wire.send(head + b"\r\n\r\n")
        interim = wire.answer()
        assert interim[0] == 100
        wire.send(body)
        status, _, answer = wire.answer()
    finally:
        wire.close()
    assert status == 200 and json.loads(answer)["got"] == len(body)


def test_a_passed_through_answer_without_a_length_is_chunked_to_the_client(
    gateway: Gateway,
) -> None:
    wire = Wire(gateway.port)
    try:
        wire.send(b"GET /read/chunked HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        status, headers, body = wire.answer()
        assert (status, body) == (200, b"hello world")
        assert headers["transfer-encoding"] == "chunked"
        wire.send(b"GET /read/chunked HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        status, headers, body = wire.answer()  # HTTP/1.0: delimited by the close
        assert (status, body) == (200, b"hello world")
        assert "transfer-encoding" not in headers and headers["connection"] == "close"
    finally:
        wire.close()


@pytest.mark.parametrize(
    ("raw", "status", "says"),
    [
        (b"POST /pay/c HTTP/1.1\nHost: 127.0.0.1\nContent-Length: 2\n\n{}", 400, "CRLF"),
        (post("/pay/c", "bad-1", b"{}", "X-A: a\x7fb"), 400, "control character"),
        (
            post("/pay/c", "bad-2", b"{}", "Content-Length: 2", "Transfer-Encoding: chunked"),
            400,
            "beside",
        ),
        (
            post("/pay/c", "bad-3", b"", "Transfer-Encoding: chunked") + b"zz\r\n{}\r\n0\r\n\r\n",
            400,
            "chunk size",
        ),
        (post("/pay/c", "bad-4", b"{}", "Content-Length: 3"), 400, "twice"),
        (post("/pay/c", "bad-5", b"{}", "Transfer-Encoding: br"), 501, "other than chunked"),
        (post("/pay/c", "bad-6", b"{}", "X-Big: " + "x" * (70 << 10)), 431, "over 65536"),
        (
            b"POST /pay/c HTTP/1.1\r\nIntentlog-Task: wire\r\nIntentlog-Step: bad-7\r\n"
            b"Content-Length: 2\r\n\r\n{}",
            400,
            "Host",
        ),
    ],
)
def test_a_request_that_cannot_be_read_is_refused_and_nothing_is_journaled_or_sent(
    gateway: Gateway, upstream: Upstream, raw: bytes, status: int, says: str
) -> None:
    before_sent, before_journal = upstream.count(), _states(gateway)
    wire = Wire(gateway.port)
    try:
        wire.send(raw)
        got, headers, body = wire.answer()
        assert wire.closed()
    finally:
        wire.close()
    assert got == status
    assert headers["content-type"] == "application/problem+json"
    problem: dict[str, Any] = json.loads(body)
    assert says in problem["detail"] and "nothing was forwarded" in problem["detail"]
    assert upstream.count() == before_sent
    assert _states(gateway) == before_journal


def test_an_idle_connection_is_closed_and_the_gateway_serves_on(gateway: Gateway) -> None:
    wire = Wire(gateway.port)
    try:
        wire.send(b"GET /read/x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert wire.answer()[0] == 200
        assert wire.closed()  # after its keep-alive (5 s) with nothing asked
    finally:
        wire.close()
    fresh = Wire(gateway.port)
    try:
        fresh.send(b"GET /read/y HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        status, headers, _ = fresh.answer()
        assert status == 200 and headers["connection"] == "close"
        assert fresh.closed()
    finally:
        fresh.close()


def test_a_path_routed_is_the_path_forwarded(gateway: Gateway, upstream: Upstream) -> None:
    # "/p%61y/c" decodes to "/pay/c", but its rest after "/pay" as sent would be "/y/c"
    before = upstream.count()
    wire = Wire(gateway.port)
    try:
        wire.send(post("/p%61y/c", "encoded-1", b"{}", "Connection: close"))
        status, _, body = wire.answer()
    finally:
        wire.close()
    assert status == 404, body
    assert upstream.count() == before


def test_a_client_that_half_closes_after_its_request_gets_its_answer(
    gateway: Gateway, upstream: Upstream
) -> None:
    wire = Wire(gateway.port)
    try:
        wire.send(post("/pay/c", "half-1", b'{"amount":1}'))
        wire.sock.shutdown(socket.SHUT_WR)  # sent: only reads from now on
        status, headers, body = wire.answer()
        assert wire.closed()
    finally:
        wire.close()
    assert status == 200 and headers["intentlog-state"] == "CONFIRMED", body


def test_empty_lines_before_a_request_line_are_passed_over(gateway: Gateway) -> None:
    wire = Wire(gateway.port)
    try:
        wire.send(b"\r\n\r\nGET /read/x HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert wire.answer()[0] == 200
    finally:
        wire.close()


# -- the server alone, in this process, with an application of the test's own -----------------

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def serving(app: App, client: Callable[[int, _server.Server], Awaitable[Any]], **kw: Any) -> Any:
    """Run ``_server.Server(app)`` on 127.0.0.1, port 0, and ``client(port, server)``."""

    async def main() -> Any:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        server = _server.Server(app, **kw)
        stop = asyncio.Event()
        served = asyncio.create_task(server.serve(sock, stop, grace=5))
        try:
            return await asyncio.wait_for(client(sock.getsockname()[1], server), 60)
        finally:
            stop.set()
            await served

    return asyncio.run(main())


async def until(what: str, check: Callable[[], bool]) -> None:
    """Turn the event loop until ``check()`` holds (observed, not timed; bounded)."""
    for _ in range(20_000):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


async def answer_with(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": body})


def test_answers_to_pipelined_requests_wait_for_a_client_that_does_not_read() -> None:
    big = b"x" * 65536

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await answer_with(send, 200, big)

    async def client(port: int, server: _server.Server) -> None:
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n" * 20_000)  # never reads an answer
        await until("the server connected", lambda: len(server.connections) == 1)
        (conn,) = server.connections
        await until("writing paused", lambda: conn.writable is not None)
        assert conn.transport is not None
        # the socket's buffers and one answer at most: not 20,000 answers
        assert conn.transport.get_write_buffer_size() < 4 << 20
        writer.close()

    serving(app, client)


def test_receive_after_the_answer_is_a_disconnect() -> None:
    got: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        got.append(await receive())
        await answer_with(send, 200, b"ok")
        got.append(await receive())

    async def client(port: int, server: _server.Server) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        await until("the application ended", lambda: len(got) == 2)
        writer.close()

    serving(app, client)
    assert got == [
        {"type": "http.request", "body": b"", "more_body": False},
        {"type": "http.disconnect"},
    ]


def test_a_body_that_stops_coming_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_server, "BODY_TIMEOUT", 0.3)
    got: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:
            got.append(await receive())
            if got[-1]["type"] == "http.disconnect":
                return await answer_with(send, 400, b"incomplete")

    async def client(port: int, server: _server.Server) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n{")
        answer = await reader.read()  # to the close
        writer.close()
        return answer

    answer = serving(app, client)
    assert answer.startswith(b"HTTP/1.1 400 ") and b"connection: close" in answer
    assert got[0]["body"] == b"{" and got[-1] == {"type": "http.disconnect"}


def test_a_client_that_reads_nothing_of_its_answer_is_cut_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_server, "WRITE_TIMEOUT", 0.3)
    ended: list[bool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(1024):  # 64 MiB, streamed
            await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        ended.append(True)

    async def client(port: int, server: _server.Server) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.setblocking(False)
        _reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")  # then never reads
        await until("the application ended", lambda: bool(ended))
        await until("the connection closed", lambda: not server.connections)
        writer.close()

    serving(app, client)


def test_an_answer_given_before_the_body_is_read_survives_the_close() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await answer_with(send, 413, b"too large")  # the body is never read

    async def client(port: int, server: _server.Server) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 4194304\r\n\r\n")
        writer.write(b"x" * (1 << 20))  # still sending as the answer comes
        answer = await reader.read()  # a reset would lose it: the server lingers instead
        writer.close()
        return answer

    answer = serving(app, client)
    assert answer.startswith(b"HTTP/1.1 413 ") and answer.endswith(b"too large")


def test_connections_over_the_limit_are_closed_at_once() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await answer_with(send, 200, b"ok")

    async def client(port: int, server: _server.Server) -> bytes:
        kept = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        await until("two connections", lambda: len(server.connections) == 2)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        refused = await reader.read()
        for _, w in [*kept, (reader, writer)]:
            w.close()
        return refused

    assert serving(app, client, max_connections=2) == b""
