"""The gateway's ASGI application: checks, routing, pass-through and journaled requests.

Every check comes before anything is journaled or forwarded, and a refused request changes
nothing: the gateway token, the route, the method, the body's size, the identity headers.
GET, HEAD and OPTIONS pass through unjournaled (a read answered from a journal would be
stale, and the gateway never sends a read twice itself), as do the unsafe requests of a
``passthrough`` route. ``Intentlog-*`` headers are the gateway's and are never forwarded;
every other request header is (credentials included), and never journaled.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from intentlog._hygiene import scrub_text
from intentlog.gateway._answers import Reply, problem
from intentlog.gateway._calls import Calls
from intentlog.gateway._forward import Incoming

if TYPE_CHECKING:
    import httpx

    from intentlog.gateway._routes import RouteFile

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
_ANSWER_DROP = _HOP | {"content-encoding", "date"}  # uvicorn writes its own date

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
        client: httpx.AsyncClient,
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
        reply = await self._answer(scope, receive)
        await _send(send, reply, head=scope["method"] == "HEAD")

    async def _answer(self, scope: Scope, receive: Receive) -> Reply:
        method: str = scope["method"].upper()
        path: str = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        query: str = scope.get("query_string", b"").decode("latin-1")
        raw = [(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in scope["headers"]]
        headers = dict(raw)
        if self.token is not None and not hmac.compare_digest(
            headers.get(TOKEN_HEADER, "").encode(), self.token.encode()
        ):
            return problem(
                401,
                "unauthorized",
                "this gateway needs its token in the Intentlog-Token header; nothing was forwarded",
            )
        route = self.routes.match(scope["path"])
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
        body = await _body(receive, headers, self.max_body)
        if body is None:
            return problem(
                413,
                "too-large",
                f"the request body is over {self.max_body} bytes "
                "(--max-body); nothing was forwarded or journaled",
            )
        forwarded = tuple(
            (n, v) for n, v in raw if n not in _HOP and not n.startswith("intentlog-")
        )
        incoming = Incoming(method, path, query, forwarded, body)
        if method in SAFE or route.passthrough:
            return await self._pass(route.target(path, query), incoming)
        return await self.calls.handle(route, incoming, headers)

    async def _pass(self, url: str, incoming: Incoming) -> Reply:
        """Forward a request unjournaled, and give its answer back as it came."""
        import httpx

        try:
            response = await self.client.request(
                incoming.method,
                url,
                content=incoming.body or None,
                headers=list(incoming.headers),
                timeout=self.passthrough_timeout,
            )
        except httpx.HTTPError as exc:
            return problem(502, "upstream", f"the upstream did not answer: {type(exc).__name__}")
        return Reply(
            response.status_code,
            list(response.headers.multi_items()),
            response.content,
            {"Intentlog-State": "PASSED"},
        )


async def _body(receive: Receive, headers: dict[str, str], limit: int) -> bytes | None:
    """The request body, or None once it is over ``limit`` bytes (read no further)."""
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _send(send: Send, reply: Reply, *, head: bool) -> None:
    headers = [
        (n.lower().encode("latin-1"), v.encode("latin-1"))
        for n, v in reply.headers
        if n.lower() not in _ANSWER_DROP and n.lower() not in {k.lower() for k in reply.extra}
    ]
    headers += [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in reply.extra.items()]
    headers.append((b"content-length", str(len(reply.body)).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else reply.body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
