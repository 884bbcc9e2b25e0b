"""HTTP/1.1 on the wire, for the gateway's upstream client: a request's bytes, an answer's
head, and how its body is framed (RFC 9112).

Strict where being lax could attribute the wrong bytes to a request: an answer head that is
not HTTP/1.x, a header line folded or without a colon, a Content-Length that is not one
number, a chunk size that is not hex; each is a :class:`WireError`, and the connection it
came on is never reused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Framing", "Head", "WireError", "framing", "parse_head", "request_bytes"]

#: A header name: an RFC 9110 token.
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: What a header value must not hold (RFC 9110 section 5.5: no CR, LF or NUL).
_BAD_VALUE = re.compile(r"[\r\n\x00]")
_STATUS = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: [^\r\n]*)?")
_METHOD = re.compile(r"[A-Z]+")


class WireError(Exception):
    """Bytes that are not HTTP/1.1 as RFC 9112 frames it (a request this side could not
    write, or an answer it could not read)."""


@dataclass(frozen=True, slots=True)
class Head:
    """An answer's status line and header fields, as they came."""

    status: int
    minor: int  # HTTP/1.<minor>
    headers: list[tuple[str, str]]

    def values(self, name: str) -> list[str]:
        return [v for n, v in self.headers if n.lower() == name]


@dataclass(frozen=True, slots=True)
class Framing:
    """How an answer's body is delimited: ``length`` bytes, chunked, or up to the close
    (``length`` None, not chunked); ``keep``: whether the connection can take another
    request once the body is read."""

    length: int | None
    chunked: bool
    keep: bool


def request_bytes(method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    """The request as it is written. A method, target, name or value that would change
    the request's framing (a CR or LF in it, a name that is not a token) is refused."""
    if not _METHOD.fullmatch(method) or not target or any(c in target for c in " \r\n\x00"):
        raise WireError(f"cannot write a request line for {method!r} {target!r}")
    lines = [f"{method} {target} HTTP/1.1\r\n".encode("latin-1")]
    for name, value in headers:
        raw = name.encode("latin-1", "replace")
        if not _TOKEN.fullmatch(raw) or _BAD_VALUE.search(value):
            raise WireError(f"the header {name!r} cannot be written (a bad name or value)")
        lines.append(raw + b": " + value.encode("latin-1", "replace") + b"\r\n")
    lines.append(b"\r\n")
    lines.append(body)
    return b"".join(lines)


def parse_head(raw: bytes) -> Head:
    """An answer's head (its status line and fields, up to and with the blank line). A line
    ends with CRLF, or with a bare LF, which RFC 9112 section 2.2 lets a recipient take for
    one (h11 and httpx do)."""
    lines = [line[:-1] if line.endswith(b"\r") else line for line in raw.split(b"\n")]
    match = _STATUS.fullmatch(lines[0])
    if match is None:
        raise WireError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        if line[:1] in (b" ", b"\t"):
            raise WireError("a folded header line (obsolete, RFC 9112 section 5.2)")
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise WireError(f"not a header line: {line[:80]!r}")
        if b"\n" in value or b"\r" in value or b"\x00" in value:
            # A bare LF would be a line break to a reader that splits on it: a value must
            # not carry one further (RFC 9110 section 5.5: reject, or replace it).
            raise WireError(f"a header value with a CR, LF or NUL in it: {name[:40]!r}")
        headers.append((name.decode("latin-1"), value.strip(b" \t").decode("latin-1")))
    return Head(int(match.group(2)), int(match.group(1)), headers)


def framing(head: Head, method: str) -> Framing:
    """The body's framing (RFC 9112 section 6.3), in its order of precedence."""
    connection = {t.strip().lower() for v in head.values("connection") for t in v.split(",")}
    keep = head.minor == 1 and "close" not in connection
    if method == "HEAD" or head.status in (204, 304) or 100 <= head.status < 200:
        return Framing(0, False, keep)
    codings = [t.strip().lower() for v in head.values("transfer-encoding") for t in v.split(",")]
    if codings:
        if codings != ["chunked"]:
            # Another coding (gzip, say) would be given back still coded as if it were the
            # body, and recorded so: refused, as httpx refuses it.
            raise WireError(f"a transfer coding other than chunked: {codings!r}")
        # Transfer-Encoding beside a Content-Length: the chunks frame it, and the connection
        # is not reused (RFC 9112 section 6.1: a sign of response splitting).
        return Framing(None, True, keep and not head.values("content-length"))
    # One length, however often repeated (RFC 9110 section 8.6: "11, 11" is 11).
    lengths = {t.strip() for v in head.values("content-length") for t in v.split(",")}
    if lengths:
        (only,) = lengths if len(lengths) == 1 else (None,)
        if only is None or not only.isdigit() or not only.isascii():
            raise WireError(f"a Content-Length that is not one number: {sorted(lengths)!r}")
        return Framing(int(only), False, keep)
    return Framing(None, False, False)


def chunk_size(line: bytes) -> int:
    """A chunk's size from its size line (extensions after ``;`` are passed over)."""
    size = line.split(b";", 1)[0].strip(b" \t\r\n")
    if not size or len(size) > 16 or any(c not in b"0123456789abcdefABCDEF" for c in size):
        raise WireError(f"not a chunk size: {line[:40]!r}")
    return int(size, 16)
