"""HTTP/1.1 requests as the gateway's server reads them (RFC 9112): a head, its framing,
and a chunked body decoded as it comes.

Strict wherever being lax would let two readers (this one and the upstream's, or a proxy in
front) see different requests in the same bytes: a line not ended by CRLF, a folded header,
a name that is not a token, a value with a control character, Content-Length beside
Transfer-Encoding, a transfer coding other than chunked, two different lengths, a chunk size
that is not hex. Each is a :class:`BadRequest` naming what was wrong; the connection it came
on is answered and closed, and the request reaches nothing behind the server.

A value's bytes above 0x7F (``obs-text``) are kept, decoded as Latin-1: whether such a value
may be forwarded is the gateway's to say, with an answer that names the header.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

__all__ = ["BadRequest", "ChunkedReader", "RequestHead", "parse_request_head"]

#: The request line: a method token, a target of visible ASCII, HTTP/1.0 or HTTP/1.1.
_REQUEST_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) ([\x21-\x7e]+) HTTP/1\.([01])")
_ANY_VERSION = re.compile(rb"[!-~]+ [!-~]+ HTTP/[0-9]\.[0-9]")
#: A field line (RFC 9112 section 5): a token, a colon, a value of visible characters,
#: spaces, tabs and obs-text (its white space around stripped after). One character class
#: for the value: no backtracking, linear in the line's length whatever it holds.
_FIELD = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):([^\x00-\x08\x0a-\x1f\x7f]*)")
_TCHAR = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]"
#: A chunk's size line (RFC 9112 section 7.1.1): hex digits, then extensions, each a token
#: with an optional token or quoted value, white space only around ";" and "=".
_CHUNK_SIZE = re.compile(
    rb"([0-9A-Fa-f]{1,16})(?:[ \t]*;[ \t]*"
    + _TCHAR
    + rb"+(?:[ \t]*=[ \t]*(?:"
    + _TCHAR
    + rb'+|"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t -~\x80-\xff])*"))?)*'
)
MAX_HEADERS = 100
_OWN = frozenset({b"content-length", b"transfer-encoding", b"connection", b"host", b"expect"})
MAX_CHUNK_LINE = 4096  # a chunk's size line, extensions included
MAX_TRAILERS = 16 << 10


class BadRequest(Exception):
    """Bytes that are not an HTTP/1.1 request this server takes: ``status`` is the answer
    (400, 431, 501 or 505), the message names what was wrong."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class RequestHead:
    """A request's line and fields, checked. ``length``: the body's length (0 for none),
    or None when it is chunked; ``keep``: whether the connection may take another request
    after this one's answer (HTTP/1.1 without ``Connection: close``)."""

    method: str
    raw_path: bytes
    query: bytes
    path: str
    minor: int
    headers: list[tuple[bytes, bytes]]
    length: int | None
    keep: bool
    expect_continue: bool


def parse_request_head(head: bytes) -> RequestHead:
    """The request whose head is ``head`` (up to, not with, the blank line's CRLF CRLF)."""
    lines = head.split(b"\r\n")
    first = lines[0]
    if first.startswith(b"http://", first.find(b" ") + 1):
        # The absolute form (RFC 9112 section 3.2.2), which a server must take: its path.
        method, _, rest = first.partition(b" http://")
        slash = rest.find(b"/")
        space = rest.find(b" ")
        first = method + b" " + (rest[slash:] if -1 < slash < space else b"/" + rest[space:])
    match = _REQUEST_LINE.fullmatch(first)
    if match is None:
        if _ANY_VERSION.fullmatch(first):
            raise BadRequest(505, "only HTTP/1.1 and HTTP/1.0 are served")
        raise BadRequest(400, f"not an HTTP/1.1 request line: {_shown(first)}")
    if len(lines) - 1 > MAX_HEADERS:
        raise BadRequest(431, f"more than {MAX_HEADERS} header fields")
    headers: list[tuple[bytes, bytes]] = []
    # The fields this server reads itself, gathered in the one pass over the lines.
    own: dict[bytes, list[bytes]] = {}
    for line in lines[1:]:
        field = _FIELD.fullmatch(line)
        if field is None:
            raise BadRequest(400, _why_not_a_field(line))
        name, value = field.group(1).lower(), field.group(2).strip(b" \t")
        headers.append((name, value))
        if name in _OWN:
            own.setdefault(name, []).append(value)
    minor = int(match.group(3))
    target = match.group(2)
    raw_path, _, query = target.partition(b"?")
    length, chunked = _framing(own, minor)
    given = own.get(b"content-length", ())
    if not chunked and (len(given) > 1 or (given and b"," in given[0])):
        # One length however often repeated (RFC 9110 section 8.6): given on as one field.
        headers = [(n, v) for n, v in headers if n != b"content-length"]
        headers.append((b"content-length", b"%d" % length))
    hosts = len(own.get(b"host", ()))
    if minor == 1 and hosts != 1:
        # RFC 9112 section 3.2: an HTTP/1.1 request has exactly one Host.
        raise BadRequest(400, f"an HTTP/1.1 request needs one Host header, not {hosts}")
    return RequestHead(
        method=match.group(1).decode("ascii"),
        raw_path=raw_path,
        query=query,
        path=urllib.parse.unquote(raw_path.decode("ascii")),
        minor=minor,
        headers=headers,
        length=None if chunked else length,
        keep=minor == 1 and b"close" not in _tokens(own, b"connection"),
        expect_continue=minor == 1 and b"100-continue" in _tokens(own, b"expect"),
    )


