"""The gateway's ASGI application: checks, routing, pass-through and journaled requests.

Every check comes before anything is journaled or forwarded, and a refused request changes
nothing: the gateway token, the route, the method, the body's size, the identity headers.
GET, HEAD and OPTIONS pass through unjournaled (a read answered from a journal would be
stale, and the gateway never sends a read twice itself), as do the unsafe requests of a
``passthrough`` route. ``Intentlog-*`` headers are the gateway's and are never forwarded;
every other request header is (credentials included), and never journaled.
"""

from __future__ import annotations

import functools
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from intentlog._hygiene import scrub_text
from intentlog._validate import is_loopback
from intentlog.gateway._answers import Reply, problem
from intentlog.gateway._calls import Calls
from intentlog.gateway._forward import Incoming

if TYPE_CHECKING:
    from intentlog.gateway._relay import Relay, RelayResponse
    from intentlog.gateway._routes import Route, RouteFile

__all__ = ["TOKEN_HEADER", "GatewayApp"]

log = logging.getLogger("intentlog.gateway")

TOKEN_HEADER = "intentlog-token"  # noqa: S105 - a header name, not a secret
SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: Hop-by-hop headers (RFC 9110 section 7.6.1) and those the gateway sets itself.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
#: Answer headers not passed back: the body is given decoded and with its own length.
_ANSWER_DROP = _HOP | {"content-encoding", "date"}  # the server writes its own date
#: Request headers not forwarded besides: the gateway's client asks for the encodings it
#: decodes itself, and gives the answer back decoded.
_REQUEST_DROP = _HOP | {"accept-encoding"}
#: Statuses whose answer has no body and no Content-Length (RFC 9110 sections 15.3.5, 15.4.5).
_NO_BODY = frozenset({204, 304})
#: What ``_body`` gives for a body cut off (a disconnect, fewer bytes than declared).
_INCOMPLETE = object()

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class GatewayApp:
    """See the module's docstring. ``token``: what ``Intentlog-Token`` must carry (None:
    no token asked, loopback only)."""

    def __init__(
        self,
        routes: RouteFile,
        calls: Calls,
        client: Relay,
        *,
        token: str | None,
        max_body: int,
        passthrough_timeout: float = 60.0,
    ) -> None:
        self.routes = routes
        self.calls = calls
        self.client = client
        self.token = token
        self.max_body = max_body
        self.passthrough_timeout = passthrough_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        head = scope["method"].upper() == "HEAD"
        reply = await self._answer(scope, receive)
        if isinstance(reply, Reply):
            await _send(send, reply, head=head)
        else:
            await _stream(send, reply, head=head)

    async def _answer(self, scope: Scope, receive: Receive) -> Reply | RelayResponse:
        method: str = scope["method"].upper()
        path: str = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        query: str = scope.get("query_string", b"").decode("latin-1")
        raw = [(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in scope["headers"]]
        headers = dict(raw)
        if self.token is None and not _loopback_host(headers.get("host")):
            shown = scrub_text(headers.get("host", ""), limit=100)
            return problem(
                421,
                "not-loopback-host",
                f"this gateway has no token and answers only requests to a loopback name "
                f"(localhost, 127.0.0.1, [::1]), not Host {shown!r}; nothing was forwarded",
            )
        if self.token is not None and not hmac.compare_digest(
            headers.get(TOKEN_HEADER, "").encode(), self.token.encode()
        ):
            return problem(
                401,
                "unauthorized",
                "this gateway needs its token in the Intentlog-Token header; nothing was forwarded",
            )
        if _dot_segments(path):
            shown = scrub_text(path, limit=200)
            return problem(
                400,
                "bad-path",
                f"the path {shown!r} has a '.' or '..' segment or an encoded '/' (%2F): "
                "the upstream would not get the path that was routed; nothing was forwarded",
            )
        # Routed by the path as sent, the one whose rest is forwarded: "/p%61y/x" is not
        # under "/pay" (decoded, it would be routed there and forwarded as "/y/x").
        route = self.routes.match(path)
        if route is None:
            shown = scrub_text(scope["path"], limit=200)
            return problem(
                404, "unknown-route", f"no route's prefix matches {shown!r}; nothing was forwarded"
            )
        if method not in SAFE and method not in UNSAFE:
            return problem(
                405,
                "method",
                f"method {method} is not forwarded (only GET, HEAD, "
                "OPTIONS, POST, PUT, PATCH and DELETE)",
            )
        forwarded = tuple(
            (n, v) for n, v in raw if n not in _REQUEST_DROP and not n.startswith("intentlog-")
        )
        for name, value in forwarded:
            if not value.isascii():
                return problem(
                    400,
                    "bad-header",
                    f"the header {name} has a value that is not ASCII (send it encoded, as "
                    "RFC 8187 or percent-encoding does): it cannot be forwarded; nothing was "
                    "forwarded or journaled",
                    header=name,
                )
        body = await _body(receive, headers, self.max_body)
        if body is None:
            return problem(
                413,
                "too-large",
                f"the request body is over {self.max_body} bytes "
                "(--max-body); nothing was forwarded or journaled",
            )
        if not isinstance(body, bytes):
            return problem(
                400,
                "incomplete-body",
                "the request body ended before its end (the client disconnected, or sent "
                "other than its Content-Length); nothing was forwarded or journaled",
            )
        incoming = Incoming(method, path, query, forwarded, body)
        if method in SAFE or route.passthrough:
            return await self._pass(route.target(path, query), incoming, _timeout(route))
        return await self.calls.handle(route, incoming, headers)

    async def _pass(
        self, url: str, incoming: Incoming, timeout: float | None
    ) -> Reply | RelayResponse:
        """Forward a request unjournaled: its answer, to be streamed back as it comes."""
        import httpx

        try:
            request = self.client.build_request(
                incoming.method,
                url,
                content=incoming.body or None,
                headers=list(incoming.headers),
                timeout=self.passthrough_timeout if timeout is None else timeout,
            )
            return await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            return problem(502, "upstream", f"the upstream did not answer: {type(exc).__name__}")


def _timeout(route: Route) -> float | None:
    """The route's own timeout (its ``timeout`` field, else its profile's), if it has one."""
    stated = route.options.get("timeout")
    if stated is None and route.service is not None:
        stated = route.service.timeout
    return None if stated is None else float(stated)


@functools.lru_cache(maxsize=256)  # a gateway is asked by a few names, on every request
def _loopback_host(host: str | None) -> bool:
    """Whether a Host header names a loopback name or address (any port)."""
    if not host:
        return False
    host = host.strip().lower()
    if host.startswith("["):
        name = host[1 : host.find("]")] if "]" in host else ""
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return is_loopback(name.rstrip("."))


def _dot_segments(path: str) -> bool:
    """Whether a raw path has a ``.`` or ``..`` segment (plain or percent-encoded) or an
    encoded slash: the URL built for the upstream would not keep the path that was routed."""
    lowered = path.split("?", 1)[0].lower()
    if "%2f" in lowered:
        return True
    return any(seg.replace("%2e", ".") in (".", "..") for seg in lowered.split("/"))


async def _body(receive: Receive, headers: dict[str, str], limit: int) -> bytes | object | None:
    """The request body; None once it is over ``limit`` bytes (read no further);
    ``_INCOMPLETE`` if the client disconnected before its end, or sent other than the
    Content-Length it declared."""
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return _INCOMPLETE
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    if declared and (not declared.isdigit() or int(declared) != size):
        return _INCOMPLETE
    return b"".join(chunks)


def _encoded(value: str) -> bytes:
    """A header value as bytes: Latin-1 as HTTP/1.1 has it, else its UTF-8 bytes (as the
    upstream most likely sent them)."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8", "replace")


def _framed(given: list[tuple[str, str]], extra: dict[str, str]) -> list[tuple[bytes, bytes]]:
    own = {k.lower() for k in extra}
    headers = [
        (n.lower().encode("latin-1"), _encoded(v))
        for n, v in given
        if n.lower() not in _ANSWER_DROP and n.lower() not in own
    ]
    headers += [(n.lower().encode("latin-1"), _encoded(v)) for n, v in extra.items()]
    return headers


async def _send(send: Send, reply: Reply, *, head: bool) -> None:
    headers = _framed(reply.headers, reply.extra)
    if reply.status not in _NO_BODY:
        length = str(len(reply.body))
        if head:  # the length a GET would have had (RFC 9110 section 8.6)
            length = _header(reply.headers, "content-length") or length
        headers.append((b"content-length", length.encode()))
    body = b"" if head or reply.status in _NO_BODY else reply.body
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _stream(send: Send, response: RelayResponse, *, head: bool) -> None:
    """Give a passed-through answer back as it comes (memory bounded by a chunk), and close
    the upstream's answer whatever happens."""
    try:
        status = response.status_code
        given = list(response.headers.multi_items())
        headers = _framed(given, {"Intentlog-State": "PASSED"})
        length = _header(given, "content-length")
        identity = _header(given, "content-encoding") in (None, "", "identity")
        if status not in _NO_BODY and length is not None and (head or identity):
            headers.append((b"content-length", length.encode("latin-1")))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        if not head and status not in _NO_BODY:
            async for chunk in response.aiter_bytes():
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        await response.aclose()


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    for n, v in headers:
        if n.lower() == name:
            return v.strip()
    return None


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
