"""The gateway's own HTTP/1.1 server: what it reads (and refuses to read), keep-alive,
pipelining, chunked bodies both ways, ``Expect: 100-continue``, HTTP/1.0, idle connections.

The parser is checked directly, a chunked body fed byte by byte as well as whole; the rest
runs a real ``intentlog gateway`` process in front of a recording upstream on 127.0.0.1,
spoken to over raw sockets so that the bytes are exactly the test's."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from tests.gateway_support import Children, Gateway, route, run_cli, write_routes

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


def test_the_same_length_repeated_is_one_length() -> None:
    head = parse_request_head(b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 4, 4")
    assert head.length == 4


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
    ],
)
def test_a_malformed_chunk_is_refused(raw: bytes, says: str) -> None:
    with pytest.raises(BadRequest, match=says):
        ChunkedReader().feed(raw)


# -- a real gateway ---------------------------------------------------------------------------


class Upstream:
    """Records every request; ``/.../chunked`` answers chunked, with no Content-Length."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else b""
                with upstream.lock:
                    upstream.requests.append(
                        (self.command, self.path, dict(self.headers.items()), body)
                    )
                if self.path.endswith("/chunked"):
                    self.wfile.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
                    )
                    return
                answer = json.dumps({"ok": True, "got": len(body)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [r[3] for r in self.requests]

    def count(self) -> int:
        with self.lock:
            return len(self.requests)


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    yield up
    up.server.shutdown()
    up.server.server_close()


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