def _framing(own: dict[bytes, list[bytes]], minor: int) -> tuple[int, bool]:
    """(length, chunked) of the body (RFC 9112 section 6.3)."""
    lengths = {t.strip() for v in own.get(b"content-length", ()) for t in v.split(b",")}
    if b"transfer-encoding" in own:
        codings = _tokens(own, b"transfer-encoding")
        if lengths:
            # Both: the framing two readers could disagree on (RFC 9112 section 6.1).
            raise BadRequest(400, "Transfer-Encoding beside Content-Length")
        if minor == 0:
            raise BadRequest(400, "Transfer-Encoding in an HTTP/1.0 request")
        if codings != [b"chunked"]:
            shown = b", ".join(codings).decode("latin-1")
            raise BadRequest(501, f"a transfer coding other than chunked: {shown!r}")
        return 0, True
    if not lengths:
        return 0, False
    if len(lengths) != 1:
        raise BadRequest(400, "Content-Length given twice with different values")
    (only,) = lengths
    if not only.isdigit() or len(only) > 18:
        raise BadRequest(400, f"Content-Length is not a number: {_shown(only)}")
    return int(only), False


def _tokens(own: dict[bytes, list[bytes]], name: bytes) -> list[bytes]:
    return [t.strip().lower() for v in own.get(name, ()) for t in v.split(b",") if t.strip()]


def _why_not_a_field(line: bytes) -> str:
    if line[:1] in (b" ", b"\t"):
        return "a folded header line (obsolete, RFC 9112 section 5.2)"
    name, colon, _ = line.partition(b":")
    if not colon:
        return f"a header line without a colon: {_shown(line)}"
    if not name or name != name.strip() or not re.fullmatch(rb"[!-~]+", name):
        return f"a header name that is not a token: {_shown(name)}"
    if b"\n" in line or b"\r" in line:
        return f"a bare CR or LF in the header {_shown(name)} (lines end with CRLF)"
    return f"a control character in the value of the header {_shown(name)}"


def _shown(raw: bytes) -> str:
    return repr(raw[:80].decode("latin-1"))


class ChunkedReader:
    """A chunked body decoded as its bytes come (RFC 9112 section 7.1): ``feed`` gives the
    data decoded so far, ``done`` is set once the last chunk and the trailers came, and
    ``leftover`` holds what came after them (the next request on the connection).
    Trailer fields are read and dropped."""

    def __init__(self) -> None:
        self._raw = bytearray()
        self._left = 0  # data bytes of the current chunk not yet read
        self._stage = "size"  # size | data | crlf | trailers
        self._trailers = 0  # bytes of trailer fields so far
        self.done = False
        self.leftover = b""

    def feed(self, data: bytes) -> bytes:
        self._raw += data
        out = bytearray()
        while not self.done:
            if self._stage == "data":
                taken = self._raw[: self._left]
                out += taken
                del self._raw[: len(taken)]
                self._left -= len(taken)
                if self._left:
                    break
                self._stage = "crlf"
            elif self._stage == "crlf":
                if len(self._raw) < 2:
                    break
                if self._raw[:2] != b"\r\n":
                    raise BadRequest(400, "a chunk's data is not followed by CRLF")
                del self._raw[:2]
                self._stage = "size"
            elif not self._line():
                break
        if self.done:
            self.leftover = bytes(self._raw)
            self._raw.clear()
        return bytes(out)

    def _line(self) -> bool:
        """Read a size or trailer line, if a whole one came; whether one did."""
        end = self._raw.find(b"\r\n")
        if end < 0:
            limit = MAX_CHUNK_LINE if self._stage == "size" else MAX_TRAILERS
            if len(self._raw) > limit:
                raise BadRequest(400, f"a chunk size or trailer line over {limit} bytes")
            return False
        line = bytes(self._raw[:end])
        del self._raw[: end + 2]
        if self._stage == "trailers":
            self._trailers += len(line) + 2
            if self._trailers > MAX_TRAILERS:
                raise BadRequest(431, f"trailer fields over {MAX_TRAILERS} bytes")
            if line and _FIELD.fullmatch(line) is None:
                raise BadRequest(400, f"a trailer field: {_why_not_a_field(line)}")
            self.done = not line
            return True
        size = _CHUNK_SIZE.fullmatch(line)
        if size is None:
            raise BadRequest(400, f"not a chunk size: {_shown(line)}")
        self._left = int(size.group(1), 16)
        self._stage = "data" if self._left else "trailers"
        return True
